"""Compile Triton kernels for gfx950 and sm_90 on the CPU and report their resources.

No GPU, ROCm or CUDA driver is needed: `triton.compile(ASTSource(...), target=GPUTarget(...))`
runs the whole pipeline down to hsaco / cubin. Resources come from the artefacts: the amdgcn
metadata (`.vgpr_count`, `.sgpr_count`, `.agpr_count`, spill counts, LDS) on AMD, and
`ptxas -v` on the PTX on NVIDIA (Triton's own ptxas; the driver that would report `n_regs` is
absent on the CPU).

API (model packages use it in their compile tests):
    res = compile_kernel(fn, {"x_ptr": "*fp32", "n": "i32"}, {"BLOCK": 128}, "gfx950", num_warps=4)
    res.registers, res.shared_bytes, res.spills, res.max_resident(), res.asm["amdgcn"]
    compile_both(fn, signature, constexprs) -> {"gfx950": Resources, "sm_90": Resources}
    compile_kernel(..., amd_buffer_ops=False): as a launch under triton_knobs.amd_buffer_ops(False)
    source_digest(fn_or_module, ...) -> sha256 hex of the kernel sources (for cache keys)
Works with Triton 3.6 and 3.8 (differences are guarded with hasattr/try).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import inspect
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from typing import Any

TARGETS = ("gfx950", "sm_90")

# Per-CU / per-SM limits used by max_resident (vendor documentation for CDNA3/4 and Hopper).
_AMD = dict(simds=4, vgprs_per_simd=512, vgpr_granule=8, sgprs_per_simd=800, sgpr_granule=16,
            waves_per_simd=8, lds_bytes=160 * 1024)
_NV = dict(regs=65536, reg_granule_per_warp=256, max_warps=64, max_blocks=32,
           smem_bytes=228 * 1024, smem_reserved_per_block=1024)


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one compiled kernel asks of a CU (gfx950) or an SM (sm_90)."""

    target: str
    name: str
    num_warps: int
    warp_size: int
    registers: int  # VGPRs (arch) per lane on AMD, registers per thread on NVIDIA
    sgprs: int | None  # AMD only
    agprs: int | None  # AMD only (accumulation VGPRs)
    shared_bytes: int  # LDS on AMD, shared memory on NVIDIA
    spills: int  # spilled registers (AMD: VGPR + SGPR counts) or spill bytes stored (NVIDIA)
    asm: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def max_resident(self) -> int:
        """Programs of this kernel that fit on one CU/SM at once."""
        return max_resident(self)


