"""GEMV tiles over block-scaled weights: out[:W] = x[:W] @ w^T for decode steps of 1-16 rows.

Layouts (row-major, as SGLang leaves a block-FP8 linear after loading on CUDA):
  x    [W, K] bf16 (row stride sx); or pre-quantised (XQ): e4m3 values held as bf16 (as f16 with
       FASTCVT CVT_F16) at x_ptr and fp32 scales xs [W, K // BLK] (`numerics.quant_blocks`,
       SGLang's per_token_group_quant)
  w    [N, K]: FMT_FP8 e4m3 bits as uint8 with fp32 block scales s [cdiv(N, BLK), K // BLK];
       FMT_BF16 bf16 (s unused). MXFP4 is a third format to add here (its scale gather differs).
  out  fp32 partial sums [SLOTS, W, NSTR]: the consumer adds the SLOTS partials of a column in
       slot order (`sum_slots`), so results never depend on timing or on the compiled layout.

Numerics: per K block, dot(xq, w^T) of e4m3 values in bf16 (exact products, fp32 accumulation
on tensor cores) times s_x[row, kb] * s_w[col // BLK, kb], summed over blocks in K order, as
SGLang's block FP8 GEMM (DeepGEMM / triton_w8a8_block_fp8_linear). W rows are padded to
BM >= 16 for tl.dot (rows past W are masked: zeros in, nothing out).

Two ways to split the work over the resident programs:
  * `gemv_tile` (split-K): tile t = (column tile t // KS, K slice t % KS); partial slot = slice.
  * `gemv_span` (stream-K): the (column tile, K block) items are cut into equal spans of `PER`
    items, one span a program, so every program reads the same bytes whatever N and K are; a
    column tile's partials go to slot (program - first program touching that tile). Slots no
    program writes stay as allocated (zero), so the consumer sums a fixed count of slots.
  * `gemv_span_call`: `gemv_span` as a call of one copy of its code, its shapes runtime values,
    so the GEMVs of a kernel that share its constexprs share the code a launch fetches.
  * `gemv_span_pair`: two GEMVs over the same x, each in its own spans, as one loop (one copy
    of the span's code in the program that runs both).
  * `gemv_span_joint`: two GEMVs over the same x as one stream-K GEMV over both's column tiles
    (longer spans where each alone gives a program one or two items; each tile's partials in
    its own GEMV's buffer).
A column tile is BN columns (a multiple of 16, BN <= 2 * BLK: each K step loads a [BN, BLK]
weight block, BN * BLK bytes in flight per program per step for FP8). PRE issues the next
block's weight load before the current block's math (a register double buffer), so two blocks
are in flight. LSTG pipelines the k-loop with every load (`_kloop`); FASTCVT converts the bf16
MMA forms' e4m3 weights on sm_90's integer and bf16 pipes (`numerics.e4m3_bf16`).
"""

import triton
import triton.language as tl

from mono_common.device.guard import arrive_last
from mono_common.stages.numerics import CVT_F16, dot, dot_as, dot_fp8, e4m3_operand, quant_rows

FMT_BF16 = tl.constexpr(0)
FMT_FP8 = tl.constexpr(1)
# The MMA's operand order: x [BM, BLK] @ w^T (rows padded to BM >= 16 on the M side), or
# swap-AB w [BN, BLK] @ x^T (columns on the M side, rows on N), in bf16 or, for FP8 weights,
# with both operands e4m3 (FP8 tensor cores; their in-block accumulation is not exact fp32).
DOT_XW = tl.constexpr(0)
DOT_WX = tl.constexpr(1)
DOT_WX_FP8 = tl.constexpr(2)


@triton.jit
def _load_w(w_ptr, cols, cmask, kb, K, BLK: tl.constexpr, FMT: tl.constexpr, ok=True):
    kk = tl.arange(0, BLK)
    wp = w_ptr + cols[:, None].to(tl.int64) * K + (kb * BLK + kk)[None, :]
    if FMT == FMT_FP8:
        w = tl.load(wp, mask=cmask[:, None] & ok, other=0)
    else:
        w = tl.load(wp, mask=cmask[:, None] & ok, other=0.0)
    return w


