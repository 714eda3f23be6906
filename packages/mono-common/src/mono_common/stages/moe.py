"""MoE expert GEMV over expert slots: gate_up, SiLU-and-mul, down, for decode steps of 1-8 rows.

A step's experts are its SLOTS: slot 0 is the shared expert, slots 1..nu the routed experts any
row selected, in expert-id order, each computed once for all rows; a row's routing weight per
slot is 0 where it did not select that expert. Any routing fills them: biased top-k
(`stages.routing.biased_topk`) or hash routing, through its per-row weights [BM, E] and the
0/1 vector `used` [E] (`slot_lists` makes both from per-row (expert id, weight) lists).

Layouts (row-major, as SGLang leaves block-FP8 experts after loading on CUDA; BLK = 128):
  x     [W, H] quantised by the caller per BLK group (`numerics.quant_blocks`, SGLang's
        per_token_group_quant): e4m3 values held as bf16 (xq) and fp32 scales xs [W, H // BLK]
  w13   [E, 2I, H] e4m3 bits as uint8 (gate rows 0..I-1, up rows I..2I-1), scales s13 [E,
        cdiv(2I, BLK), H // BLK] fp32; the shared expert's wsh13 [2I, H] / ssh13 apart
  w2    [E, H, I] e4m3 bits as uint8, scales s2 [E, cdiv(H, BLK), cdiv(I, BLK)] fp32; wsh2 / ssh2
  slot tables, written by `fill_slots` (program 0), read after a hand-off:
        slot_e [NSLOT] int32 expert id of slot u >= 1; slot_w [W, NSLOT] fp32 each row's routing
        weight of slot u; nslot [1] int32 = 1 + nu (slots in use). NSLOT >= 1 + min(E, W * top-k).
  gu    [NSLOT, KSG, W, 2I] fp32 gate_up split-K partials (slot-major); under SPAN the
        stream-K span partials, KSG of them a column tile (unwritten ones stay zero)
  inter [NSLOT, W, I] SiLU(g) * u quantised for down (e4m3 values as bf16), inters [NSLOT, W,
        I // BLK] fp32 scales
  out   [W, H] bf16 = bf16(bf16(sum over routed slots of bf16(y_u * w_u)) * routed_scale) + y_0

What the caller provides: the quantised x, the routing (wmat, used) in every program that runs
`moe_gateup` (so no hand-off separates routing from gate_up), and a hand-off between the three
stages (gate_up -> silu -> down), since each reads what every program of the one before wrote.

Numerics follow SGLang's fused_experts (FP8 block-128 Triton runner) and DeepseekV2MLP: gate_up
GEMM -> bf16, SiLU(g) * u in fp32 rounded once to bf16, requantised per BLK group, down GEMM
-> bf16 per expert, then bf16(y * weight) per slot, an fp32 sum in slot order and one scaling.
Every split-K partial is summed by its consumer in a fixed order, so results never depend on
timing. Reference: `mono_common.ref.moe`.

Loop forms (constexprs, the same sums in the same order): down's slots as one pipelined loop
(DSTG deep, DSTEP slots an iteration), gate_up's MMA form and k-loop depth (GDOT, GSTG), and
the e4m3 weights converted on sm_90's integer and bf16 pipes (FASTCVT True), or to f16 on its
conversion unit for f16 MMAs (FASTCVT `numerics.CVT_F16`: the same exact products). Down as
items (`moe_down_items`: (column tile, slot) items in equal spans, each tile summed by its last
item's program) needs z [NSLOT, W, H] bf16 and int32 column-tile counters [H // BND] besides.
"""

import triton
import triton.language as tl

from mono_common.device.allreduce import allreduce_push
from mono_common.device.guard import arrive_last
from mono_common.stages.gemv import DOT_WX_FP8, FMT_FP8, _kblock, gemv_span, gemv_tile
from mono_common.stages.numerics import bf16r, div_rn, dot_as, e4m3_operand, quant_blocks, rbf
from mono_common.stages.prefetch import prefetch_range