def max_resident(res: Resources) -> int:
    """Resident programs per CU (gfx950) or SM (sm_90), from registers, LDS/shared and warps."""
    w = res.num_warps
    if res.target.startswith("gfx"):
        a = _AMD
        # gfx90a+ unified register file: arch VGPRs rounded to 4, then AGPRs, in granules of 8.
        vg = -(-res.registers // 4) * 4 + (res.agprs or 0)
        vg = max(a["vgpr_granule"], -(-vg // a["vgpr_granule"]) * a["vgpr_granule"])
        waves = min(a["waves_per_simd"], a["vgprs_per_simd"] // vg)
        if res.sgprs:
            sg = -(-res.sgprs // a["sgpr_granule"]) * a["sgpr_granule"]
            waves = min(waves, a["sgprs_per_simd"] // sg)
        by_regs = (waves * a["simds"]) // w
        by_lds = a["lds_bytes"] // res.shared_bytes if res.shared_bytes else by_regs
        return max(0, min(by_regs, by_lds))
    n = _NV
    per_warp = -(-max(res.registers, 1) * res.warp_size // n["reg_granule_per_warp"]) * n["reg_granule_per_warp"]
    by_regs = (n["regs"] // per_warp) // w
    by_warps = n["max_warps"] // w
    by_smem = n["smem_bytes"] // (res.shared_bytes + n["smem_reserved_per_block"])
    return max(0, min(by_regs, by_warps, by_smem, n["max_blocks"]))


def gpu_target(target: str):
    from triton.backends.compiler import GPUTarget

    if target == "gfx950":
        return GPUTarget("hip", "gfx950", 64)
    if target == "sm_90":
        return GPUTarget("cuda", 90, 32)
    raise ValueError(f"unknown target {target!r}; known: {TARGETS}")


def _ast_source(fn, signature: Mapping[str, str], constexprs: Mapping[str, Any], pointer_align: int = 0):
    import inspect

    from triton.compiler import ASTSource

    sig = dict(signature)
    names = list(getattr(fn, "arg_names", sig.keys()))
    # a constexpr argument with a default takes it, as a launch that does not pass it does
    constexprs = dict(constexprs)
    for n, prm in inspect.signature(getattr(fn, "fn", fn)).parameters.items():
        if n not in sig and n not in constexprs and prm.default is not inspect.Parameter.empty \
                and "constexpr" in str(prm.annotation):
            constexprs[n] = prm.default
    for k in constexprs:
        sig.setdefault(k, "constexpr")
    missing = [n for n in names if n not in sig]
    if missing:
        raise ValueError(f"{fn.__name__}: no type or constexpr value for {missing}")
    sig = {n: sig[n] for n in names}
    # A launch specialises every pointer argument whose address is 16-byte aligned (torch
    # allocations are) with tt.divisibility 16; without it every access compiles scalar and
    # the resources are not the launched kernel's.
    attrs = {(i,): [["tt.divisibility", pointer_align]] for i, n in enumerate(names)
             if pointer_align and str(sig[n]).startswith("*")}
    try:
        if attrs:
            return ASTSource(fn, sig, dict(constexprs), attrs)
        return ASTSource(fn, sig, dict(constexprs))
    except (TypeError, AssertionError):
        # Older Triton wanted constexprs keyed by argument index and absent from the signature.
        idx = {names.index(k): v for k, v in constexprs.items()}
        return ASTSource(fn, {k: v for k, v in sig.items() if k not in constexprs}, idx)


def nvidia_tool(name: str) -> str:
    """Path of one of the CUDA tools Triton bundles ("ptxas", "nvdisasm", "cuobjdump"): Triton's
    knob for it, else its own lookup, else its backend's bin folder."""
    try:
        from triton import knobs

        p = getattr(knobs.nvidia, name).path
        if p:
            return p
    except Exception:
        pass
    try:
        from triton.backends.nvidia.compiler import _path_to_binary

        return _path_to_binary(name)[0]
    except Exception:
        pass
    import triton

    hits = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name))
    if not hits:
        raise RuntimeError(f"no {name} found in the Triton installation")
    return hits[0]


def sass_bytes(res: Resources) -> int:
    """Bytes of sm_90 SASS in a compiled kernel's cubin (`nvdisasm`, 16 bytes an instruction):
    what a launch fetches where it runs all its code once."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(res.asm["cubin"])
        f.flush()
        dis = subprocess.run([nvidia_tool("nvdisasm"), "-c", f.name], capture_output=True, text=True,
                             check=True).stdout
    return 16 * sum(1 for line in dis.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/.*;", line))


def _ptxas_resources(ptx: str) -> dict[str, int]:
    arch = re.search(r"^\.target\s+(\w+)", ptx, re.M)
    arch = arch.group(1) if arch else "sm_90a"
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([nvidia_tool("ptxas"), f"-arch={arch}", "-v", src, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill_st = re.search(r"(\d+) bytes spill stores", text)
    smem = re.search(r"(\d+) bytes smem", text)
    return dict(registers=int(regs.group(1)) if regs else 0,
                spills=int(spill_st.group(1)) if spill_st else 0,
                smem=int(smem.group(1)) if smem else 0, log=text)


def _amd_field(asm: str, key: str) -> int:
    m = re.search(rf"^\s*\.{key}:\s+(\d+)", asm, re.M)
    return int(m.group(1)) if m else 0


def compile_kernel(fn, signature: Mapping[str, str], constexprs: Mapping[str, Any] | None = None,
                   target: str = "gfx950", *, num_warps: int = 4, num_stages: int = 2,
                   pointer_align: int = 0, amd_buffer_ops: bool = True, **options) -> Resources:
    """Compile `fn` (a @triton.jit function) for `target` on the CPU; return its Resources.

    signature: Triton type strings for the runtime arguments ("*fp32", "*bf16", "i32", "i64",
    "fp32"); constexprs: values of the constexpr arguments (one with a default that is not given
    takes its default, as in a launch; any other missing argument is an error). pointer_align=16 compiles what a
    launch with 16-byte aligned pointer arguments compiles (Triton's launch-time
    specialisation); 0 assumes nothing about them. amd_buffer_ops=False compiles as a launch
    under `mono_common.triton_knobs.amd_buffer_ops(False)` does."""
    import triton

    from mono_common.triton_knobs import amd_buffer_ops as _buffer_ops

    constexprs = dict(constexprs or {})
    src = _ast_source(fn, signature, constexprs, pointer_align)
    opts = dict(num_warps=num_warps, num_stages=num_stages, **options)
    with _buffer_ops(amd_buffer_ops):
        ck = triton.compile(src, target=gpu_target(target), options=opts)
    md = ck.metadata
    shared = int(getattr(md, "shared", 0) or 0)
    asm = dict(ck.asm)
    name = getattr(md, "name", fn.__name__)
    if target == "gfx950":
        text = asm["amdgcn"]
        return Resources(target, name, num_warps, 64,
                         registers=_amd_field(text, "vgpr_count"), sgprs=_amd_field(text, "sgpr_count"),
                         agprs=_amd_field(text, "agpr_count"),
                         shared_bytes=max(shared, _amd_field(text, "group_segment_fixed_size")),
                         spills=_amd_field(text, "vgpr_spill_count") + _amd_field(text, "sgpr_spill_count"),
                         asm=asm)
    r = _ptxas_resources(asm["ptx"])
    asm["ptxas"] = r["log"]
    return Resources(target, name, num_warps, 32, registers=r["registers"], sgprs=None, agprs=None,
                     shared_bytes=max(shared, r["smem"]), spills=r["spills"], asm=asm)


def compile_both(fn, signature, constexprs=None, **kw) -> dict[str, Resources]:
    """compile_kernel for every target in TARGETS."""
    return {t: compile_kernel(fn, signature, constexprs, t, **kw) for t in TARGETS}


def format_resources(res: Resources) -> str:
    extra = f" sgpr={res.sgprs} agpr={res.agprs}" if res.sgprs is not None else ""
    return (f"{res.target:7s} {res.name}: regs={res.registers}{extra} shared={res.shared_bytes}B "
            f"spills={res.spills} warps={res.num_warps} resident/{'CU' if res.target.startswith('gfx') else 'SM'}="
            f"{res.max_resident()}")


def _source_of(obj) -> bytes:
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj)
    if isinstance(obj, str):
        with open(obj, "rb") as f:
            return f.read()
    src = getattr(obj, "src", None)  # a JITFunction keeps its source text
    if isinstance(src, str):
        return src.encode()
    if inspect.ismodule(obj):
        with open(inspect.getsourcefile(obj), "rb") as f:
            return f.read()
    return inspect.getsource(getattr(obj, "fn", obj)).encode()


def _name_of(obj) -> str:
    if isinstance(obj, (bytes, bytearray)):
        return "<bytes>"
    if isinstance(obj, str):
        return os.path.basename(obj)
    fn = getattr(obj, "fn", obj)
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', ''))}"


def source_digest(*objs, extra: str = "") -> str:
    """sha256 (hex) of the sources of kernels, modules or files, independent of argument order.

    Pass every module a kernel's source spans (its helpers too): a change anywhere changes the
    digest. `extra` adds anything else the cache key must hold (Triton version, options)."""
    h = hashlib.sha256()
    for name, data in sorted((_name_of(o), _source_of(o)) for o in objs):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    h.update(extra.encode())
    return h.hexdigest()
