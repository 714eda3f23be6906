"""Where the fused launch's warps wait, per stage: Nsight Compute's warp-stall sampling of one
launch, attributed to the layer's stages.

Three modes:
  launch   the ncu target: one TP8 shard (4 layers' weights in rotation, as the bench) at
           --width rows and --ctx context, --launches fused launches (ncu profiles one of them)
  collect  (GPU, ncu on the PATH) runs ncu on `launch` with the WarpStateStats and
           SourceCounters sections (`--clock-control none`, its default cache flush: each
           profiled pass starts with a cold L2, as a served layer does), and writes under --out
           the report, its SASS page as CSV (gzipped: per instruction, samples per stall
           reason) and the launch's cubin (a fresh Triton cache under --out)
  table    (CPU or GPU) reads that CSV and cubin: every instruction goes to the stage whose
           code it is (`nvdisasm -gi` line information; the hand-off's code, the guard's waits
           and the all-reduces as "sync"), and prints per stage the share of all samples, by
           reason, its SASS KB and its executed warp instructions

Reading the table: "sync" samples are warps waiting in hand-offs for the slowest program of the
stage before; stall_no_inst is instruction fetch; long_sb global memory; barrier a warp waiting
at a block barrier for its program's other warps; selected an issuing warp. Triton 3.6's line
information names the innermost source line only, so an instruction of a shared helper (a GEMV
tile, a numerics function) goes to the stage of the code before it in the binary.

PYTHONPATH=packages/mono-common/src:packages/mono-glm53/src python3 packages/mono-glm53/bench/stall_profile.py \
    collect --out DIR [--width 1] [--ctx 4096] [--knobs JSON]
... stall_profile.py table --out DIR [--width 1]
"""

from __future__ import annotations

import argparse
import ast
import collections
import csv
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys

# the disassembly's instruction and line-information patterns and the stage blocks of
# layer_kernel, as code_size.py (beside this file) reads them
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from code_size import _FRAME, _INSN, stage_blocks  # noqa: E402

REASONS = ("barrier", "long_sb", "no_inst", "wait", "selected", "short_sb", "branch_resolving", "membar")

# mono-common functions that are one stage's code (the rest, such as a GEMV tile or a numerics
# helper, are shared and go with the code before them); files that are all hand-off code
COMMON_STAGE = {
    "moe_silu": "silu", "moe_down": "down", "down_slot": "down", "_down_slot_y": "down",
    "_down_tile_pipelined": "down", "moe_gateup": "gateup", "_gateup_spans": "gateup",
    "fill_slots": "gateup", "slot_lists": "gateup", "prefetch_slots": "gateup", "biased_topk": "gateup",
    "mla_partial": "mla", "mla_combine": "mlacomb", "topk_hist": "tkhist", "topk_count": "tkcount",
    "topk_write": "tkwrite",
}
SYNC_FILES = ("guard.py", "epochs.py", "allreduce.py", "timer.py")
# mono-glm53 stages.py functions outside layer_kernel that are hand-off code
SYNC_FUNCS = ("_stamp", "_sync", "_sync_call", "_sync_now", "_skip", "_delay", "_sync_lazy")


