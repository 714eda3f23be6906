"""Standalone entries of the library stages: each stage alone in its own small launch.

Each entry runs a stage the way a layer kernel calls it (grid = the resident programs, tiles
shared among them) over L weight sets in a row (layer l reads w + l * w_lstride), with a grid
hand-off after each when BAR is set (what a stage costs inside a layer: its own time plus one
hand-off) or none (the stage's streaming rate). Used by the interpreter tests (L = 1, BAR off)
and by `mono bench stages`.

  gemv_entry     `stages.gemv` over x [W, K] -> partials [L][SLOTS, W, N] fp32
  topk_entry     one stage of `stages.topk` (STAGE 0-3 the radix passes, 4 count, 5 write)
  routing_entry  `stages.routing.biased_topk` of logits [W, E] -> weights [W, E], used [E]
  rmsnorm_entry  `stages.norm.rmsnorm_vec` per row of x [W, D]
  rope_entry     `stages.rope.rope_apply` per row of x [W, RD] at positions pos [W]
  hadamard_entry `stages.rope.hadamard` per row of x [W, D]
The small entries run one row a program (grid = rows): what the layer calls per tile.
"""

import triton
import triton.language as tl

from mono_common.device.guard import poll, signal
from mono_common.stages.gemv import gemv_span, gemv_tile
from mono_common.stages.norm import rmsnorm_vec
from mono_common.stages.rope import hadamard, rope_apply
from mono_common.stages.routing import biased_topk
from mono_common.stages.topk import topk_count, topk_hist, topk_write


@triton.jit
def grid_handoff(bar_ptr, target):
    """Every program arrives (`guard.signal`, release), then polls until `target` arrivals
    (`guard.poll`, acquire). bar_ptr holds 2 int32 words (counter, spare zero): the poll is a
    2-lane atomic, never single-lane. Bench-only: no deadline (layers use `guard.wait_ge`)."""
    signal(bar_ptr, 1, False)
    lanes = bar_ptr + tl.arange(0, 2)
    v = tl.max(poll(lanes, False), 0)
    while v < target:
        v = tl.max(poll(lanes, False), 0)
    tl.debug_barrier()


@triton.jit
def gemv_entry(x_ptr, xs_ptr, w_ptr, s_ptr, out_ptr, bar_ptr, L,
               N: tl.constexpr, K: tl.constexpr, W: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr, BLK: tl.constexpr, KS: tl.constexpr, PER: tl.constexpr,
               SLOTS: tl.constexpr, SPAN: tl.constexpr, FMT: tl.constexpr, XQ: tl.constexpr,
               PRE: tl.constexpr, DOT: tl.constexpr, BAR: tl.constexpr):
    # shapes and strides are constexprs: as runtime scalars they held gfx950 SGPRs past its 106
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    T: tl.constexpr = ((N + BN - 1) // BN) * KS
    w_lstride: tl.constexpr = N * K
    s_lstride: tl.constexpr = ((N + BLK - 1) // BLK) * (K // BLK)
    o_lstride: tl.constexpr = SLOTS * W * N
    wl = w_ptr
    sl = s_ptr
    ol = out_ptr
    for li in range(L):
        if SPAN:
            gemv_span(pid, x_ptr, K, wl, sl, ol, N, N, K, W, BM, BN, BLK, PER, FMT, xs_ptr, XQ, PRE, DOT)
        else:
            for t in range(pid, T, nprog):
                gemv_tile(t, x_ptr, K, wl, sl, ol, N, N, K, W, BM, BN, BLK, KS, FMT, xs_ptr, XQ, PRE, DOT)
        if BAR:
            grid_handoff(bar_ptr, (li + 1) * nprog)
        # advanced as pointers (64-bit): L sets of a large weight pass 2^31 bytes
        wl += w_lstride
        sl += s_lstride
        ol += o_lstride


@triton.jit
def topk_entry(scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkc_ptr, topk_ptr, nck,
               W: tl.constexpr, TOPK: tl.constexpr, STAGE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if STAGE < 4:
        topk_hist(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, nck, W, TOPK, True, STAGE)
    elif STAGE == 4:
        topk_count(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkc_ptr, nck, W, TOPK, True)
    else:
        topk_write(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkc_ptr, topk_ptr, nck, W, TOPK, True)


@triton.jit
def routing_entry(lg_ptr, bias_ptr, w_ptr, used_ptr, W: tl.constexpr, BM: tl.constexpr, E: tl.constexpr,
                  TOPE: tl.constexpr, KSR: tl.constexpr):
    wmat, used = biased_topk(lg_ptr, bias_ptr, W, BM, E, TOPE, KSR)
    rows = tl.arange(0, BM)
    e = tl.arange(0, E)
    tl.store(w_ptr + rows[:, None] * E + e[None, :], wmat, mask=(rows < W)[:, None])
    tl.store(used_ptr + e, used)


@triton.jit
def rmsnorm_entry(x_ptr, w_ptr, out_ptr, eps, D: tl.constexpr):
    m = tl.program_id(0)
    x = tl.load(x_ptr + m * D + tl.arange(0, D)).to(tl.float32)
    tl.store(out_ptr + m * D + tl.arange(0, D), rmsnorm_vec(x, w_ptr, D, eps))


@triton.jit
def rope_entry(x_ptr, pos_ptr, cs_ptr, out_ptr, RD: tl.constexpr, NEOX: tl.constexpr):
    m = tl.program_id(0)
    pos = tl.load(pos_ptr + m)
    tl.store(out_ptr + m * RD + tl.arange(0, RD), rope_apply(x_ptr + m * RD, pos, cs_ptr, RD, NEOX))


@triton.jit
def hadamard_entry(x_ptr, out_ptr, hscale, D: tl.constexpr):
    m = tl.program_id(0)
    tl.store(out_ptr + m * D + tl.arange(0, D), hadamard(x_ptr + m * D, D, hscale))
