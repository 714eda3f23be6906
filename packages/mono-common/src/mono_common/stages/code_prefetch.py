"""A persistent kernel's own code requested into the L2, so that its stages' instruction fetches
hit the L2 instead of HBM.

A monokernel runs each stage's code once a launch, and between (and during) launches a weight
stream larger than the L2 evicts that code: each stage's first instructions then come from HBM
on every SM at once (~0.25-0.3 us a KB of straight code; `bench/code_fetch.py` and the layer's
`code_pad` probe, results README). The code's address is known to the kernel itself: PTX's
`mov.u64 r, <entry name>` reads the entry's address from a constant bank the driver fills at
module load, and the code at that address is readable by ordinary loads (checked on the GPU by
`bench/code_fetch.py --self`). So a kernel can request its own code's lines into the L2 as it
requests its weights (`prefetch.prefetch_range`): at the start and again before each hand-off,
ahead of the instruction fetches that would otherwise miss.

  code_base(NAME): int64, the address of the entry named NAME (a constexpr string: the
      `@triton.jit` function's name, which Triton gives the PTX entry). sm_90 only.
  prefetch_code(pid, nprog, NAME, nbytes, ON): the lines of the entry's first nbytes bytes
      (its code size, `text_bytes` on the host; 0 requests nothing) dealt over the programs,
      nothing waited for. ON (constexpr) False compiles to nothing.
  text_bytes(binary, name): the size of the ELF section `.text.<name>` of a cubin (the
      entry's code with every function it calls), 0 where there is none.
  text_of(binary, name): that section's bytes (b"" where there is none).
  code_read_entry(out_ptr, nbytes, ON): the standalone entry (one program stores its code
      address and the code's first 32 bytes read there; ON: every program requests the code).

ISA: sm_90 only. gfx950 has no instruction that Triton can emit to read a kernel's code address
(and no L2-only prefetch, `prefetch` module): there callers pass ON = False and the code is
fetched as before (the documented fallback). The interpreter: ON False.
"""

import struct

import triton
import triton.language as tl

from mono_common.stages.prefetch import prefetch_range


@triton.jit
def code_base(NAME: tl.constexpr):
    """The address of the kernel entry NAME (sm_90: the driver's relocation in a constant bank)."""
    return tl.inline_asm_elementwise("mov.u64 $0, " + NAME + ";", "=l", [], dtype=tl.int64, is_pure=True, pack=1)


@triton.jit
def prefetch_code(pid, nprog, NAME: tl.constexpr, nbytes, ON: tl.constexpr):
    """Request the first nbytes bytes of entry NAME's code into the L2, dealt over the programs."""
    if ON:
        prefetch_range(pid, nprog, code_base(NAME).to(tl.pointer_type(tl.uint8), bitcast=True), nbytes, True)


def text_of(binary: bytes, name: str) -> bytes:
    """The section `.text.<name>` of the ELF64 `binary` (a cubin), b"" if it has none (not
    ELF64, or no such section)."""
    if len(binary) < 64 or binary[:4] != b"\x7fELF" or binary[4] != 2:
        return b""
    shoff = struct.unpack_from("<Q", binary, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", binary, 0x3A)
    if shoff == 0 or shentsize < 40 or shstrndx >= shnum or shoff + shnum * shentsize > len(binary):
        return b""
    heads = [struct.unpack_from("<IIQQQQ", binary, shoff + i * shentsize) for i in range(shnum)]
    names = heads[shstrndx][4]
    want = b".text." + name.encode()
    for nm, _type, _flags, _addr, off, size in heads:
        start = names + nm
        end = binary.find(b"\0", start)
        if binary[start:end] == want:
            return binary[off:off + size]
    return b""


def text_bytes(binary: bytes, name: str) -> int:
    """Bytes of the section `.text.<name>` of the ELF64 `binary` (a cubin), 0 if it has none."""
    return len(text_of(binary, name))


@triton.jit
def code_read_entry(out_ptr, nbytes, ON: tl.constexpr):
    """Standalone entry: program 0 stores its own code address (out_ptr[0], int64) and the first
    four int64 words of the code read at it (out_ptr[1..4]; the host compares them with the
    cubin's `.text.code_read_entry`); with ON every program first requests its share of the
    first nbytes of its code into the L2."""
    pid = tl.program_id(0)
    prefetch_code(pid, tl.num_programs(0), "code_read_entry", nbytes, ON)
    if pid == 0:
        a = code_base("code_read_entry")
        tl.store(out_ptr, a)
        words = tl.load(a.to(tl.pointer_type(tl.int64), bitcast=True) + tl.arange(0, 4))
        tl.store(out_ptr + 1 + tl.arange(0, 4), words)
