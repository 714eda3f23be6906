"""Standalone entries whose stages are linked by grid hand-offs inside one launch, as a layer
links them: what a multi-stage library stage costs with its hand-offs, and a hand-off alone.

  topk_linked_entry  the six stages of `stages.topk` (four radix passes, count, write) with a
      hand-off after each, over L score sets (set l at scores + l * sc_lstride, [W, stride_sc]
      fp32); set l's histograms are the tkh slice l % 2 ([2, W, TKH_ROW] int32), and set l zeroes
      the other slice for set l + 1, so tkh needs zeroing once at allocation (L even keeps it
      zero across graph replays); the result of every set lands in topk [W, TOPK]. ROW > 0 (a
      power of two, every row at most ROW tokens): each set's whole top-k by one program a row
      (`topk.topk_rows_one`) and one hand-off, no histograms; with HIST, radix pass 0 and a
      hand-off first, its histogram seeding the rows' search (`topk.topk_row` HIST). SPREAD > 0
      (a power of two, every row at most SPREAD tokens): radix pass 0 with the fine histograms
      (tkc_ptr holds them then: [2, W, topk.TKS_FINE] int32, zeroed as tkh), then the spread
      form's threshold and write (`topk.topk_spread_threshold` / `topk_spread_write`, RK keys a
      tile), a hand-off after each; with SEL the two as one stage (`topk.topk_spread_select`),
      two hand-offs a set
  mla_entry          `stages.mla`: MODE 0 the partials only (the stage's streaming rate), 1 the
      combine only (with 0: the staged form, one launch each), 2 partials, hand-off, combine,
      hand-off; over L latent caches (set l at kv + l * kv_lstride); attn [W, NH, KVL] bf16
  handoff_entry      N back-to-back grid hand-offs with no work between them: FLAG picks
      `handoff.grid_handoff_flag` (its bar holds handoff.BAR_WORDS words) over `grid_handoff`
      (AMD: its polling load for a ROCm device); SPLIT >= 1 picks `handoff.grid_handoff_split`
      over SPLIT counters (its bar holds SPLIT * handoff.LINE_WORDS + 2 words), LD its load polls;
      SPIN picks `handoff.grid_handoff_spin` (one thread's poll loop; LD: acquire loads), sm_90

bar_ptr: 2 int32 words (counter, spare zero), zero at launch; every hand-off a launch makes
raises the counter by the grid, so a launch's targets are multiples of the grid. A linked
launch needs every program resident (launch it cooperative). Used by the interpreter tests
(one program: a hand-off between programs that the interpreter runs one after another would
never complete) and by `mono bench stages`.
"""

import triton
import triton.language as tl

from mono_common.stages.entries import grid_handoff
from mono_common.stages.handoff import grid_handoff_flag, grid_handoff_spin, grid_handoff_split
from mono_common.stages.mla import mla_combine, mla_partial
from mono_common.stages.topk import (
    TKC,
    TKH_ROW,
    TKS_FINE,
    topk_count,
    topk_hist,
    topk_hist_tiles,
    topk_rows_one,
    topk_spread_select,
    topk_spread_threshold,
    topk_spread_write,
    topk_spread_zero,
    topk_write,
)