def _function_lines(path: str) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of every top-level function of a source file."""
    tree = ast.parse(open(path).read())
    return [(f.lineno, f.end_lineno, f.name) for f in tree.body if isinstance(f, ast.FunctionDef)]


class StageMap:
    """Source (file, line) -> stage name, "sync", or None (shared code: keep the stage before)."""

    def __init__(self):
        import mono_common.stages.gemv as gemv
        from mono_glm53.kernels import stages as S

        self.kstart, self.blocks = stage_blocks(open(S.__file__).read(), S.STAGE_NAMES)
        self.glm_funcs = _function_lines(S.__file__)
        self.common = {}
        for path in glob.glob(os.path.join(os.path.dirname(gemv.__file__), "*.py")):
            self.common[os.path.basename(path)] = _function_lines(path)

    def _glm(self, line: int):
        if line >= self.kstart:
            stage = "pre"
            for b, name in self.blocks:
                if line >= b:
                    stage = name
            return stage
        for a, b, name in self.glm_funcs:
            if a <= line <= b:
                if name in SYNC_FUNCS:
                    return "sync"
                if name.startswith("stage_"):
                    return name[len("stage_"):]
        return None

    def __call__(self, fname: str, line: int):
        base = os.path.basename(fname)
        if base == "stages.py" and "mono_glm53" in fname:
            return self._glm(line)
        if base in SYNC_FILES:
            return "sync"
        for a, b, name in self.common.get(base, ()):
            if a <= line <= b:
                return COMMON_STAGE.get(name)
        return None


def source_digest() -> str:
    """A digest of the sources the stage attribution reads (mono-glm53's stages.py, mono-common's
    stage and device modules): `table` refuses a profile whose cubin other sources built."""
    import hashlib

    import mono_common.device.guard as guard
    import mono_common.stages.gemv as gemv
    from mono_glm53.kernels import stages as S

    h = hashlib.sha256()
    paths = [S.__file__] + sorted(glob.glob(os.path.join(os.path.dirname(gemv.__file__), "*.py"))
                                  + glob.glob(os.path.join(os.path.dirname(guard.__file__), "*.py")))
    for path in paths:
        h.update(open(path, "rb").read())
    return h.hexdigest()[:16]


def instruction_stages(cubin: str) -> list[str]:
    """The stage of every instruction of the cubin's kernel, in address order."""
    from mono_common.compilecheck import nvidia_tool

    dis = subprocess.run([nvidia_tool("nvdisasm"), "-gi", "-c", cubin], capture_output=True, text=True,
                         check=True).stdout
    return attribute(dis, StageMap())


def attribute(dis: str, where) -> list[str]:
    """The stage of every instruction of `nvdisasm -gi` text: the outermost frame of its line
    information that `where` names (a stage, or "sync"); an instruction of shared code (no
    frame named) goes with the last stage named before it."""
    out, cur, tag, chain, fresh = [], "pre", "pre", [], True
    for line in dis.split("\n"):
        if "//## File" in line:
            # consecutive lines are one inlining chain, innermost first (Triton 3.8 writes the
            # chain; 3.6 the innermost line alone)
            chain = _FRAME.findall(line) if fresh else chain + _FRAME.findall(line)
            fresh = False
            tag = None
            for f, ln in reversed(chain):
                tag = where(f, int(ln))
                if tag is not None:
                    break
        elif _INSN.match(line):
            fresh = True
            if tag is not None and tag != "sync":
                cur = tag
            out.append("sync" if tag == "sync" else cur)
    return out


def table(rep: str) -> str:
    """The per-stage table of the profile `rep` (the path `collect` wrote, without suffix)."""
    meta = json.load(open(rep + ".json"))
    if meta["sources"] != source_digest():
        raise SystemExit(f"{rep} was collected from other sources than these (digest {meta['sources']}, here "
                         f"{source_digest()}): run `table` from the tree that built it")
    with gzip.open(rep + ".csv.gz", "rt") as f:
        rows = list(csv.reader(f))
    hdr = next(r for r in rows if r and r[0] == "Address")
    data = rows[rows.index(hdr) + 1:]
    idx = {h: i for i, h in enumerate(hdr)}
    stages = instruction_stages(rep + ".cubin")
    if len(stages) != len(data):
        raise SystemExit(f"the cubin has {len(stages)} instructions, the profile {len(data)}: not the same binary")
    agg: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    order: list[str] = []

    def num(s):
        return int(s.replace(",", "")) if s else 0

    for st, d in zip(stages, data):
        if st not in order:
            order.append(st)
        a = agg[st]
        a["all"] += num(d[idx["Warp Stall Sampling (All Samples)"]])
        a["exec"] += num(d[idx["Instructions Executed"]])
        a["bytes"] += 16
        for r in REASONS:
            a[r] += num(d[idx[f"stall_{r}"]])
    tot = sum(a["all"] for a in agg.values()) or 1
    lines = [f"{'stage':9s} {'% all':>6s} " + " ".join(f"{r[:8]:>8s}" for r in REASONS) + "     KB  k insns"]
    for st in order + ["all"]:
        a = agg[st] if st != "all" else sum(agg.values(), collections.Counter())
        lines.append(f"{st:9s} {100 * a['all'] / tot:6.1f} " + " ".join(f"{100 * a[r] / tot:8.1f}" for r in REASONS)
                     + f" {a['bytes'] / 1024:6.1f} {a['exec'] / 1000:8.0f}")
    return (f"width {meta['width']} ctx {meta['ctx']} knobs {meta['knobs']}: {tot} samples; % of all samples\n"
            + "\n".join(lines))