@triton.jit
def _kblock(acc, w, kb, x_ptr, sx, xs_ptr, s_ptr, cols, cmask, rows, rmask,
            K, BM: tl.constexpr, BLK: tl.constexpr, FMT: tl.constexpr, XQ: tl.constexpr,
            DOT: tl.constexpr, FASTCVT: tl.constexpr = False, HWX: tl.constexpr = False):
    """acc += the contribution of K block kb, its weight block w [BN, BLK] loaded. acc is
    [BM, BN] for DOT_XW, [BN, BM] for the swapped forms (weights as the MMA's M side).
    FASTCVT: the bf16 MMA forms convert the e4m3 weights with `numerics.e4m3_bf16`'s sm_90 path
    (True / 1), or CVT_F16: to f16 on the conversion unit, and the MMA on f16 operands
    (`numerics.e4m3_operand` / `dot_as`: the same exact products). HWX (sm_90, without XQ): x's
    e4m3 rounding on the conversion unit (`numerics.quant_rows` HW: the same bits)."""
    NKB = K // BLK
    kk = tl.arange(0, BLK)
    x = tl.load(x_ptr + rows[:, None] * sx + (kb * BLK + kk)[None, :], mask=rmask[:, None], other=0.0)
    if FMT == FMT_FP8:
        sw = tl.load(s_ptr + (cols // BLK) * NKB + kb, mask=cmask, other=0.0)
        if XQ:
            sxq = tl.load(xs_ptr + rows * NKB + kb, mask=rmask, other=0.0)
            # CVT_F16: the producer stored the values as f16 (exact: e4m3 values), as dot_as takes them
            xq = x if FASTCVT == CVT_F16 else x.to(tl.bfloat16)
        else:
            xq, sxq = quant_rows(x.to(tl.float32), BM, HWX)
        if DOT == DOT_XW:
            acc += dot_as(xq, tl.trans(e4m3_operand(w, FASTCVT)), FASTCVT) * (sxq[:, None] * sw[None, :])
        elif DOT == DOT_WX:
            acc += dot_as(e4m3_operand(w, FASTCVT), tl.trans(xq), FASTCVT) * (sw[:, None] * sxq[None, :])
        else:
            acc += dot_fp8(w, tl.trans(xq)) * (sw[:, None] * sxq[None, :])
    else:
        if DOT == DOT_XW:
            acc += dot(x.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
        else:
            acc += dot(w.to(tl.bfloat16), tl.trans(x.to(tl.bfloat16)))
    return acc


@triton.jit
def _kloop(acc, kb0, kb1, x_ptr, sx, xs_ptr, w_ptr, s_ptr, cols, cmask, rows, rmask,
           K, BM: tl.constexpr, BLK: tl.constexpr, FMT: tl.constexpr,
           XQ: tl.constexpr, PRE: tl.constexpr, DOT: tl.constexpr, LSTG: tl.constexpr = 0,
           FASTCVT: tl.constexpr = False, HWX: tl.constexpr = False):
    """acc += K blocks kb0 .. kb1-1 of one column tile, in K order. LSTG > 0 (not with PRE):
    the loop is pipelined LSTG deep with all its loads (without it Triton pipelines only the
    MMA operands, so the scales, and an x quantised in the loop, cost one memory round trip a
    K block; measured at GLM-5.3's dense shapes it gained nothing: `bench.stages` s128fql)."""
    if PRE:
        wn = _load_w(w_ptr, cols, cmask, kb0, K, BLK, FMT)
        for kb in range(kb0, kb1):
            w = wn
            wn = _load_w(w_ptr, cols, cmask, kb + 1, K, BLK, FMT, kb + 1 < kb1)
            acc = _kblock(acc, w, kb, x_ptr, sx, xs_ptr, s_ptr, cols, cmask, rows, rmask, K, BM, BLK, FMT, XQ, DOT,
                          FASTCVT, HWX)
    else:
        # an explicit depth makes Triton pipeline every load of the loop (scales and an x that is
        # quantised here included), not only the MMA operands (sm_90 TTGIR, Triton 3.6 and 3.8);
        # None leaves the loop as a plain range
        for kb in tl.range(kb0, kb1, num_stages=LSTG if LSTG > 0 else None):
            w = _load_w(w_ptr, cols, cmask, kb, K, BLK, FMT)
            acc = _kblock(acc, w, kb, x_ptr, sx, xs_ptr, s_ptr, cols, cmask, rows, rmask, K, BM, BLK, FMT, XQ, DOT,
                          FASTCVT, HWX)
    return acc


@triton.jit
def _zero_acc(BM: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr):
    if DOT == DOT_XW:
        acc = tl.zeros([BM, BN], tl.float32)
    else:
        acc = tl.zeros([BN, BM], tl.float32)
    return acc


@triton.jit
def _store(o_ptr, acc, rows, rmask, cols, cmask, NSTR, DOT: tl.constexpr):
    """acc -> o[row, col] (row stride NSTR), transposed back for the swapped forms."""
    if DOT == DOT_XW:
        tl.store(o_ptr + rows[:, None] * NSTR + cols[None, :], acc, mask=rmask[:, None] & cmask[None, :])
    else:
        tl.store(o_ptr + rows[None, :] * NSTR + cols[:, None], acc, mask=rmask[None, :] & cmask[:, None])


@triton.jit
def gemv_tile(t, x_ptr, sx, w_ptr, s_ptr, out_ptr, N, NSTR: tl.constexpr, K: tl.constexpr,
              W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BLK: tl.constexpr,
              KS: tl.constexpr, FMT: tl.constexpr, xs_ptr=None, XQ: tl.constexpr = False,
              PRE: tl.constexpr = False, DOT: tl.constexpr = 0, LSTG: tl.constexpr = 0,
              FASTCVT: tl.constexpr = False, HWX: tl.constexpr = False):
    """Split-K tile t: out[t % KS, :W, column tile t // KS] = the K slice t % KS of x @ w^T.
    LSTG: the k-loop's pipelining depth (`_kloop`); FASTCVT, HWX: `_kblock`'s."""
    nt = t // KS
    ks = t % KS
    NKS: tl.constexpr = K // BLK // KS
    rows = tl.arange(0, BM)
    cols = nt * BN + tl.arange(0, BN)
    rmask = rows < W
    cmask = cols < N
    acc = _zero_acc(BM, BN, DOT)
    acc = _kloop(acc, ks * NKS, ks * NKS + NKS, x_ptr, sx, xs_ptr, w_ptr, s_ptr, cols, cmask, rows, rmask,
                 K, BM, BLK, FMT, XQ, PRE, DOT, LSTG, FASTCVT, HWX)
    _store(out_ptr + ks * (W * NSTR), acc, rows, rmask, cols, cmask, NSTR, DOT)


@triton.jit
def _span_bounds(p, PER, items, W: tl.constexpr, BM: tl.constexpr):
    """Span p's first item and the item after its last (of `items` in all), and the rows."""
    i0 = p * PER
    rows = tl.arange(0, BM)
    return i0, tl.minimum(i0 + PER, items), rows, rows < W


@triton.jit
def _span_segment(p, i, i1, x_ptr, sx, xs_ptr, w_ptr, s_ptr, out_ptr, N, NSTR, PER, K, rows, rmask,
                  W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BLK: tl.constexpr, FMT: tl.constexpr,
                  XQ: tl.constexpr, PRE: tl.constexpr, DOT: tl.constexpr, LSTG: tl.constexpr,
                  FASTCVT: tl.constexpr, HWX: tl.constexpr):
    """One segment of span p (spans of PER items, the span ending at item i1): from item i to the
    end of its column tile or of the span, summed in K order into the tile's partial slot p -
    first(tile) of out [SLOTS, W, NSTR]. Returns (the tile, the K block after the segment's)."""
    NKB = K // BLK
    nt = i // NKB
    kb1 = tl.minimum(i1 - nt * NKB, NKB)
    cols = nt * BN + tl.arange(0, BN)
    cmask = cols < N
    acc = _zero_acc(BM, BN, DOT)
    acc = _kloop(acc, i - nt * NKB, kb1, x_ptr, sx, xs_ptr, w_ptr, s_ptr, cols, cmask, rows, rmask,
                 K, BM, BLK, FMT, XQ, PRE, DOT, LSTG, FASTCVT, HWX)
    slot = p - (nt * NKB) // PER
    _store(out_ptr + slot * (W * NSTR), acc, rows, rmask, cols, cmask, NSTR, DOT)
    return nt, kb1


@triton.jit
def gemv_span(p, x_ptr, sx, w_ptr, s_ptr, out_ptr, N, NSTR, K,
              W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BLK: tl.constexpr,
              PER, FMT: tl.constexpr, xs_ptr=None, XQ: tl.constexpr = False,
              PRE: tl.constexpr = False, DOT: tl.constexpr = 0, LSTG: tl.constexpr = 0,
              FASTCVT: tl.constexpr = False, fix_ptr=None, epoch=0, KSF: tl.constexpr = 0,
              HWX: tl.constexpr = False):
    """Stream-K span p: items [p * PER, (p + 1) * PER) of the (column tile, K block) items in
    tile-major order; each column tile it touches gets one partial in slot p - first(tile).
    LSTG, FASTCVT, HWX: as `gemv_tile`'s. KSF > 0: after each partial the span arrives on its
    tile's counter (fix_ptr[tile], int32); the tile's last span (`span_fixup`) sums the tile's
    KSF slots in slot order into slot 0, so a consumer reads one slot, not KSF."""
    NKB = K // BLK
    i, i1, rows, rmask = _span_bounds(p, PER, (N + BN - 1) // BN * NKB, W, BM)
    while i < i1:
        nt, kb1 = _span_segment(p, i, i1, x_ptr, sx, xs_ptr, w_ptr, s_ptr, out_ptr, N, NSTR, PER, K, rows, rmask,
                                W, BM, BN, BLK, FMT, XQ, PRE, DOT, LSTG, FASTCVT, HWX)
        if KSF > 0:
            # the spans that touch tile nt: its first K block's span to its last one's (the
            # host's count is `tile_spans`)
            nspan = ((nt + 1) * NKB - 1) // PER - (nt * NKB) // PER + 1
            span_fixup(fix_ptr + nt, epoch * nspan, out_ptr, nt * BN, N, NSTR, W, BN, KSF)
        i = nt * NKB + kb1


@triton.jit
def gemv_span_pair(p, x_ptr, sx, xs_ptr, K,
                   wa_ptr, sa_ptr, oa_ptr, NA, PERA,
                   wb_ptr, sb_ptr, ob_ptr, NB, PERB,
                   W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BLK: tl.constexpr,
                   FMT: tl.constexpr, XQ: tl.constexpr = False, DOT: tl.constexpr = 0,
                   LSTG: tl.constexpr = 0, FASTCVT: tl.constexpr = False, HWX: tl.constexpr = False):
    """Two GEMVs over the same x [W, K] (xs, XQ: as `gemv_span`'s): A [NA, K] (weights wa,
    scales sa, partials oa [SLOTS, W, NA]) in spans of PERA items and B [NB, K] likewise in spans
    of PERB, program p running its span of A then its span of B as `gemv_span` twice would, in
    one loop over both spans' segments: each segment's weights, scales, partials and column
    count selected at run time, so a launch runs one copy of the span's code, not two. The
    same partials in the same slots, so the same bits as the two calls."""
    NKB = K // BLK
    a0, a1, rows, rmask = _span_bounds(p, PERA, (NA + BN - 1) // BN * NKB, W, BM)
    b0, b1, _, _ = _span_bounds(p, PERB, (NB + BN - 1) // BN * NKB, W, BM)
    na = tl.maximum(a1 - a0, 0)
    nall = na + tl.maximum(b1 - b0, 0)
    j = 0
    while j < nall:
        in_a = j < na
        i = tl.where(in_a, a0 + j, b0 + j - na)
        n = tl.where(in_a, NA, NB)
        nt, kb1 = _span_segment(p, i, tl.where(in_a, a1, b1), x_ptr, sx, xs_ptr, tl.where(in_a, wa_ptr, wb_ptr),
                                tl.where(in_a, sa_ptr, sb_ptr), tl.where(in_a, oa_ptr, ob_ptr), n, n,
                                tl.where(in_a, PERA, PERB), K, rows, rmask, W, BM, BN, BLK, FMT, XQ, False, DOT,
                                LSTG, FASTCVT, HWX)
        j += nt * NKB + kb1 - i


@triton.jit
def gemv_span_joint(p, x_ptr, sx, xs_ptr, K,
                    wa_ptr, sa_ptr, oa_ptr, NA: tl.constexpr,
                    wb_ptr, sb_ptr, ob_ptr, NB: tl.constexpr, PER,
                    W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BLK: tl.constexpr,
                    FMT: tl.constexpr, XQ: tl.constexpr = False, DOT: tl.constexpr = 0,
                    LSTG: tl.constexpr = 0, FASTCVT: tl.constexpr = False, HWX: tl.constexpr = False):
    """Two GEMVs over the same x [W, K] as one stream-K GEMV: A's column tiles [NA, K] then B's
    [NB, K], their (column tile, K block) items cut into one span of PER items a program. Each
    tile's partials go to its own GEMV's buffer (oa [SLOTS, W, NA], ob [SLOTS, W, NB]), slot
    (program - first program touching the tile) as `gemv_span`'s; B's weights, scales and
    partials are addressed by the joint column number through base pointers moved back by A's
    tiles. Where each GEMV's own spans are one or two items a program (GLM-5.3's TP8 q_b and
    wq_b: `gemv_span_pair`'s PER 1 and 2, two loops of one round trip each), the joint spans are
    PER 3 items of one K loop that Triton pipelines, and each tile gets fewer partial slots
    (`span_slots` of the joint PER), so its consumer sums fewer: other sums of the same
    products than the two GEMVs' own spans."""
    tl.static_assert(BN % BLK == 0, "B's scale rows start at a block: BN a multiple of BLK")
    NKB = K // BLK
    NTA: tl.constexpr = (NA + BN - 1) // BN
    NT: tl.constexpr = NTA + (NB + BN - 1) // BN
    i, i1, rows, rmask = _span_bounds(p, PER, NT * NKB, W, BM)
    while i < i1:
        in_a = i < NTA * NKB
        # a segment ends at its tile's end or the span's, never past A's last tile
        nt, kb1 = _span_segment(p, i, i1, x_ptr, sx, xs_ptr, tl.where(in_a, wa_ptr, wb_ptr - NTA * BN * K),
                                tl.where(in_a, sa_ptr, sb_ptr - NTA * (BN // BLK) * NKB),
                                tl.where(in_a, oa_ptr, ob_ptr - NTA * BN), tl.where(in_a, NA, NTA * BN + NB),
                                tl.where(in_a, NA, NB), PER, K, rows, rmask, W, BM, BN, BLK, FMT, XQ, False, DOT,
                                LSTG, FASTCVT, HWX)
        i = nt * NKB + kb1


@triton.jit(noinline=True)
def _span_called(p, x_ptr, sx, w_ptr, s_ptr, out_ptr, N, NSTR, K, PER, xs_ptr,
                 W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BLK: tl.constexpr, FMT: tl.constexpr,
                 XQ: tl.constexpr, DOT: tl.constexpr, FASTCVT: tl.constexpr):
    gemv_span(p, x_ptr, sx, w_ptr, s_ptr, out_ptr, N, NSTR, K, W, BM, BN, BLK, PER, FMT, xs_ptr, XQ, False, DOT, 0,
              FASTCVT)


@triton.jit
def gemv_span_call(p, x_ptr, sx, w_ptr, s_ptr, out_ptr, N, NSTR, K, W: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr, BLK: tl.constexpr, PER, FMT: tl.constexpr, xs_ptr=None, XQ: tl.constexpr = False,
                   DOT: tl.constexpr = 0, FASTCVT: tl.constexpr = False):
    """`gemv_span` (no register prefetch, the k-loop as Triton pipelines it, no fixup) as a call
    of ONE copy of its code whose shapes (sx, N, NSTR, K, PER) are runtime values: the GEMVs of
    a kernel that share W, BM, BN, BLK, FMT, XQ, DOT and FASTCVT share its code, so a launch
    that runs several of them fetches it once (a stream-K span inlined is ~18 KB of sm_90 SASS
    at GLM-5.3's shapes, fetched cold at each call site at 1 row: ~0.3 us a KB). The same sums
    in the same order as `gemv_span`. Without XQ, xs_ptr is not read (x_ptr stands in)."""
    zero = tl.zeros([], tl.int32)
    _span_called(p, x_ptr, sx + zero, w_ptr, s_ptr, out_ptr, N + zero, NSTR + zero, K + zero, PER + zero,
                 xs_ptr if XQ else x_ptr, W, BM, BN, BLK, FMT, XQ, DOT, FASTCVT)


@triton.jit
def span_fixup(cnt_ptr, target, out_ptr, col0, N, NSTR, W: tl.constexpr, BN: tl.constexpr,
               KSF: tl.constexpr):
    """Arrive on a column tile's counter (int32, + 1 a partial); the arrival that makes it
    `target` (modulo 2**32: epoch times the tile's spans, so the counter never resets) sums the
    tile's KSF partial slots of out [KSF, W, NSTR], columns col0..col0+BN, in slot order from
    zero (the bits a consumer's `sum_slots` would get) and writes the sum to slot 0. The one
    RMW is acq_rel: the other spans released their partials with theirs, and its acquire
    (with the barrier after it) orders this program's reads of them. Slots no span wrote
    hold zero (the buffer's allocation), as for `sum_slots`."""
    if arrive_last(cnt_ptr, target, False):
        tl.debug_barrier()
        c = col0 + tl.arange(0, BN)
        cm = c < N
        for m in range(W):
            base = out_ptr + m * NSTR + c
            acc = tl.zeros([BN], tl.float32)
            # every slot's load in flight together (a [BN] vector a slot: one register a thread
            # at 4 warps), the adds in slot order
            for sl in tl.static_range(KSF):
                acc += tl.load(base + sl * (W * NSTR), mask=cm, other=0.0)
            tl.store(base, acc, mask=cm)


KS_RULES = ("first", "balanced")


def pick_split_k(ntiles: int, kblocks: int, target: int, cap: int = 16, rule: str = "first") -> int:
    """The split-K factor (a divisor of the K blocks, at most cap) of a GEMV of `ntiles`
    column tiles on `target` programs (host-side). "first": the smallest giving >= target
    tiles. "balanced": the one whose busiest program runs the fewest K blocks (ceil(tiles /
    target) tiles of kblocks / ks blocks each), the fewest tiles among equals (fewer partials)."""
    if rule not in KS_RULES:
        raise ValueError(f"split-K rule {rule!r} is not one of {KS_RULES}")
    divisors = [ks for ks in range(1, min(kblocks, cap) + 1) if kblocks % ks == 0]
    if rule == "balanced":
        return min(divisors, key=lambda ks: (-(-ntiles * ks // max(1, target)) * (kblocks // ks), ks))
    best = 1
    for ks in divisors:
        best = ks
        if ntiles * ks >= target:
            break
    return best


def span_per(N: int, K: int, BN: int, BLK: int, nprog: int) -> int:
    """`gemv_span`'s PER (host-side): the (column tile, K block) items of an [N, K] GEMV in
    BN-column tiles, cut into one equal span per program."""
    items = -(-N // BN) * (K // BLK)
    return -(-items // nprog)


def tile_spans(tile: int, K: int, BLK: int, PER: int) -> int:
    """The spans of `gemv_span` that touch column tile `tile` (host-side): what a
    `span_fixup` counter gains a launch."""
    nkb = K // BLK
    return ((tile + 1) * nkb - 1) // PER - (tile * nkb) // PER + 1


def span_slots(K: int, BLK: int, PER: int) -> int:
    """Partial slots a column tile can receive under `gemv_span`: the spans one tile of K // BLK
    items can touch (host-side, for sizing the partial buffer)."""
    nkb = K // BLK
    return -(-(nkb - 1) // PER) + 1 if PER < nkb else 2


@triton.jit
def sum_slots(p_ptr, row, col0, W: tl.constexpr, NSTR: tl.constexpr, SLOTS: tl.constexpr,
              D: tl.constexpr, GROUP: tl.constexpr = 0):
    """Sum the SLOTS partials of out[row, col0:col0+D] in slot order (deterministic).

    The loads go in groups of G slots unrolled (G * D <= 4096 values: ~32 registers a thread
    at 4 warps), so a group's loads are in flight together and the stage pays SLOTS / G memory
    latencies, not SLOTS (one load an iteration cost ~0.5 us each, which made single-program
    consumers such as a row's norm take ~10 us in the layer: H200 stamps, session 12; a whole
    unroll of 13 x 2048 values spilled on sm_90 and gfx950). The adds still run in slot order.
    The slots past the last whole group are one more unrolled group, not masked loads (a
    masked group's per-slot predicates spilled gfx950's scalar registers). Rows narrower than
    1024 values are summed one slot an iteration: unrolled, their loads' scalar address terms
    spilled gfx950's SGPRs in the GLM-5.3 layer (a TP8 rank at 8 rows). GROUP > 0 sets the
    group size instead (a caller that knows its ISA has the registers)."""
    G: tl.constexpr = min(SLOTS, GROUP) if GROUP > 0 else (1 if D < 1024 else max(1, min(SLOTS, 4096 // D)))
    FULL: tl.constexpr = SLOTS - SLOTS % G
    c = tl.arange(0, D)
    base = p_ptr + row * NSTR + col0 + c
    acc = tl.zeros([D], tl.float32)
    for s0 in range(0, FULL, G):
        for g in tl.static_range(G):
            acc += tl.load(base + (s0 + g) * (W * NSTR))
    for g in tl.static_range(SLOTS % G):
        acc += tl.load(base + (FULL + g) * (W * NSTR))
    return acc