@triton.jit
def topk_linked_entry(scores_ptr, seqlen_ptr, tkh_ptr, tkc_ptr, topk_ptr, bar_ptr, L, stride_sc: tl.constexpr,
                      nck: tl.constexpr, sc_lstride: tl.constexpr, W: tl.constexpr, TOPK: tl.constexpr,
                      ROW: tl.constexpr = 0, HIST: tl.constexpr = False, SPREAD: tl.constexpr = 0,
                      RK: tl.constexpr = 16, SEL: tl.constexpr = False):
    # strides and sizes are constexprs: as runtime scalars they held gfx950 SGPRs past its 106
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    sl = scores_ptr
    zrow = tl.zeros([TKH_ROW], tl.int32)
    if ROW > 0 and not HIST:
        for li in range(L):
            topk_rows_one(pid, nprog, sl, stride_sc, seqlen_ptr, topk_ptr, W, TOPK, ROW)
            grid_handoff(bar_ptr, (li + 1) * nprog)
            sl += sc_lstride
    else:
        for li in range(L):
            hb = tkh_ptr + (li % 2) * (W * TKH_ROW)
            # the other slice was last read by set li - 1, whose reads ended before this set's first
            # hand-off; set li + 1 reads it after this set's last
            nb = tkh_ptr + ((li + 1) % 2) * (W * TKH_ROW)
            for r in range(pid, W, nprog):
                tl.store(nb + r * TKH_ROW + tl.arange(0, TKH_ROW), zrow)
            if SPREAD > 0:
                fb = tkc_ptr + (li % 2) * (W * TKS_FINE)
                topk_spread_zero(pid, nprog, tkc_ptr + ((li + 1) % 2) * (W * TKS_FINE), W)
                topk_hist_tiles(pid, nprog, sl, stride_sc, seqlen_ptr, hb, W, TOPK, TKC, fb)
                if SEL:
                    grid_handoff(bar_ptr, (2 * li + 1) * nprog)
                    topk_spread_select(pid, nprog, sl, stride_sc, seqlen_ptr, hb, fb, topk_ptr, W, TOPK, SPREAD, RK)
                    grid_handoff(bar_ptr, (2 * li + 2) * nprog)
                else:
                    grid_handoff(bar_ptr, (3 * li + 1) * nprog)
                    topk_spread_threshold(pid, nprog, sl, stride_sc, seqlen_ptr, hb, fb, W, TOPK, SPREAD, RK)
                    grid_handoff(bar_ptr, (3 * li + 2) * nprog)
                    topk_spread_write(pid, nprog, sl, stride_sc, seqlen_ptr, hb, topk_ptr, W, TOPK, SPREAD, RK)
                    grid_handoff(bar_ptr, (3 * li + 3) * nprog)
            elif ROW > 0:
                topk_hist(pid, nprog, sl, stride_sc, seqlen_ptr, hb, nck, W, TOPK, True, 0)
                grid_handoff(bar_ptr, (2 * li + 1) * nprog)
                topk_rows_one(pid, nprog, sl, stride_sc, seqlen_ptr, topk_ptr, W, TOPK, ROW, hb, True)
                grid_handoff(bar_ptr, (2 * li + 2) * nprog)
            else:
                base = li * 6
                for ps in tl.static_range(4):
                    topk_hist(pid, nprog, sl, stride_sc, seqlen_ptr, hb, nck, W, TOPK, True, ps)
                    grid_handoff(bar_ptr, (base + ps + 1) * nprog)
                topk_count(pid, nprog, sl, stride_sc, seqlen_ptr, hb, tkc_ptr, nck, W, TOPK, True)
                grid_handoff(bar_ptr, (base + 5) * nprog)
                topk_write(pid, nprog, sl, stride_sc, seqlen_ptr, hb, tkc_ptr, topk_ptr, nck, W, TOPK, True)
                grid_handoff(bar_ptr, (base + 6) * nprog)
            sl += sc_lstride


@triton.jit
def mla_entry(qabs_ptr, kv_ptr, topk_ptr, req_ptr, rtt_ptr, part_ptr, ml_ptr, attn_ptr, bar_ptr, sm_scale, L,
              stride_rtt: tl.constexpr, kv_lstride: tl.constexpr, W: tl.constexpr, NH: tl.constexpr,
              KVL: tl.constexpr, RD: tl.constexpr, TOPK: tl.constexpr, CT: tl.constexpr, HG: tl.constexpr,
              MODE: tl.constexpr, HOLD: tl.constexpr = False):
    # strides are constexprs for the SGPRs, as above (CT = 64 fits gfx950's 106 with both stages
    # and the hand-offs; smaller chunks unroll the combine further and spill there)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    kl = kv_ptr
    for li in range(L):
        if MODE != 1:
            mla_partial(pid, nprog, qabs_ptr, kl, topk_ptr, req_ptr, rtt_ptr, stride_rtt, part_ptr, ml_ptr, sm_scale,
                        W, NH, KVL, RD, TOPK, CT, HG, HOLD)
        if MODE == 2:
            grid_handoff(bar_ptr, (2 * li + 1) * nprog)
        if MODE != 0:
            mla_combine(pid, nprog, part_ptr, ml_ptr, attn_ptr, W, NH, KVL, TOPK, CT)
        if MODE == 2:
            # the next set's partials overwrite what this combine reads
            grid_handoff(bar_ptr, (2 * li + 2) * nprog)
        kl += kv_lstride


@triton.jit
def handoff_entry(bar_ptr, N, FLAG: tl.constexpr = False, AMD: tl.constexpr = False, SPLIT: tl.constexpr = 0,
                  LD: tl.constexpr = False, SPIN: tl.constexpr = False):
    nprog = tl.num_programs(0)
    pid = tl.program_id(0)
    for i in range(N):
        if SPIN:
            grid_handoff_spin(bar_ptr, (i + 1) * nprog, LD)
        elif SPLIT > 0:
            grid_handoff_split(pid, bar_ptr, (i + 1) * nprog, SPLIT, LD)
        elif FLAG:
            grid_handoff_flag(bar_ptr, (i + 1) * nprog, AMD)
        else:
            grid_handoff(bar_ptr, (i + 1) * nprog)
