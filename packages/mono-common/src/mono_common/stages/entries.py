"""Standalone entries of the library stages: each stage alone in its own small launch.

Each entry runs a stage the way a layer kernel calls it (grid = the resident programs, tiles
shared among them) over L weight sets in a row (layer l reads w + l * w_lstride), with a grid
hand-off after each when BAR is set (what a stage costs inside a layer: its own time plus one
hand-off) or none (the stage's streaming rate). Used by the interpreter tests (L = 1, BAR off)
and by `mono bench stages`. gemv_entry's BAR 2 hands off with `handoff.grid_handoff_flag`
instead (a bench variant; its bar holds handoff.BAR_WORDS words; AMD: for a ROCm device).

  gemv_entry     `stages.gemv` over x [W, K] -> partials [L][SLOTS, W, N] fp32 (FIX: the spans'
                 column tiles summed into slot 0 by their last span, `gemv.span_fixup`)
  gemv_pair_entry  two FP8 GEMVs over one x [W, K] -> partials [SLOTS, W, NA] and [SLOTS, W, NB],
                 as `gemv.gemv_span_pair` (PAIR) or as two `gemv_span` calls (one set, no hand-off)
  topk_entry     one stage of `stages.topk` (STAGE 0-3 the radix passes, 4 count, 5 write; 6
                 one program a row of at most SHORT tokens, `topk_rows_one`)
  topk_spread_entry  one stage of the spread form (STAGE 0 radix pass 0 and the fine histograms,
                 1 `topk_spread_threshold`, 2 `topk_spread_write`)
  topk_first_entry  the first radix pass as a producer of the scores runs it (TB scores a tile)
  routing_entry  `stages.routing.biased_topk` of logits [W, E] -> weights [W, E], used [E]
                 (LIVE: only the rows whose live [W] int32 is nonzero route)
  rmsnorm_entry  `stages.norm.rmsnorm_vec` per row of x [W, D]
  rope_entry     `stages.rope.rope_apply` per row of x [W, RD] at positions pos [W]
  hadamard_entry `stages.rope.hadamard` per row of x [W, D]
  moe_entry      `stages.moe` (gate_up, SiLU, down over expert slots) for L steps of per-row
                 (expert id, weight) lists -> out [L][W, H] bf16; its tensors in a pointer table
The small entries run one row a program (grid = rows): what the layer calls per tile.
"""

import triton
import triton.language as tl