def launch(a) -> None:
    import time

    import torch

    from mono_glm53.bench import BenchCase, _chain, _sub_inputs
    from mono_glm53.config import REAL
    from mono_glm53.kernels.bench_path import knob_builder
    from mono_glm53.reference import LayerCaches
    from mono_glm53.weights import make_caches, make_weights

    s = REAL.tp_shard(8, 0)
    layers = 4
    ws = [make_weights(s, device="cuda", seed=i) for i in range(layers)]
    inp, c0 = make_caches(s, a.width, a.ctx, device="cuda", seed=7)
    caches = [c0] + [LayerCaches(kv=c0.kv.clone(), index_k=c0.index_k.clone()) for _ in range(layers - 1)]
    g = torch.Generator(device="cuda")
    g.manual_seed(5)
    hid = torch.randn(a.width, s.hidden, device="cuda", generator=g).bfloat16()
    res = torch.randn(a.width, s.hidden, device="cuda", generator=g).bfloat16()
    cases = [BenchCase(s, ws[i], _sub_inputs(inp, a.width), caches[i], hid.clone(), res.clone(), a.ctx, a.width)
             for i in range(layers)]
    steps = [knob_builder(json.loads(a.knobs))(c) for c in cases]
    _chain(steps)
    torch.cuda.synchronize()
    t0 = time.time()
    for i in range(a.launches):
        steps[i % layers]()
    torch.cuda.synchronize()
    print(f"{a.launches} launches, {1e6 * (time.time() - t0) / a.launches:.1f} us each (eager)")
    steps[0].check()


def collect(a) -> None:
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(a.out, f"triton-w{a.width}"))
    me = [sys.executable, os.path.abspath(__file__), "launch", "--width", str(a.width), "--ctx", str(a.ctx),
          "--knobs", a.knobs]
    subprocess.run(me + ["--launches", "4"], env=env, check=True)  # compile outside the profiler
    rep = os.path.join(a.out, f"stalls_w{a.width}")
    subprocess.run(["ncu", "--clock-control", "none", "-k", "regex:layer_kernel", "--launch-skip", "8",
                    "--launch-count", "1", "--section", "WarpStateStats", "--section", "SourceCounters",
                    "--section", "SpeedOfLight", "-f", "-o", rep] + me + ["--launches", "12"], env=env, check=True)
    page = subprocess.run(["ncu", "-i", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                          capture_output=True, text=True, check=True).stdout
    with gzip.open(rep + ".csv.gz", "wt") as f:
        f.write(page)
    cubins = glob.glob(os.path.join(env["TRITON_CACHE_DIR"], "*", "layer_kernel.cubin"))
    if len(cubins) != 1:
        raise SystemExit(f"expected one layer_kernel build in the fresh cache, found {len(cubins)}")
    shutil.copy(cubins[0], rep + ".cubin")
    shutil.rmtree(env["TRITON_CACHE_DIR"])
    with open(rep + ".json", "w") as f:
        json.dump({"width": a.width, "ctx": a.ctx, "knobs": json.loads(a.knobs), "sources": source_digest()}, f)
    print(table(rep))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("launch", "collect", "table"))
    ap.add_argument("--width", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--knobs", default="{}", help="GlmLayerKernel knobs as JSON (kernels.layer.KNOBS)")
    ap.add_argument("--launches", type=int, default=12)
    ap.add_argument("--out", default="stalls")
    a = ap.parse_args(argv)
    if a.mode == "launch":
        launch(a)
    elif a.mode == "collect":
        collect(a)
    else:
        print(table(os.path.join(a.out, f"stalls_w{a.width}")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
