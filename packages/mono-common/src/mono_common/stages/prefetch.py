"""L2 prefetch of weights: request a stage's weights before the hand-off that gates its inputs.

Weights do not depend on activations, so a stage's weight bytes can start moving from HBM
while the stage before it still runs or while its programs wait at the hand-off; the stage's
own loads then hit the L2. The L2 is shared by every SM, so which program prefetches a line
does not matter: each call deals a byte range's 128-byte lines over all the programs, 16 KB
a program a step (one line a thread), and returns without waiting for anything.

  prefetch_range(pid, nprog, base, nbytes, ON): the lines of [base, base + nbytes) (any
      pointer type; nbytes a runtime or constexpr int), dealt over programs 0..nprog-1;
      ON (constexpr) False compiles to nothing, 2 requests them as `prefetch_bulk` does.
  prefetch_lines(ptrs, ON): the line holding each pointer of the tensor ptrs (any shape and
      pointer type, as the tensor's layout deals it over the program's threads), for gathers
      whose addresses are data (a paged cache's rows, known a step before they are read);
      callers point masked lanes at an address that is valid. ON False: nothing.
  prefetch_bulk(pid, nprog, base, nbytes, ON): prefetch_range's request as sm_90's bulk
      prefetch, BULK bytes an instruction (one lane a chunk, the chunks dealt round-robin over
      the programs so that every SM's copy engine gets some): ~128x fewer instructions than a
      line each; base 16-byte aligned, nbytes a multiple of 16 (a tail under 16 bytes is not
      requested).

ISA: sm_90 issues `prefetch.global.L2` (no register result, no completion to wait for), or
`cp.async.bulk.prefetch.L2.global` (the copy engine walks the range; nothing to wait for either).
gfx950 has no L2-only prefetch instruction that Triton can emit; there the callers pass ON =
False and the stages read their weights as before (the documented fallback; a load whose
result is dropped would be removed by the compiler, and one kept alive costs registers).
"""

import triton
import triton.language as tl

LINE = tl.constexpr(128)  # bytes of an L2 line on both ISAs
LANES = tl.constexpr(128)  # lines a program requests per step (one per thread at 4 warps)
BULK = tl.constexpr(16384)  # bytes one bulk prefetch requests


@triton.jit
def _l2_prefetch(addr):
    """prefetch.global.L2 at each int64 address (sm_90); the int32 result is a dummy."""
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [addr],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_bulk(addr, size):
    """cp.async.bulk.prefetch.L2 of `size` bytes at each int64 address where size > 0 (sm_90);
    the int32 result is a dummy."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_range(pid, nprog, base, nbytes, ON: tl.constexpr):
    """Request the lines of [base, base + nbytes) into the L2, dealt over the programs (ON 2:
    as `prefetch_bulk`'s bulk prefetches instead)."""
    if ON == 2:
        prefetch_bulk(pid, nprog, base, nbytes, True)
    elif ON:
        b = base.to(tl.pointer_type(tl.uint8)).to(tl.int64, bitcast=True)
        nlines = (nbytes + LINE - 1) // LINE
        lane = tl.arange(0, LANES)
        for l0 in range(pid * LANES, nlines, nprog * LANES):
            ln = tl.minimum(l0 + lane, nlines - 1).to(tl.int64)
            _l2_prefetch(b + ln * LINE)


@triton.jit
def prefetch_lines(ptrs, ON: tl.constexpr):
    """Request the L2 line of each pointer of `ptrs` (sm_90); nothing waits for it."""
    if ON:
        _l2_prefetch(ptrs.to(tl.pointer_type(tl.uint8)).to(tl.int64, bitcast=True))


@triton.jit
def prefetch_bulk(pid, nprog, base, nbytes, ON: tl.constexpr):
    """Request [base, base + nbytes) into the L2 in BULK-byte bulk prefetches: chunk c goes to
    program c % nprog, so a range of a few chunks still spreads over the SMs' copy engines."""
    if ON:
        b = base.to(tl.pointer_type(tl.uint8)).to(tl.int64, bitcast=True)
        nch = (nbytes + BULK - 1) // BULK
        lane = tl.arange(0, LANES)
        for j0 in range(0, nch, nprog * LANES):
            c = j0 + lane * nprog + pid
            off = c.to(tl.int64) * BULK
            size = tl.minimum(nbytes - off, BULK).to(tl.int32) & -16
            _l2_prefetch_bulk(b + off, tl.where(c < nch, size, 0))