@triton.jit
def slot_lists(ids_ptr, wts_ptr, W: tl.constexpr, BM: tl.constexpr, E: tl.constexpr, K: tl.constexpr):
    """Per-row (expert id, weight) lists ids [W, K] int32 / wts [W, K] fp32 -> (wmat [BM, E]
    fp32, used [E] 0/1): the form `fill_slots` and `moe_gateup` take. An id outside [0, E) is
    an empty entry; an expert listed twice in a row gets one slot with the summed weight. BM: W
    rounded up to a power of two."""
    rows = tl.arange(0, BM)
    e = tl.arange(0, E)
    wmat = tl.zeros([BM, E], tl.float32)
    used = tl.zeros([E], tl.int32)
    # one list entry a step: its id is one scalar for every lane, and its compare a lane mask
    # in scalar registers; comparing a row's or every entry at once held W * K such masks
    # (gfx950 spilled at 8 rows)
    for i in range(W * K):
        ex = tl.load(ids_ptr + i)
        hit = e == ex
        used = tl.where(hit, 1, used)
        wmat = tl.where((rows[:, None] == i // K) & hit[None, :], wmat + tl.load(wts_ptr + i), wmat)
    return wmat, used


@triton.jit
def fill_slots(pid, wmat, used, slot_e_ptr, slot_w_ptr, nslot_ptr,
               W: tl.constexpr, WP2: tl.constexpr, E: tl.constexpr, NSLOT: tl.constexpr):
    """Program 0 writes the slot tables of routing (wmat [WP2, E], used [E]); every program
    gets (csum, nu): the slot of a used expert e is csum[e], nu the routed slots in use."""
    e = tl.arange(0, E)
    csum = tl.cumsum(used, 0)
    nu = tl.sum(used, 0)
    if pid == 0:
        tl.store(slot_e_ptr + csum, e, mask=used != 0)
        rows = tl.arange(0, WP2)
        tl.store(slot_w_ptr + rows[:, None] * NSLOT + csum[None, :], wmat,
                 mask=(used[None, :] != 0) & (rows[:, None] < W))
        tl.store(nslot_ptr, nu + 1)
    return csum, nu


@triton.jit
def prefetch_slots(pid, nprog, used, csum, nu, w_ptr, EB: tl.constexpr, E: tl.constexpr, ON: tl.constexpr,
                   BUDGET: tl.constexpr = 16 << 20):
    """Request the routed slots' expert blocks w[ex] (EB bytes each: one expert of a stacked
    [E, ...] weight) into the L2 as soon as routing is known (`stages.prefetch`; ON False:
    nothing), the first slots up to BUDGET bytes: requesting every slot of a 2-row step (16
    experts, 72 MB of gate_up and down at a TP8 rank) overran the 50 MB L2 and made gate_up
    slower (42 against 34 us, H200 stamps, session 12). Each slot's lines are dealt over every
    program from a rotated first program, so the programs request about equal bytes."""
    if ON:
        e = tl.arange(0, E)
        CH: tl.constexpr = (EB + 16383) // 16384  # one program's 128 lines a step: 16 KB
        MAXS: tl.constexpr = max(1, BUDGET // EB)
        for u in range(1, tl.minimum(nu, MAXS) + 1):
            ex = tl.sum(tl.where((used != 0) & (csum == u), e, 0), 0).to(tl.int64)
            first = (u * CH) % nprog
            prefetch_range((pid + nprog - first) % nprog, nprog, w_ptr + ex * EB, EB, ON)


@triton.jit
def moe_gateup(pid, nprog, used, csum, nu, xq_ptr, xs_ptr, w13_ptr, s13_ptr, wsh13_ptr, ssh13_ptr, gu_ptr,
               W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, E: tl.constexpr, I: tl.constexpr,
               BN: tl.constexpr, BLK: tl.constexpr, KSG: tl.constexpr, NSLOT: tl.constexpr,
               SPAN: tl.constexpr = False, PER: tl.constexpr = 1, FASTCVT: tl.constexpr = False,
               GDOT: tl.constexpr = 0, GSTG: tl.constexpr = 0, fold_ptr=None, inter_ptr=None, inters_ptr=None,
               BI: tl.constexpr = 128, HW: tl.constexpr = False):
    """gate_up of every slot in use: split-K tiles (slot, BN-column tile, K slice) shared among
    the programs, partials to gu. The expert of slot u comes from (used, csum) in registers,
    so no program waits for the slot tables.

    SPAN (a bench variant; on the H200 no faster than the tiles at 2 and 8 rows, and 8.3e-3 off
    the reference with e4m3 MMAs: mono-common 0.1.6-0.1.8 changelogs): each slot's [2I, H] block
    as `gemv_span` stream-K spans of PER (BN-column tile, K block) items, on the pre-quantised x;
    KSG is then the partial slots a column tile can receive (`gemv.span_slots`), which the SiLU
    stage sums as it sums split-K partials. FASTCVT: the tiles convert their e4m3 weights with
    `numerics.e4m3_bf16`'s sm_90 path (the cast's conversion-unit rate bounded the stage).
    GDOT, GSTG: the tiles' (and spans') MMA form (`gemv` DOT_*) and the tiles' k-loop pipelining
    depth with every load (`gemv._kloop` LSTG).

    fold_ptr (tiles only: int32 [NSLOT], zero between launches): the SiLU folded in. Each tile
    arrives on its slot's counter, and the slot's last tile runs `silu_slot` for it (inter,
    inters, BI, HW as `moe_silu`'s) and sets the counter back to zero. So no hand-off and no
    stage of its own is needed between gate_up and SiLU, only one before down. A counter
    counts a launch's NT * KSG tiles of its slot, the slots in use only."""
    e = tl.arange(0, E)
    NT: tl.constexpr = (2 * I + BN - 1) // BN
    EB13: tl.constexpr = 2 * I * H
    SB13: tl.constexpr = ((2 * I + BLK - 1) // BLK) * ((H + BLK - 1) // BLK)
    if SPAN:
        _gateup_spans(pid, nprog, used, csum, nu, e, xq_ptr, xs_ptr, w13_ptr, s13_ptr, wsh13_ptr, ssh13_ptr,
                      gu_ptr, W, BM, H, I, BN, BLK, KSG, PER, GDOT, FASTCVT)
    else:
        for t in range(pid, NSLOT * NT * KSG, nprog):
            u = t // (NT * KSG)
            r = t % (NT * KSG)
            if u <= nu:
                if u == 0:
                    gemv_tile(r, xq_ptr, H, wsh13_ptr, ssh13_ptr, gu_ptr, 2 * I, 2 * I, H, W, BM, BN, BLK, KSG, True,
                              xs_ptr, True, DOT=GDOT, LSTG=GSTG, FASTCVT=FASTCVT)
                else:
                    ex = tl.sum(tl.where((used != 0) & (csum == u), e, 0), 0).to(tl.int64)
                    gemv_tile(r, xq_ptr, H, w13_ptr + ex * EB13, s13_ptr + ex * SB13,
                              gu_ptr + u * (KSG * W * 2 * I), 2 * I, 2 * I, H, W, BM, BN, BLK, KSG, True, xs_ptr, True,
                              DOT=GDOT, LSTG=GSTG, FASTCVT=FASTCVT)
                if fold_ptr is not None:
                    _fold_silu(fold_ptr + u, NT * KSG, u, gu_ptr, inter_ptr, inters_ptr, W, I, KSG, BI, BLK, HW)


@triton.jit
def _gateup_spans(pid, nprog, used, csum, nu, e, xq_ptr, xs_ptr, w13_ptr, s13_ptr, wsh13_ptr, ssh13_ptr, gu_ptr,
                  W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, I: tl.constexpr, BN: tl.constexpr,
                  BLK: tl.constexpr, KSG: tl.constexpr, PER: tl.constexpr, GDOT: tl.constexpr = DOT_WX_FP8,
                  FASTCVT: tl.constexpr = False):
    """`moe_gateup`'s stream-K form. Slot u has S spans of PER items; its span j is number
    u * S + j of one sequence over the slots in use, dealt round-robin over the programs: the
    busiest program then runs at most one span more than the least busy, whatever the slot
    count (a per-slot deal would leave the same programs idle in every slot). Which program
    runs a span never changes what it writes (partial slot j - first span of its tile, in
    `gemv_span`), so the written partials are the same every step, the unwritten ones stay zero
    as allocated, and the SiLU stage's fixed-order sum does not depend on the grid or timing.
    GDOT: the spans' MMA form (`gemv` DOT_*: the e4m3 one by default; the bf16 ones sum exact
    products in fp32, converting the weights as FASTCVT says)."""
    NKB: tl.constexpr = H // BLK
    S: tl.constexpr = ((2 * I + BN - 1) // BN * NKB + PER - 1) // PER
    EB13: tl.constexpr = 2 * I * H
    SB13: tl.constexpr = ((2 * I + BLK - 1) // BLK) * ((H + BLK - 1) // BLK)
    for u in range(0, nu + 1):
        ex = tl.sum(tl.where((used != 0) & (csum == u), e, 0), 0).to(tl.int64)
        if u == 0:
            wb = wsh13_ptr
            sb = ssh13_ptr
        else:
            wb = w13_ptr + ex * EB13
            sb = s13_ptr + ex * SB13
        # the first span of slot u this program runs: (u * S + j) % nprog == pid
        j0 = (pid + nprog - (u * S) % nprog) % nprog
        for j in range(j0, S, nprog):
            gemv_span(j, xq_ptr, H, wb, sb, gu_ptr + u * (KSG * W * 2 * I), 2 * I, 2 * I, H, W, BM, BN, BLK, PER,
                      FMT_FP8, xs_ptr, True, False, GDOT, FASTCVT=FASTCVT)


@triton.jit
def _fold_silu(cnt_ptr, n, u, gu_ptr, inter_ptr, inters_ptr, W: tl.constexpr, I: tl.constexpr, KSG: tl.constexpr,
               BI: tl.constexpr, BLK: tl.constexpr, HW: tl.constexpr):
    """One of slot u's n tiles is stored: arrive on the slot's counter (`arrive_last`: after
    every thread's stores, acq_rel); the n-th arrival runs the slot's SiLU, after a barrier so
    that every thread reads behind the acquire, and sets the counter back to zero for the next
    launch (no other arrival is left: it was the last)."""
    if arrive_last(cnt_ptr, n, False):
        tl.debug_barrier()
        silu_slot(u, gu_ptr, inter_ptr, inters_ptr, W, I, KSG, BI, BLK, HW)
        lane = tl.arange(0, 2)
        tl.store(cnt_ptr + lane, tl.zeros([2], tl.int32), mask=lane == 0)


@triton.jit
def silu_slot(u, gu_ptr, inter_ptr, inters_ptr, W: tl.constexpr, I: tl.constexpr, KSG: tl.constexpr,
              BI: tl.constexpr, BLK: tl.constexpr, HW: tl.constexpr = False):
    """`moe_silu`'s items of slot u, every row at once ([RP, BI] a column block, RP rows a power
    of two >= W, the pad rows masked): the same sums in the same order and the same rounding
    and quantisation per BLK block, so the same bits. For one program that computes a whole
    slot (`moe_gateup`'s fold): each block's partials are loaded together, one memory round
    trip a block, not one a row."""
    RP: tl.constexpr = 2 if W <= 2 else (4 if W <= 4 else 8)
    tl.static_assert(W <= 8, "silu_slot takes at most 8 rows")
    rows = tl.arange(0, RP)
    c = tl.arange(0, BI)
    rm = (rows < W)[:, None]
    for ib in tl.static_range(I // BI):
        base = gu_ptr + u * (KSG * W * 2 * I) + rows[:, None] * (2 * I) + ib * BI + c[None, :]
        g = tl.zeros([RP, BI], tl.float32)
        up = tl.zeros([RP, BI], tl.float32)
        for ks in tl.static_range(KSG):
            g += tl.load(base + ks * (W * 2 * I), mask=rm, other=0.0)
            up += tl.load(base + ks * (W * 2 * I) + I, mask=rm, other=0.0)
        # row-major [RP * BI]: each row's BI values are whole BLK blocks, as moe_silu's per row
        q, qs = _silu_quant(tl.reshape(g, [RP * BI]), tl.reshape(up, [RP * BI]), RP * BI, BLK, HW)
        tl.store(inter_ptr + (u * W + rows[:, None]) * I + ib * BI + c[None, :], tl.reshape(q, [RP, BI]), mask=rm)
        j = tl.arange(0, BI // BLK)
        tl.store(inters_ptr + (u * W + rows[:, None]) * (I // BLK) + (ib * BI) // BLK + j[None, :],
                 tl.reshape(qs, [RP, BI // BLK]), mask=rm)


@triton.jit
def _silu_quant(g, up, D: tl.constexpr, BLK: tl.constexpr, HW: tl.constexpr):
    """gate and up [D] (their fp32 partial sums, summed in slot order) -> SiLU(g) * up quantised
    for down: (e4m3 values as bf16 [D], fp32 scale per BLK block [D // BLK]); `moe_silu`'s and
    `silu_slot`'s math, so both give the same bits."""
    g = bf16r(g)
    up = bf16r(up)
    # SGLang's silu_and_mul kernel: fp32 math, one rounding
    a = div_rn(g, 1.0 + tl.exp(-g)) * up
    return quant_blocks(bf16r(a), D, BLK, HW)


@triton.jit
def moe_silu(pid, nprog, gu_ptr, inter_ptr, inters_ptr, nslot_ptr,
             W: tl.constexpr, I: tl.constexpr, KSG: tl.constexpr, BI: tl.constexpr,
             NSLOT: tl.constexpr, BLK: tl.constexpr, HW: tl.constexpr = False):
    """SiLU(g) * u of every slot in use, quantised for down (inter, inters), one (slot, row,
    BI-column block) a tile. HW: the e4m3 rounding on sm_90's conversion unit (`quant_blocks`)."""
    ns = tl.load(nslot_ptr)
    c = tl.arange(0, BI)
    NB: tl.constexpr = I // BI
    for t in range(pid, NSLOT * W * NB, nprog):
        u = t // (W * NB)
        m = (t // NB) % W
        ib = t % NB
        g = tl.zeros([BI], tl.float32)
        up = tl.zeros([BI], tl.float32)
        base = gu_ptr + u * (KSG * W * 2 * I) + m * (2 * I) + ib * BI
        # unrolled: every partial's load in flight at once, the sums still in slot order; read
        # before the slot count is known (a slot past it reads its stale partials and stores
        # nothing), so the count's load is not a round trip ahead of these
        for ks in tl.static_range(KSG):
            g += tl.load(base + ks * (W * 2 * I) + c)
            up += tl.load(base + ks * (W * 2 * I) + I + c)
        if u < ns:
            q, qs = _silu_quant(g, up, BI, BLK, HW)
            tl.store(inter_ptr + (u * W + m) * I + ib * BI + c, q)
            tl.store(inters_ptr + (u * W + m) * (I // BLK) + (ib * BI) // BLK + tl.arange(0, BI // BLK), qs)


@triton.jit
def down_slot(u, ns, exs, sidx, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, t, rows, rmask,
              cols, kk, W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, I: tl.constexpr,
              BND: tl.constexpr, BLK: tl.constexpr, FASTCVT: tl.constexpr = False):
    """Slot u's down-projection tile, bf16-rounded [BM, BND] (slot 0: the shared expert). A u
    past the last slot reads slot ns - 1 again (valid memory; the caller drops the result), so
    two slots' loads can be issued together without masks."""
    EB2: tl.constexpr = H * I
    NKB: tl.constexpr = (I + BLK - 1) // BLK
    SB2: tl.constexpr = ((H + BLK - 1) // BLK) * NKB
    uc = tl.minimum(u, ns - 1)
    ex = tl.sum(tl.where(sidx == uc, exs, 0), 0).to(tl.int64)
    if uc == 0:
        wb = wsh2_ptr
        sb = ssh2_ptr
    else:
        wb = w2_ptr + ex * EB2
        sb = s2_ptr + ex * SB2
    acc = tl.zeros([BM, BND], tl.float32)
    for k0 in range(0, I, BLK):
        # the SiLU stage quantised the input already (e4m3 values as bf16, scales in inters)
        xq = tl.load(inter_ptr + (uc * W + rows[:, None]) * I + k0 + kk[None, :], mask=rmask[:, None], other=0.0)
        sxq = tl.load(inters_ptr + (uc * W + rows) * NKB + k0 // BLK, mask=rmask, other=0.0)
        wq = tl.load(wb + cols[:, None].to(tl.int64) * I + k0 + kk[None, :])
        sw = tl.load(sb + ((t * BND) // BLK) * NKB + k0 // BLK)
        acc += dot_as(xq, tl.trans(e4m3_operand(wq, FASTCVT)), FASTCVT) * (sxq[:, None] * sw)
    return bf16r(acc)  # each expert's down GEMM writes bf16


@triton.jit
def _slot_experts(slot_e_ptr, ns, NSLOT: tl.constexpr):
    """(exs, sidx): the routed slots' expert ids read once as a vector [NSP2] (0 for slot 0, the
    shared expert, and past the ns slots in use) and their slot indices, for `_down_slot_base`
    to pick from in registers: a per-slot load puts one more dependent memory round trip in
    front of every slot's weight load."""
    NSP2: tl.constexpr = 16 if NSLOT <= 16 else (32 if NSLOT <= 32 else (64 if NSLOT <= 64 else (
        128 if NSLOT <= 128 else (256 if NSLOT <= 256 else 512))))
    sidx = tl.arange(0, NSP2)
    exs = tl.load(slot_e_ptr + sidx, mask=(sidx < ns) & (sidx > 0), other=0)
    return exs, sidx


@triton.jit
def _down_slot_base(u, ns, slot_e_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, H: tl.constexpr, I: tl.constexpr,
                    BLK: tl.constexpr, exs=None, sidx=None):
    """(uc, wb, sb) of slot u's down projection, every load unconditional: uc = u, or ns - 1 for
    a u past the last slot (its result is dropped); the bases of its weights [H, I] and scales,
    slot 0's (the shared expert) picked by pointer. The expert id is loaded, or (exs given)
    picked from the ids exs [len(sidx)] in registers (`_slot_experts`)."""
    EB2: tl.constexpr = H * I
    SB2: tl.constexpr = ((H + BLK - 1) // BLK) * ((I + BLK - 1) // BLK)
    uc = tl.minimum(u, ns - 1)
    if exs is None:
        ex = tl.load(slot_e_ptr + uc).to(tl.int64)  # slot 0's entry is unused (the shared expert)
    else:
        ex = tl.sum(tl.where(sidx == uc, exs, 0), 0).to(tl.int64)
    wb = tl.where(uc == 0, wsh2_ptr, w2_ptr + ex * EB2)
    sb = tl.where(uc == 0, ssh2_ptr, s2_ptr + ex * SB2)
    return uc, wb, sb


@triton.jit
def _down_slot_y(u, ns, slot_e_ptr, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, rows, rmask,
                 cols, cb, kk, W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, I: tl.constexpr,
                 BND: tl.constexpr, BLK: tl.constexpr, FASTCVT: tl.constexpr, exs=None, sidx=None):
    """Slot u's bf16-rounded down tile [BM, BND] with every load unconditional
    (`_down_slot_base`: a u past the last slot reads slot ns - 1 again, its result dropped)."""
    NKB: tl.constexpr = (I + BLK - 1) // BLK
    uc, wb, sb = _down_slot_base(u, ns, slot_e_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, H, I, BLK, exs, sidx)
    acc = tl.zeros([BM, BND], tl.float32)
    for kb in tl.static_range(NKB):
        xq = tl.load(inter_ptr + (uc * W + rows[:, None]) * I + kb * BLK + kk[None, :], mask=rmask[:, None],
                     other=0.0)
        sxq = tl.load(inters_ptr + (uc * W + rows) * NKB + kb, mask=rmask, other=0.0)
        wq = tl.load(wb + cols[:, None].to(tl.int64) * I + kb * BLK + kk[None, :])
        sw = tl.load(sb + cb * NKB + kb)
        acc += dot_as(xq, tl.trans(e4m3_operand(wq, FASTCVT)), FASTCVT) * (sxq[:, None] * sw)
    return bf16r(acc)  # each expert's down GEMM writes bf16


@triton.jit
def _down_tile_pipelined(t, ns, slot_e_ptr, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, slot_w_ptr,
                         o_ptr, routed_scale, rows, rmask, cols0, kk, W: tl.constexpr, BM: tl.constexpr,
                         H: tl.constexpr, I: tl.constexpr, BND: tl.constexpr, BLK: tl.constexpr,
                         NSLOT: tl.constexpr, DSTG: tl.constexpr, FASTCVT: tl.constexpr, DSTEP: tl.constexpr = 1,
                         exs=None, sidx=None):
    """`moe_down`'s column tile t with the slots as one loop that Triton pipelines (num_stages
    DSTG), DSTEP (1, 2 or 4) slots an iteration, each slot's K blocks unrolled and every load of a
    slot unconditional (`_down_slot_y`). Same sums in the same order as the unpipelined form.

    What Triton makes of it (sm_90 TTGIR, Triton 3.6, the GLM-5.3 TP8 layer, session 19): with
    each slot's expert id loaded in the loop, the weights' addresses depend on that load, and the
    pipeliner puts the id two iterations ahead but the weights, x and scales only one: a slot's
    copies are issued after the slot before has computed and are waited for in full at the top
    of the next iteration (async_wait num 0; 1 of 18 groups at two slots a step). So a slot
    still costs one memory round trip, at DSTG 3 and at 4 alike (the same schedule). With the
    ids picked from registers (exs: loaded once by the caller) no load gates an address, and
    the next iteration's copies stay in flight (num 9, 18 at two slots a step). The per-slot
    down_slot loop of session 14 drained its loads before the next slot began: ~29 us for 17
    slots at 2 rows (H200 stamps); the id vector with its reduction spilled sm_90 registers at
    8 rows in that form."""
    cols = t * BND + cols0
    cb = (t * BND) // BLK
    shared = tl.zeros([BM, BND], tl.float32)
    routed = tl.zeros([BM, BND], tl.float32)
    for u in tl.range(0, ns, DSTEP, num_stages=DSTG):
        # the iteration's slots in slot order: the sum is the one-slot loop's whatever DSTEP
        for j in tl.static_range(DSTEP):
            y = _down_slot_y(u + j, ns, slot_e_ptr, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, rows,
                             rmask, cols, cb, kk, W, BM, H, I, BND, BLK, FASTCVT, exs, sidx)
            wr = tl.load(slot_w_ptr + rows * NSLOT + u + j, mask=rmask & (u + j < ns), other=0.0)
            if j == 0:
                shared = tl.where(u == 0, y, shared)
            routed += tl.where(((wr != 0.0) & (u + j > 0))[:, None], bf16r(y * wr[:, None]), 0.0)
    out = bf16r(routed * routed_scale) + shared
    tl.store(o_ptr + rows[:, None] * H + cols[None, :], rbf(out), mask=rmask[:, None])


@triton.jit
def moe_down(pid, nprog, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, slot_e_ptr, slot_w_ptr,
             nslot_ptr, o_ptr, routed_scale,
             W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, I: tl.constexpr,
             BND: tl.constexpr, BLK: tl.constexpr, NSLOT: tl.constexpr, DSTG: tl.constexpr = 0,
             FASTCVT: tl.constexpr = False, DSTEP: tl.constexpr = 1, IDV: tl.constexpr = False):
    """down of every slot in use and the weighted sum over slots -> o [W, H] bf16, one
    BND-column tile a program step (each tile's sum is its program's: nothing to reduce).
    DSTG > 0: the slots of a tile are one loop pipelined DSTG deep, DSTEP slots an iteration
    (`_down_tile_pipelined`; IDV: the slots' expert ids read once as a vector, not in the loop);
    FASTCVT: the weights converted as `moe_gateup`'s."""
    ns = tl.load(nslot_ptr)
    rows = tl.arange(0, BM)
    rmask = rows < W
    cols0 = tl.arange(0, BND)
    kk = tl.arange(0, BLK)
    # the slots' expert ids read once as a vector (`_slot_experts`) in the unpipelined form, and
    # in the pipelined one with IDV
    if DSTG > 0:
        exs = None
        sidx = None
        if IDV:
            exs, sidx = _slot_experts(slot_e_ptr, ns, NSLOT)
        for t in range(pid, H // BND, nprog):
            _down_tile_pipelined(t, ns, slot_e_ptr, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr,
                                 slot_w_ptr, o_ptr, routed_scale, rows, rmask, cols0, kk, W, BM, H, I, BND, BLK,
                                 NSLOT, DSTG, FASTCVT, DSTEP, exs, sidx)
        return
    STEP: tl.constexpr = 2 if I <= 2 * BLK else 1
    exs, sidx = _slot_experts(slot_e_ptr, ns, NSLOT)
    for t in range(pid, H // BND, nprog):
        cols = t * BND + cols0
        shared = tl.zeros([BM, BND], tl.float32)
        routed = tl.zeros([BM, BND], tl.float32)
        # two slots a step where a slot's K is at most 2 blocks (the GLM-5.3 TP8 shard), so both
        # slots' weight loads are in flight together; a longer K keeps loads in flight by
        # itself, and two slots of it spilled (sm_90, TP4 rank). The sum runs in slot order
        # either way (fused_experts: bf16(y * weight) per slot, fp32 sum, x scale).
        for u in range(0, ns, STEP):
            y0 = down_slot(u, ns, exs, sidx, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, t, rows,
                           rmask, cols, kk, W, BM, H, I, BND, BLK, FASTCVT)
            if STEP == 2:
                y1 = down_slot(u + 1, ns, exs, sidx, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr,
                               t, rows, rmask, cols, kk, W, BM, H, I, BND, BLK, FASTCVT)
            wr0 = tl.load(slot_w_ptr + rows * NSLOT + u, mask=rmask, other=0.0)
            if u == 0:
                shared = y0
            else:
                routed += tl.where((wr0 != 0.0)[:, None], bf16r(y0 * wr0[:, None]), 0.0)
            if STEP == 2:
                wr1 = tl.load(slot_w_ptr + rows * NSLOT + u + 1, mask=rmask & (u + 1 < ns), other=0.0)
                routed += tl.where((wr1 != 0.0)[:, None], bf16r(y1 * wr1[:, None]), 0.0)
        out = bf16r(routed * routed_scale) + shared
        tl.store(o_ptr + rows[:, None] * H + cols[None, :], rbf(out), mask=rmask[:, None])


@triton.jit
def moe_down_items(pid, nprog, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, slot_e_ptr, slot_w_ptr,
                   nslot_ptr, z_ptr, cnt_ptr, o_ptr, routed_scale,
                   W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, I: tl.constexpr,
                   BND: tl.constexpr, BLK: tl.constexpr, NSLOT: tl.constexpr, DSTG: tl.constexpr = 3,
                   FASTCVT: tl.constexpr = False, R: tl.constexpr = 1, epoch=0, mbox_tab=None, flag_tab=None,
                   rank=0, RP2: tl.constexpr = 1, DDOT: tl.constexpr = 0):
    """`moe_down` as items: item i = (BND-column tile i // ns, slot i % ns) of the NT * ns items
    (NT = H // BND), tile-major, cut into one equal span a program, so every program reads
    about the same bytes whatever NT and ns are (the slot loop's NT tiles leave programs idle
    where NT is not a multiple of the grid). An item writes its slot's weighted tile z_u [W,
    BND] (bf16: bf16(y_u * w_u) per row, 0 where the row did not select the expert; slot 0 the
    shared expert's y_0) to z [NSLOT, W, H] bf16. The items' loop holds no sum, so Triton
    pipelines it DSTG deep. Then the span's tiles arrive on their counters (cnt_ptr int32
    [NT], zero between launches), each with its item count, PT tiles an RMW; a tile's last
    arrival sums its ns slots in slot order from the L2 (`_down_combine`: the bits of
    `moe_down`) into o and sets the counter back to zero. A tile's items are consecutive, so
    its last arrival is one of at most two programs (slot-major items left every tile's last
    arrival to the few programs of the last slot: 163 against 56 us at 8 rows, H100).

    DDOT: the items' MMA form, 0 as `moe_down` (FASTCVT's conversion, exact products), or
    `gemv.DOT_WX_FP8`: both operands e4m3 on FP8 tensor cores, weights on the M side (the dense
    GEMVs' form: no conversion instructions, but their in-MMA accumulation is not exact fp32,
    so other bits than `moe_down`'s).

    R > 1 (a TP all-reduce in the kernel): o is this rank's partial, and the program that
    combined a tile pushes it to every rank (`allreduce_push` of that one tile; epoch,
    mbox_tab, flag_tab, rank, RP2 as its own); the caller then runs `allreduce_sum`."""
    NT: tl.constexpr = H // BND
    ns = tl.load(nslot_ptr)
    total = ns * NT
    per = (total + nprog - 1) // nprog
    i0 = pid * per
    i1 = tl.minimum(i0 + per, total)
    rows = tl.arange(0, BM)
    rmask = rows < W
    cols0 = tl.arange(0, BND)
    kk = tl.arange(0, BLK)
    # the slots' expert ids read once as a vector and picked in registers: loaded in the loop,
    # an id gated its item's weight addresses and the loop waited for every copy at the top of
    # each item (sm_90 TTGIR, Triton 3.8: async_wait num 0), one memory round trip an item
    exs, sidx = _slot_experts(slot_e_ptr, ns, NSLOT)
    for i in tl.range(i0, i1, num_stages=DSTG):
        t = i // ns
        u = i % ns
        cols = t * BND + cols0
        if DDOT == DOT_WX_FP8:
            y = _down_slot_y_fp8(u, ns, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, rows, rmask, cols,
                                 exs, sidx, W, BM, H, I, BND, BLK)
        else:
            y = _down_slot_y(u, ns, slot_e_ptr, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, rows,
                             rmask, cols, (t * BND) // BLK, kk, W, BM, H, I, BND, BLK, FASTCVT, exs, sidx)
        wr = tl.load(slot_w_ptr + rows * NSLOT + u, mask=rmask, other=0.0)
        z = tl.where(u == 0, y, tl.where((wr != 0.0)[:, None], bf16r(y * wr[:, None]), 0.0))
        tl.store(z_ptr + (u * W + rows[:, None]) * H + cols[None, :], rbf(z), mask=rmask[:, None])
    # the span's tiles arrive PT at a time, each once with its item count
    PT: tl.constexpr = 16
    lane = tl.arange(0, PT)
    t0 = i0 // ns
    t1 = (i1 + ns - 1) // ns
    for c0 in range(t0, t1, PT):
        tiles = c0 + lane
        mine = tiles < t1
        cnt = tl.minimum(i1, (tiles + 1) * ns) - tl.maximum(i0, tiles * ns)
        tl.debug_barrier()  # every thread's z stores before the arrivals (as `arrive_last`)
        old = tl.atomic_add(cnt_ptr + tiles, cnt, mask=mine, sem="acq_rel", scope="gpu")
        last = mine & (old + cnt == ns)
        j = tl.min(tl.where(last, lane, PT), 0)
        if j < PT:
            tl.debug_barrier()  # every thread reads behind the acquire
        while j < PT:
            t = c0 + j
            _down_combine(t, ns, z_ptr, o_ptr, routed_scale, W, H, BND, NSLOT)
            tl.store(cnt_ptr + t + lane, tl.zeros([PT], tl.int32), mask=lane == 0)
            if R > 1:
                tl.debug_barrier()  # the combined tile's stores before the push reads them
                ARM: tl.constexpr = 2 if W <= 2 else (4 if W <= 4 else 8)
                allreduce_push(o_ptr, H, W, epoch, mbox_tab, flag_tab, rank, t, NT, H, BND, ARM, R, RP2, True)
            last = last & (lane != j)
            j = tl.min(tl.where(last, lane, PT), 0)


@triton.jit
def _down_slot_y_fp8(u, ns, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, rows, rmask, cols, exs, sidx,
                     W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, I: tl.constexpr, BND: tl.constexpr,
                     BLK: tl.constexpr):
    """Slot u's bf16-rounded down tile [BM, BND] on e4m3 MMAs (`gemv._kblock` DOT_WX_FP8: the
    weights [BND, BLK] a K block on the M side), every load unconditional as `_down_slot_y`'s
    (`_down_slot_base`), the expert id picked from exs."""
    NKB: tl.constexpr = (I + BLK - 1) // BLK
    uc, wb, sb = _down_slot_base(u, ns, None, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, H, I, BLK, exs, sidx)
    kk = tl.arange(0, BLK)
    cmask = cols < H
    acc = tl.zeros([BND, BM], tl.float32)
    for kb in tl.static_range(NKB):
        w = tl.load(wb + cols[:, None].to(tl.int64) * I + kb * BLK + kk[None, :])
        acc = _kblock(acc, w, kb, inter_ptr + uc * (W * I), I, inters_ptr + uc * (W * NKB), sb, cols, cmask, rows,
                      rmask, I, BM, BLK, FMT_FP8, True, DOT_WX_FP8)
    return bf16r(tl.trans(acc))


@triton.jit
def _down_combine(t, ns, z_ptr, o_ptr, routed_scale, W: tl.constexpr, H: tl.constexpr, BND: tl.constexpr,
                  NSLOT: tl.constexpr):
    """Column tile t of the MoE output from its slots' weighted tiles z [NSLOT, W, H] bf16:
    bf16(bf16(sum of z_u over u = 1..ns-1 in slot order) * routed_scale) + z_0, as `moe_down`.
    The loads go in groups of G unrolled (G * RP * BND <= 4096 values), slots past ns masked
    to zero (an exact +0.0 add: the sum starts at +0.0 and cannot become -0.0)."""
    RP: tl.constexpr = 2 if W <= 2 else (4 if W <= 4 else 8)
    tl.static_assert(W <= 8, "the down combine takes at most 8 rows")
    G: tl.constexpr = max(1, min(NSLOT, 4096 // (RP * BND)))
    rows = tl.arange(0, RP)
    rmask = rows < W
    cols = t * BND + tl.arange(0, BND)
    base = z_ptr + rows[:, None] * H + cols[None, :]
    shared = tl.load(base, mask=rmask[:, None], other=0.0).to(tl.float32)
    routed = tl.zeros([RP, BND], tl.float32)
    for s0 in range(1, NSLOT, G):
        for g in tl.static_range(G):
            routed += tl.load(base + (s0 + g) * (W * H), mask=rmask[:, None] & (s0 + g < ns),
                              other=0.0).to(tl.float32)
    out = bf16r(routed * routed_scale) + shared
    tl.store(o_ptr + rows[:, None] * H + cols[None, :], rbf(out), mask=rmask[:, None])