from mono_common.device.epochs import epoch_begin
from mono_common.device.guard import poll, signal
from mono_common.stages.gemv import (
    FMT_BF16,
    FMT_FP8,
    gemv_span,
    gemv_span_call,
    gemv_span_joint,
    gemv_span_pair,
    gemv_tile,
)
from mono_common.stages.handoff import grid_handoff_flag
from mono_common.stages.moe import fill_slots, moe_down, moe_down_items, moe_gateup, moe_silu, slot_lists
from mono_common.stages.norm import rmsnorm_vec
from mono_common.stages.numerics import CVT_F16
from mono_common.stages.prefetch import prefetch_range
from mono_common.stages.rope import hadamard, rope_apply
from mono_common.stages.routing import biased_topk
from mono_common.stages.topk import (
    TKC,
    topk_count,
    topk_hist,
    topk_hist_tiles,
    topk_rows_one,
    topk_spread_select,
    topk_spread_threshold,
    topk_spread_write,
    topk_write,
)


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
               PRE: tl.constexpr, DOT: tl.constexpr, BAR: tl.constexpr, AMD: tl.constexpr = False,
               LSTG: tl.constexpr = 0, FASTCVT: tl.constexpr = False, fix_ptr=None, FIX: tl.constexpr = False,
               PFN: tl.constexpr = False, CALL: tl.constexpr = False, HWX: tl.constexpr = False):
    # PFN (sm_90): each weight set's next set (weights and scales) requested into the L2 before
    # the set is computed, as a layer requests a stage's weights ahead (`stages.prefetch`), so
    # the HBM streams across the hand-offs and a set's own loads hit the L2; PFN 2: as bulk
    # prefetches (`prefetch.prefetch_bulk`), a few instructions a program instead of a line a lane
    # CALL (SPAN only): the span a call of one copy of its code (`gemv.gemv_span_call`)
    # HWX (sm_90, without XQ): x quantised in the loop on the conversion unit (`gemv._kblock`)
    # FIX (SPAN only): each column tile's last span sums its SLOTS partials into slot 0
    # (`gemv.span_fixup`) on counters fix_ptr [L, column tiles], then the programs' epoch slots
    # [nprog]: all zero before the first launch, never reset (graph replays count on)
    # shapes and strides are constexprs: as runtime scalars they held gfx950 SGPRs past its 106
    tl.static_assert(not (PFN and AMD), "PFN is sm_90's L2 prefetch instruction")
    tl.static_assert(not (HWX and AMD), "HWX is sm_90's conversion unit")
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    T: tl.constexpr = ((N + BN - 1) // BN) * KS
    w_lstride: tl.constexpr = N * K
    s_lstride: tl.constexpr = ((N + BLK - 1) // BLK) * (K // BLK)
    o_lstride: tl.constexpr = SLOTS * W * N
    wl = w_ptr
    sl = s_ptr
    ol = out_ptr
    NTF: tl.constexpr = (N + BN - 1) // BN
    epoch = 0
    if FIX:
        epoch = epoch_begin(fix_ptr + L * NTF + pid)
    for li in range(L):
        if PFN:
            if li + 1 < L:
                prefetch_range(pid, nprog, wl + w_lstride, w_lstride * (2 if FMT == FMT_BF16 else 1), PFN)
                prefetch_range(pid, nprog, sl + s_lstride, s_lstride * 4, PFN)
        if SPAN and CALL:
            gemv_span_call(pid, x_ptr, K, wl, sl, ol, N, N, K, W, BM, BN, BLK, PER, FMT, xs_ptr, XQ, DOT, FASTCVT)
        elif SPAN:
            gemv_span(pid, x_ptr, K, wl, sl, ol, N, N, K, W, BM, BN, BLK, PER, FMT, xs_ptr, XQ, PRE, DOT, LSTG,
                      FASTCVT, fix_ptr + li * NTF if FIX else None, epoch, SLOTS if FIX else 0, HWX)
        else:
            for t in range(pid, T, nprog):
                gemv_tile(t, x_ptr, K, wl, sl, ol, N, N, K, W, BM, BN, BLK, KS, FMT, xs_ptr, XQ, PRE, DOT, LSTG,
                          FASTCVT, HWX)
        if BAR == 2:
            grid_handoff_flag(bar_ptr, (li + 1) * nprog, AMD)
        elif BAR:
            grid_handoff(bar_ptr, (li + 1) * nprog)
        # advanced as pointers (64-bit): L sets of a large weight pass 2^31 bytes
        wl += w_lstride
        sl += s_lstride
        ol += o_lstride


@triton.jit
def gemv_pair_entry(x_ptr, xs_ptr, wa_ptr, sa_ptr, oa_ptr, wb_ptr, sb_ptr, ob_ptr,
                    NA: tl.constexpr, NB: tl.constexpr, PERA: tl.constexpr, PERB: tl.constexpr, K: tl.constexpr,
                    W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, XQ: tl.constexpr, DOT: tl.constexpr,
                    PAIR: tl.constexpr):
    # PAIR 0: two gemv_span calls; 1: gemv_span_pair; 2: gemv_span_joint (spans of PERA items
    # over both GEMVs' tiles; PERB unused)
    p = tl.program_id(0)
    if PAIR == 2:
        gemv_span_joint(p, x_ptr, K, xs_ptr, K, wa_ptr, sa_ptr, oa_ptr, NA, wb_ptr, sb_ptr, ob_ptr, NB, PERA,
                        W, BM, BN, 128, FMT_FP8, XQ, DOT)
    elif PAIR:
        gemv_span_pair(p, x_ptr, K, xs_ptr, K, wa_ptr, sa_ptr, oa_ptr, NA, PERA, wb_ptr, sb_ptr, ob_ptr, NB, PERB,
                       W, BM, BN, 128, FMT_FP8, XQ, DOT)
    else:
        gemv_span(p, x_ptr, K, wa_ptr, sa_ptr, oa_ptr, NA, NA, K, W, BM, BN, 128, PERA, FMT_FP8, xs_ptr, XQ, DOT=DOT)
        gemv_span(p, x_ptr, K, wb_ptr, sb_ptr, ob_ptr, NB, NB, K, W, BM, BN, 128, PERB, FMT_FP8, xs_ptr, XQ, DOT=DOT)


@triton.jit
def topk_entry(scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkc_ptr, topk_ptr, nck, pass_rt,
               W: tl.constexpr, TOPK: tl.constexpr, STAGE: tl.constexpr, RT: tl.constexpr = False,
               SHORT: tl.constexpr = 0, ONCE: tl.constexpr = False):
    # RT: the radix pass STAGE given at runtime (pass_rt), as a loop over the passes runs it;
    # SHORT: the count and write stages' SHORT (`stages.topk`: rows of at most SHORT tokens
    # counted by the write); ONCE: a program's tiles a contiguous run, a row's threshold
    # derived once a run; STAGE 6: the whole top-k, one program a row of at most SHORT tokens;
    # STAGE 7: the same after radix pass 0 (its histograms seed the row's search, `topk_row` HIST)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if STAGE >= 6:
        topk_rows_one(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, topk_ptr, W, TOPK, SHORT, tkh_ptr, STAGE == 7)
    elif STAGE < 4:
        topk_hist(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, nck, W, TOPK, True,
                  pass_rt if RT else STAGE, RT, ONCE)
    elif STAGE == 4:
        topk_count(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkc_ptr, nck, W, TOPK, True, SHORT, ONCE)
    else:
        topk_write(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkc_ptr, topk_ptr, nck, W, TOPK, True,
                   SHORT, ONCE)


@triton.jit
def topk_spread_entry(scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkf_ptr, topk_ptr, W: tl.constexpr,
                      TOPK: tl.constexpr, STAGE: tl.constexpr, SHORT: tl.constexpr, RK: tl.constexpr):
    # the spread form's stages (rows of at most SHORT tokens, RK keys a tile): STAGE 0 radix pass
    # 0 and the fine histograms (tkh, tkf zero before), 1 the threshold, 2 the write; 3 the
    # threshold and the write in one stage (`topk_spread_select`, after stage 0)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if STAGE == 0:
        topk_hist_tiles(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, W, TOPK, TKC, tkf_ptr)
    elif STAGE == 1:
        topk_spread_threshold(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkf_ptr, W, TOPK, SHORT, RK)
    elif STAGE == 2:
        topk_spread_write(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, topk_ptr, W, TOPK, SHORT, RK)
    else:
        topk_spread_select(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkf_ptr, topk_ptr, W, TOPK, SHORT,
                           RK)


@triton.jit
def topk_first_entry(scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, W: tl.constexpr, TOPK: tl.constexpr,
                     TB: tl.constexpr):
    """The top-k's first radix pass run the way a producer of the scores runs it
    (`topk_hist_first`), one (row, TB-score tile) a tile over the rows' tiles."""
    topk_hist_tiles(tl.program_id(0), tl.num_programs(0), scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, W, TOPK, TB)


@triton.jit
def routing_entry(lg_ptr, bias_ptr, w_ptr, used_ptr, live_ptr, W: tl.constexpr, BM: tl.constexpr, E: tl.constexpr,
                  TOPE: tl.constexpr, KSR: tl.constexpr, LIVE: tl.constexpr = False):
    rows = tl.arange(0, BM)
    if LIVE:
        live = tl.load(live_ptr + rows, mask=rows < W, other=0) != 0
        wmat, used = biased_topk(lg_ptr, bias_ptr, W, BM, E, TOPE, KSR, live)
    else:
        wmat, used = biased_topk(lg_ptr, bias_ptr, W, BM, E, TOPE, KSR)
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


# The slots of `moe_entry`'s pointer table (int64 each): every tensor of the stage, the lists,
# shared experts, slot tables and outputs of L steps back to back (`stages.moe_host`).
(MOE_IDS, MOE_WTS, MOE_XQ, MOE_XS, MOE_W13, MOE_S13, MOE_W2, MOE_S2, MOE_WSH13, MOE_SSH13, MOE_WSH2, MOE_SSH2,
 MOE_GU, MOE_INTER, MOE_INTERS, MOE_SLOT_E, MOE_SLOT_W, MOE_NSLOT, MOE_OUT, MOE_BAR, MOE_Z,
 MOE_DCNT) = (tl.constexpr(i) for i in range(22))
MOE_NPTR = 22
# The slots read at any element offset (single words: nothing to vectorise, no alignment hint)
MOE_UNALIGNED = (MOE_IDS.value, MOE_WTS.value, MOE_SLOT_E.value, MOE_SLOT_W.value, MOE_NSLOT.value)


@triton.jit
def _tp(tab, slot: tl.constexpr, dt: tl.constexpr, ALIGNED: tl.constexpr = True):
    """Pointer `slot` of the table as a pointer to dt, 16-byte aligned unless told (the host
    checks it): what Triton assumes of an aligned pointer argument. Loaded (volatile) where a
    stage uses it, so it is live for that stage only."""
    p = tl.load(tab + slot, volatile=True).to(tl.pointer_type(dt))
    if ALIGNED:
        p = tl.multiple_of(p, 16)
    return p


@triton.jit
def _moe_step(tab, li, arrived, routed_scale,
              W: tl.constexpr, BM: tl.constexpr, WP2: tl.constexpr, H: tl.constexpr, E: tl.constexpr,
              K: tl.constexpr, I: tl.constexpr, BN: tl.constexpr, BND: tl.constexpr, BI: tl.constexpr,
              BLK: tl.constexpr, KSG: tl.constexpr, NSLOT: tl.constexpr, FIRST: tl.constexpr,
              LAST: tl.constexpr, BAR: tl.constexpr, SPAN: tl.constexpr = False, PER: tl.constexpr = 1,
              DSTG: tl.constexpr = 0, FASTCVT: tl.constexpr = False, DSTEP: tl.constexpr = 1,
              GDOT: tl.constexpr = 0, GSTG: tl.constexpr = 0, IDV: tl.constexpr = False,
              DIT: tl.constexpr = False, DDOT: tl.constexpr = 0):
    """Step li of `moe_entry`; `arrived`: the hand-off count so far (returned updated)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    sh13_l: tl.constexpr = 2 * I * H
    ss13_l: tl.constexpr = ((2 * I + BLK - 1) // BLK) * ((H + BLK - 1) // BLK)
    sh2_l: tl.constexpr = H * I
    ss2_l: tl.constexpr = ((H + BLK - 1) // BLK) * ((I + BLK - 1) // BLK)
    f32: tl.constexpr = tl.float32
    i32: tl.constexpr = tl.int32
    u8: tl.constexpr = tl.uint8
    # FASTCVT CVT_F16: the quantised x and SiLU output as f16 (`moe_host.pointer_table`)
    xdt: tl.constexpr = tl.float16 if FASTCVT == CVT_F16 else tl.bfloat16
    l64 = tl.cast(li, tl.int64)  # L shared experts pass 2^31 bytes
    se = _tp(tab, MOE_SLOT_E, i32, False) + li * NSLOT
    sw = _tp(tab, MOE_SLOT_W, f32, False) + li * (W * NSLOT)
    ns = _tp(tab, MOE_NSLOT, i32, False) + li
    if FIRST == 0:
        # every program reads the lists itself, so gate_up needs no hand-off after routing
        wmat, used = slot_lists(_tp(tab, MOE_IDS, i32, False) + li * (W * K),
                                _tp(tab, MOE_WTS, f32, False) + li * (W * K), W, WP2, E, K)
        csum, nu = fill_slots(pid, wmat, used, se, sw, ns, W, WP2, E, NSLOT)
        moe_gateup(pid, nprog, used, csum, nu, _tp(tab, MOE_XQ, xdt), _tp(tab, MOE_XS, f32),
                   _tp(tab, MOE_W13, u8), _tp(tab, MOE_S13, f32), _tp(tab, MOE_WSH13, u8) + l64 * sh13_l,
                   _tp(tab, MOE_SSH13, f32) + l64 * ss13_l, _tp(tab, MOE_GU, f32), W, BM, H, E, I, BN, BLK, KSG,
                   NSLOT, SPAN, PER, FASTCVT, GDOT, GSTG)
    if FIRST <= 0 and LAST >= 1:
        arrived += nprog
        grid_handoff(_tp(tab, MOE_BAR, i32), arrived)
    if FIRST <= 1 and LAST >= 1:
        moe_silu(pid, nprog, _tp(tab, MOE_GU, f32), _tp(tab, MOE_INTER, xdt), _tp(tab, MOE_INTERS, f32),
                 ns, W, I, KSG, BI, NSLOT, BLK)
    if FIRST <= 1 and LAST >= 2:
        arrived += nprog
        grid_handoff(_tp(tab, MOE_BAR, i32), arrived)
    if LAST == 2 and DIT:
        moe_down_items(pid, nprog, _tp(tab, MOE_INTER, xdt), _tp(tab, MOE_INTERS, f32), _tp(tab, MOE_W2, u8),
                       _tp(tab, MOE_S2, f32), _tp(tab, MOE_WSH2, u8) + l64 * sh2_l,
                       _tp(tab, MOE_SSH2, f32) + l64 * ss2_l, se, sw, ns, _tp(tab, MOE_Z, tl.bfloat16),
                       _tp(tab, MOE_DCNT, i32), _tp(tab, MOE_OUT, tl.bfloat16) + l64 * (W * H), routed_scale, W, BM,
                       H, I, BND, BLK, NSLOT, DSTG, FASTCVT, DDOT=DDOT)
    if LAST == 2 and not DIT:
        moe_down(pid, nprog, _tp(tab, MOE_INTER, xdt), _tp(tab, MOE_INTERS, f32), _tp(tab, MOE_W2, u8),
                 _tp(tab, MOE_S2, f32), _tp(tab, MOE_WSH2, u8) + l64 * sh2_l, _tp(tab, MOE_SSH2, f32) + l64 * ss2_l,
                 se, sw, ns, _tp(tab, MOE_OUT, tl.bfloat16) + l64 * (W * H), routed_scale, W, BM, H, I, BND, BLK,
                 NSLOT, DSTG, FASTCVT, DSTEP, IDV)
    if BAR:
        arrived += nprog
        grid_handoff(_tp(tab, MOE_BAR, i32), arrived)
    return arrived


@triton.jit
def moe_entry(tab, routed_scale, L0, L,
              W: tl.constexpr, BM: tl.constexpr, WP2: tl.constexpr, H: tl.constexpr, E: tl.constexpr,
              K: tl.constexpr, I: tl.constexpr, BN: tl.constexpr, BND: tl.constexpr, BI: tl.constexpr,
              BLK: tl.constexpr, KSG: tl.constexpr, NSLOT: tl.constexpr, FIRST: tl.constexpr,
              LAST: tl.constexpr, BAR: tl.constexpr, SPAN: tl.constexpr = False, PER: tl.constexpr = 1,
              DSTG: tl.constexpr = 0, FASTCVT: tl.constexpr = False, DSTEP: tl.constexpr = 1,
              GDOT: tl.constexpr = 0, GSTG: tl.constexpr = 0, IDV: tl.constexpr = False,
              DIT: tl.constexpr = False, DDOT: tl.constexpr = 0):
    """Stages FIRST..LAST of `stages.moe` (0 gate_up, 1 SiLU, 2 down) for steps L0..L0+L-1.
    Step l reads its lists ids / wts [l] [W, K], the routed experts they name from the one pool
    w13 / w2 (lists naming other experts each step rotate the reads through it) and its own
    shared expert wsh13 / wsh2 [l]; it writes its own slot tables and out [l]; the scratch
    (gu, inter) is shared. Consecutive stages are linked by grid hand-offs (every program must
    be resident); one launch a stage needs none (the interpreter's mode). BAR adds one after
    each step's down. The tensors come in a pointer table (`MOE_*` slots), as the layer's do:
    as twenty pointer arguments they would hold gfx950's scalar registers through every stage.
    SPAN / PER: gate_up as stream-K spans (`stages.moe.moe_gateup`), a bench variant. DSTG:
    down's slot loop pipelined DSTG deep, DSTEP slots an iteration; FASTCVT: e4m3 weights
    converted on sm_90's integer and bf16 pipes (1), or to f16 for f16 MMAs (2, the quantised
    x and SiLU output then f16 too); GDOT / GSTG: gate_up's MMA form and k-loop
    depth; IDV: down's pipelined loop picks the expert ids from registers (`stages.moe`); DIT:
    down as items (`stages.moe.moe_down_items`, DSTG its loop's depth, DDOT its MMA form)."""
    arrived = tl.program_id(0) * 0  # an int32 tensor: a loop-carried value keeps one type
    # no loop-invariant code motion: the lane masks and offsets of the three stages do not
    # change from step to step, and hoisted out of the loop they held gfx950's scalar registers
    # through every stage (40 SGPR spills at the TP8 rank shape, 2 rows)
    for li in tl.range(L0, L0 + L, disable_licm=True):
        arrived = _moe_step(tab, li, arrived, routed_scale, W, BM, WP2, H, E, K, I, BN, BND, BI, BLK, KSG, NSLOT,
                            FIRST, LAST, BAR, SPAN, PER, DSTG, FASTCVT, DSTEP, GDOT, GSTG, IDV, DIT, DDOT)
