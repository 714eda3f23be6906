"""The launcher of the GLM-5.3 decoder-layer kernel: buffers, counters, grid, fused/staged.

    from mono_glm53.kernels.layer import GlmLayerKernel
    k = GlmLayerKernel(shape, weights, width=2, max_seq_len=4096, indexer=True)
    k.set_inputs(hidden, residual, inputs)      # copies a step's rows into the static buffers
    out, res, topk = k.launch(caches, mode="fused")   # or "staged"
    k.guard.check()                             # raises if a guarded wait expired

`shape` is a `mono_glm53.config.GlmLayerShape` (REAL, tiny(), or a tp_shard), `weights` the
dict of `mono_glm53.weights.make_weights` (SGLang parameter names, read in place: no copy).
The step's inputs live in static device buffers (x, residual, positions, out_cache_loc,
seq_lens, req_pool_indices) that the kernel reads from memory, so a CUDA graph captured around
`launch` replays with whatever the buffers hold. Rows past the step's real rows are pad rows:
they compute (on zeros) but write no cache (their out_cache_loc is -1) and route to no routed
expert (a row whose out_cache_loc is not > 0 does not: -1 here, SGLang's padding slot 0 in
a served graph-padded step), so their MoE output is the shared expert's alone.

Arguments: every tensor and runtime scalar of a launch goes into a device pointer table
(`kernels.ptable`), built once per distinct set of addresses and kept (`GlmLayerKernel._table`:
per layer, since each layer's weights and caches differ); the host checks each tensor's dtype
and 16-byte alignment against its slot. Launches compile with no AMD buffer ops and maxnreg
255 on CUDA (`launch_options`): see tests/compile for the resources this gives.

Grid: `nprog` programs, by default `PROGRAMS_PER_SM` per SM or CU (`default_nprog`). Whether the
fused launch is cooperative is decided once per object by a capability check
(`cooperative_launch_supported`: the Triton backend's options have `launch_cooperative_grid`):
a cooperative launch of a grid that cannot be co-resident is refused by the driver; a plain
one (cooperative=False, or no such option) is first checked on the host against the compiled
kernel's registers, shared memory and warps (`check_co_resident`) and refused with a message.
Compile and launch errors are never caught. Staged mode launches the same kernel once per stage
with the same grid.

Failure: in report mode (MONO_GUARD_MODE=report: tests, check mode) every launch is followed by
`guard.check()`, so a stopped launch raises MonoDeviceError before its outputs are returned;
after a stop the object refuses to launch until `recover()` (its counters are out of step).
In fault mode a stopped launch kills the process. A server refuses report mode outside check
mode (`mono_glm53.forward.report_mode_refusal`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct

import torch

from mono_common.stages.gemv import pick_split_k as _pick_ks
from mono_common.stages.gemv import span_per, span_slots, tile_spans
from mono_common.triton_knobs import amd_buffer_ops
from mono_glm53.config import GlmLayerShape
from mono_glm53.kernels.capture_rows import CaptureRows

__all__ = ["Plan", "make_plan", "make_tp_plan", "peer_requests", "GlmLayerKernel", "launch_side_by_side",
           "cos_sin_cache", "PROGRAMS_PER_SM", "default_nprog", "default_knobs", "folded_handoffs", "KNOBS",
           "MEASUREMENT_KWARGS"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Compile-time shape and tiling of one kernel variant (the constexprs)."""

    W: int
    BM: int
    H: int
    QL: int
    KVL: int
    RD: int
    NOPE: int
    VD: int
    NH: int
    IH: int
    IHP: int
    ID: int
    TOPK: int
    E: int
    TOPE: int
    I: int
    BLK: int
    PG: int
    HB: int
    NSLOT: int
    INDEXER: bool
    IDX_FUSED: bool
    HADAMARD: bool
    MLA_NEOX: bool
    IDX_NEOX: bool
    BN: int
    KS1: int
    KSI: int
    KS3: int
    KSQ: int
    KS9: int
    BNR: int
    KSR: int
    KSG: int
    BNS: int  # column tile of the stream-K GEMVs (q_a/kv_a, q_b, index wq_b, o_proj)
    PER1: int  # their (column tile, K block) items a program
    PER3: int
    PERQ: int
    PER9: int
    DOTF: int  # their MMA form (mono_common.stages.gemv DOT_*)
    BND: int
    CT: int
    HG: int
    VB: int
    BI: int
    TB: int
    # tensor parallel (set by `make_tp_plan`): R ranks all-reduce in the kernel
    R: int = 1
    RP2: int = 2
    ARB: int = 256
    # per ISA (set by GlmLayerKernel and variant_constexprs from `isa_options`): the MoE down
    # slot loop's num_stages (0: one slot after another; with the ids loaded in the loop Triton
    # keeps one slot's copies in flight whatever the depth, and reading them once measured no
    # faster: results README, session 20), and e4m3 conversions on sm_90's integer and bf16
    # pipes
    DSTG: int = 0
    FASTCVT: bool = False
    # the q_a/kv_a and q_b/wq_b GEMVs' inputs quantised once by their producers (addnorm,
    # latent) instead of in every K block: the same bits (set per ISA by `isa_options`: sm_90
    # only, gfx950 spilled 18 scalar registers with it). Alone, the [2624 x 6144] GEMV with a
    # hand-off took 10.2 us quantising in its K blocks (session 10) and 7.15 us reading its
    # producer's quantised input (session 12); the layer with it (H200, session 16, TP8 shard,
    # ctx 4096): 1.06x / 1.05x / 1.00x at 1 / 2 / 8 rows
    XQP: bool = False
    # the producers' fp32 -> e4m3 roundings by sm_90's conversion unit (`numerics.e4m3_bits`
    # HW; set per ISA by `isa_options`, off with the knob `hw_quant`) where the integer form
    # takes ~20 instructions an element: the same bits (mono-common's GPU test of every
    # rounding boundary), 16 KB less code in addnorm and 6 KB in latent (Triton 3.8)
    HWQ: bool = False
    # down's slots a step in its pipelined slot loop (DSTG > 0). Two at 8 rows, one below:
    # H200 stamps, session 18 (TP8 shard, ctx 4096): 336.1 -> 321.4 us a layer at 8 rows with
    # the gate_up split of 3, 181.5 -> 186.4 us at 1 row (the w2 kernel)
    DSTEP: int = 1
    # programs 0..P1-1 run q_a/kv_a's spans, P1.. the indexer's wk | weights_proj tiles (0:
    # every program a span and the tiles dealt from program 0): `_qkva_split`
    P1: int = 0
    # o_proj's column tiles summed by their last span into slot 0 (`oproj_fixup`, a knob)
    FIX9: bool = False
    # the top-k's first radix pass folded into the index scores (set per ISA by `isa_options`,
    # off with the knob `hist_in_scores`)
    TKF: bool = False
    # gate_up's MMA form and column tile (0: BN): `gateup_dot`, `gateup_bn`, knobs
    GDOT: int = 0
    BNG: int = 0
    # gate_up as stream-K spans of PERG items, KSG then their partial slots (`gateup_spans`, a
    # knob; mono-common `moe_gateup` SPAN)
    GSP: bool = False
    PERG: int = 1
    # a measurement probe (`code_pad`, a knob): |PADKB| KB of code every program runs after
    # hand-off PADS, straight-line (PADKB > 0) or as a hot loop of the same steps (< 0)
    PADS: int = 0
    PADKB: int = 0
    # the top-k's radix passes as one runtime loop over one copy of their code (`radix_loop`,
    # a knob: ~22 KB less sm_90 code, the same integers)
    TKL: bool = False
    # the next layer's q_a/kv_a and index weights requested into the L2 after the hand-off into
    # this stage (0: not; `next_layer_prefetch`, a knob; GlmLayerKernel.next_weights)
    NXS: int = 0
    # every hand-off a call of one copy of its code on sm_90 (`sync_call`, a knob)
    SYC: bool = False
    # every hand-off's wait polled by one thread's loop of sm_90 assembly (`handoff_spin`, a
    # knob; mono_common.device.guard.wait_ge_spin)
    HSP: bool = False
    # addnorm's rows each cut into ANC chunks dealt over the programs (sm_90's default by
    # `addnorm_default`, off with the knob `norm_spread`; 0: one program a row)
    ANC: int = 0
    # the MoE's e4m3 weights converted to f16 by sm_90's conversion unit for f16 MMAs, its
    # quantised inputs (h2q, inter) stored as f16 bits in their bf16 buffers (set per ISA by
    # `isa_options`, off with the knob `moe_f16`: the same exact products)
    MF16: bool = False
    # the index scores' e4m3 keys converted to f16 by sm_90's conversion unit for f16 MMAs
    # (set per ISA by `isa_options` as MF16, off with the knob `index_f16`: the same exact
    # products)
    IF16: bool = False
    # down's slot loop with the slots' expert ids read once as a vector, so its next slot's
    # copies stay in flight (`down_ids`, a knob of the pipelined loop: DSTG > 0)
    DIDV: bool = False
    # down as (column tile, slot) items in equal spans, each BND-column tile summed by its last
    # item's program (`down_items`, a knob of sm_90 at a TP8 rank; mono-common
    # `moe_down_items`): the same sums in the same order
    DIT: bool = False
    # rows of at most TKW tokens counted by the top-k's write stage from their keys, the count
    # stage's hand-off only signalled in a step with no longer row (`count_in_write`, a knob;
    # 0: the count stage counts every row)
    TKW: int = 0
    # the SiLU folded into gate_up: each slot's last gate_up tile runs the slot's SiLU, the SiLU
    # stage is empty and its hand-off folded (`silu_fold`, a knob)
    SFO: bool = False
    # the index scores' page-table entries read two tiles ahead and the next tile's keys
    # requested into the L2 (`index_prefetch`, a knob)
    ISP: bool = False
    # the top-k stages' tiles a contiguous run a program, a row's threshold digits derived once
    # a run, not once a tile (set per ISA by `isa_options`, off with the knob `radix_prefix_once`)
    TKP: bool = False
    # the post-attention norm's rows each cut into PNC chunks dealt over the programs
    # (`postnorm_spread`, a knob; 0: one program a row)
    PNC: int = 0
    # the post-attention norm's row walked in HB-column chunks by its program, twice, each
    # chunk one round of loads: compact code (`postnorm_loop`, a knob)
    PNL: bool = False
    # the post-attention norm as two passes over PNS-column chunks dealt over every program, a
    # hand-off between (`postnorm_split`, a knob; one rank; 0: not)
    PNS: int = 0
    # the MLA combine's chunks of a tile as one [NCH, DC] load and block reductions, not the
    # chunk-order unrolled sums (`mlacomb_vec`, a knob: mono-common `mla_combine` VEC)
    MCV: bool = False
    # q_b and the indexer's wq_b: 0 each in its own spans; 1 as one loop over each program's
    # spans of both (`qb_pair`, a knob; mono-common `gemv.gemv_span_pair`: one copy of the span's
    # code, the same bits); 2 as one GEMV over both's column tiles (`qb_joint`, a knob; mono-common
    # `gemv.gemv_span_joint`: PER3 = PERQ its span, KS3 = KSQ its slots; other sums)
    QBP: int = 0
    # o_proj's input quantised in its spans on sm_90's conversion unit, not the integer form
    # (set per ISA by `isa_options`, off with the knob `oproj_hw_quant`; mono-common
    # `gemv._kblock` HWX: the same bits)
    OHQ: bool = False
    # the programs that issue this layer's weights' L2 prefetches: every program (0), the last
    # PFN, or none (-1) (set per ISA by `isa_options`, changed by the knob `prefetch_programs`:
    # fewer prefetches queued ahead of the few programs whose dependent loads are a 1-row
    # launch's critical path; next_layer_prefetch's requests come from every program either way)
    PFN: int = 0
    # a step whose rows all have at most TKR tokens: the whole top-k in stage 7, one program a
    # row (mono_common.stages.topk.topk_rows_one), hand-offs 8-11 only signalled (`topk_row`, a
    # knob; 0: the radix stages every step)
    TKR: int = 0
    # a step whose rows all have at most TKS tokens: the top-k in stages 7 and 8 on every
    # program, RKS keys a tile (mono_common.stages.topk.topk_spread_threshold, then
    # topk_spread_write), hand-offs 9-11 only signalled (`topk_spread`, a knob; 0: not)
    TKS: int = 0
    RKS: int = 16
    # with TKS: each tile finds its row's threshold itself and places its keys, the top-k in
    # stage 7 alone (mono_common.stages.topk.topk_spread_select), hand-offs 8-11 only signalled
    # (`topk_spread_select`, a knob)
    TSS: bool = False
    # a row top-k step's absorption and q_pe RoPE tiles beside the row top-k in stage 7, stage 4
    # the index tiles alone (`topk_row_absorb`, a knob)
    TKA: bool = False
    # the weights' L2 prefetches as sm_90's bulk prefetches, 16 KB an instruction, instead of a
    # line a lane (`prefetch_bulk`, a knob; mono-common `prefetch.prefetch_bulk`)
    PFB: bool = False
    # where the weights' L2 prefetches are issued when PFN >= 0: a bit a site
    # (`stages.PFS_SITES`; `prefetch_sites`, a knob; 15: start, qb, oproj and down)
    PFS: int = 15
    # the value projection's tiles combining the MLA chunks of their head themselves, the
    # combine stage empty and hand-off 14 folded (`wuv_combine`, a knob)
    WCB: bool = False
    # the MLA chunks' latent keys loaded once and held for both products, CT tokens a chunk
    # (`mla_hold`, a knob; mono_common.stages.mla HOLD)
    HOLD: bool = False
    # the post-attention norm in the router's programs (each derives the rows' rstd and its h2
    # from the attention output + residual), the norm stage the all-reduce alone and hand-off
    # 17 folded (`norm_in_router`, a knob)
    NIR: bool = False
    # the absorption tiles' q_nope summed once a tile for all its chunks (their weights
    # requested first), the q_pe RoPE items tiles of their own (`absorb_gather`, a knob)
    ABG: bool = False

    def constexprs(self) -> dict[str, object]:
        return dataclasses.asdict(self)


BNS = 128
# The MMA form of the stream-K GEMVs: swap-AB with both operands e4m3 (mono_common.stages.gemv)
DOT_WX_FP8 = 2


def _qkva_split(nqkv: int, k: int, blk: int, nidx_cols: int, bn: int, nprog: int) -> tuple[int, int] | None:
    """(P1, KSI): the indexer's [nidx_cols, k] GEMV in tiles of its own programs, the q_a/kv_a
    spans on the rest, or None when that leaves fewer than 3/4 of the programs to the spans.
    KSI is the smallest split-K whose tile has fewer K blocks than a span has items (a tile is
    bf16, a span item e4m3, so a tile reads at most ~2x a span's bytes; more K blocks a tile
    made the stage slower), P1 = nprog - its tiles. With the tiles dealt over every program,
    the programs that ran both took 11.5 us against a 6.3 us median, and KSI = 48 slots made
    latent's index sums a 10.2 us one-program chain; split (KSI 16 on programs 212..263, TP8
    shard, 1 row, ctx 4096, H200 stamps, session 18): qkva 11.5 -> 9.7 us, latent 10.5 -> 9.5,
    the layer 184.8 -> 182.7 us; KSI 8 on 24 programs: 193.3 us."""
    kb = k // blk
    per_all = span_per(nqkv, k, BNS, blk, nprog)
    for ksi in range(1, kb + 1):
        if kb % ksi == 0 and kb // ksi < per_all:
            tiles = _cdiv(nidx_cols, bn) * ksi
            if tiles * 4 > nprog:
                return None
            return nprog - tiles, ksi
    return None


def make_plan(s: GlmLayerShape, width: int, indexer: bool, nprog: int, ks_rule: str = "first") -> Plan:
    """Tiling for shape `s` at `width` rows on `nprog` programs: every GEMV split so that its
    tiles cover the grid (bandwidth needs every SM streaming weights): the dense FP8 GEMVs
    (q_a/kv_a, q_b, the indexer's wq_b, o_proj) as stream-K spans, the others as split-K tiles;
    the indexer's wk | weights_proj on programs of its own (`_qkva_split`), or, on a grid too
    small for that, over every program with the split-K factor `ks_rule` picks (`_pick_ks`)."""
    blk = s.block
    bn = min(64, blk)
    hb = s.hidden // blk
    nqkv = s.qkv_a_out
    nh = s.heads_per_rank
    i_l = s.moe_inter_per_rank
    # The indexer's bf16 wk | weights_proj (2 MB at GLM-5.3's shape) on programs of its own
    # (`_qkva_split`); on a grid too small for that it rides on the programs that also run a
    # q_a/kv_a span: split as finely as K allows (one 16 KB block a tile at the TP8
    # shard), so those programs run ~1.25x the others' bytes, not 2x (a split for nprog // 8
    # tiles held the stage at ~19 us against a ~10 us median program: H200 stamps, session 12).
    nik = s.index_head_dim + s.index_heads
    split = _qkva_split(nqkv, s.hidden, blk, nik, bn, nprog) if indexer else None
    p1, ksi = split if split is not None else (0, _pick_ks(_cdiv(nik, bn), hb, nprog, cap=hb, rule=ks_rule))
    nqb = nh * s.qk_head
    niq = s.index_heads * s.index_head_dim
    # The dense FP8 GEMVs stream-K: every program reads the same bytes (one span of PER
    # (column tile, K block) items), the partials of a column land in KS* slots. On the H200
    # (mono bench stages, session 10) the [2624 x 6144] GEMV took 23.5 us as 64-column split-K
    # tiles with bf16 MMAs and 10.2 us as 128-column spans on e4m3 MMAs (swap-AB).
    per1 = span_per(nqkv, s.hidden, BNS, blk, p1 or nprog)
    per3 = span_per(nqb, s.q_lora, BNS, blk, nprog)
    perq = span_per(niq, s.q_lora, BNS, blk, nprog)
    per9 = span_per(s.hidden, nh * s.v_head, BNS, blk, nprog)
    ks1 = span_slots(s.hidden, blk, per1)
    ks3 = span_slots(s.q_lora, blk, per3)
    ksq = span_slots(s.q_lora, blk, perq)
    ks9 = span_slots(nh * s.v_head, blk, per9)
    bnr = max(16, min(32, s.n_experts))  # tl.dot needs N >= 16 (masked)
    ksr = _pick_ks(_cdiv(s.n_experts, bnr), hb, nprog // 2, cap=8)
    nslot = 1 + min(s.n_experts, width * s.top_k)
    # gate_up's tiles grow with the step's distinct experts (up to 1 + width * top_k), which the
    # plan does not know: split for one row's 1 + top_k, the fewest K blocks on the busiest
    # program (H200 stamps, session 18, TP8 shard, ctx 4096, 72 column tiles: split 4 = 288
    # tiles, 24 programs with two, 190.0 us a layer at 1 row; split 3 = 216 tiles, 184.6 us,
    # gate_up 29.5 -> 23.4 us; split 6 184.9 us, split 2 189.8 us; at 8 rows 336.1 -> 334.3 us).
    # The cap: up to 6 measured, the partials' sum in the SiLU stage grows with it
    ksg = _gateup_split(s, bn, nprog)
    bnd = min(32, blk)
    ct = min(64, s.index_topk)
    hg = 16
    vb = min(32, s.v_head)
    bi = min(128, i_l)
    # index-score tile: 64 tokens (8 KB of FP8 keys) a tile; 32-token tiles left each program
    # ~16 dependent tiles at context 65536 (61 us of the TP8 shard's launch, H200 stamps)
    tb = min(64, s.page)
    return Plan(
        W=width, BM=max(16, width), H=s.hidden, QL=s.q_lora, KVL=s.kv_lora, RD=s.qk_rope,
        NOPE=s.qk_nope, VD=s.v_head, NH=nh, IH=s.index_heads, IHP=max(16, s.index_heads),
        ID=s.index_head_dim, TOPK=s.index_topk, E=s.n_experts, TOPE=s.top_k, I=i_l, BLK=blk,
        PG=s.page, HB=s.hidden & -s.hidden if (s.hidden & -s.hidden) <= 2048 else 2048, NSLOT=nslot, INDEXER=bool(indexer), IDX_FUSED=bool(s.indexer_fused),
        HADAMARD=bool(s.indexer_hadamard), MLA_NEOX=not s.rope_interleave,
        IDX_NEOX=not s.indexer_rope_interleave, BN=bn, KS1=ks1, KSI=ksi, KS3=ks3, KSQ=ksq,
        KS9=ks9, BNR=bnr, KSR=ksr, KSG=ksg, BNS=BNS, PER1=per1, PER3=per3, PERQ=perq, PER9=per9,
        DOTF=DOT_WX_FP8, BND=bnd, CT=ct, HG=hg, VB=vb, BI=bi, TB=tb, DSTEP=2 if width >= 8 else 1, P1=p1,
    )


def make_tp_plan(s: GlmLayerShape, width: int, indexer: bool, nprog: int, world: int = 1,
                 ks_rule: str = "first") -> Plan:
    """`make_plan` for `world` ranks all-reducing in the kernel (world 1: one rank, or one
    shard run alone with identity all-reduces, as the single-GPU bench does)."""
    if world > 1 and s.tp_size != world:
        raise ValueError(f"shape is cut for tp_size={s.tp_size}, not for world={world}")
    arb = 64  # a [rows, 256] fp32 sum tile per program spills at 255 registers
    while s.hidden % arb:
        arb //= 2
    rp2 = 2
    while rp2 < world:
        rp2 *= 2
    return dataclasses.replace(make_plan(s, width, indexer, nprog, ks_rule), R=world, RP2=rp2, ARB=arb)


# GlmLayerKernel's measurement keywords that are its own parameters (an ISA's default when None)
MEASUREMENT_KWARGS = ("num_stages", "ks_rule", "down_stages", "fast_cvt", "xq_producer", "nprog", "num_warps",
                      "l2_window")
# GlmLayerKernel's measurement knobs: keyword -> what it sets (`_with_knobs`)
KNOBS = {
    "gateup_split": "Plan.KSG, gate_up's split-K (a divisor of the hidden size's K blocks)",
    "qkva_programs": "Plan.P1, the programs of the q_a/kv_a spans (0: every program; the index tiles on the rest)",
    "index_split": "Plan.KSI, the index wk | weights_proj split-K",
    "down_step": "Plan.DSTEP, down's slots a pipelined step (1 or 2)",
    "index_tile": "Plan.TB, the index scores' tokens a tile (a power of two in 16..256)",
    "oproj_fixup": "Plan.FIX9, o_proj's column tiles summed by their last span",
    "hist_in_scores": "Plan.TKF, the top-k's first radix pass folded into the index scores (sm_90's default; "
                      "False: a stage of its own)",
    "gateup_dot": "Plan.GDOT, gate_up's MMA form (0: x @ w^T, 1: swap-AB, both bf16)",
    "gateup_bn": "Plan.BNG, gate_up's column tile (16, 32, 64 or 128; its split-K follows unless set)",
    "gateup_spans": "Plan.GSP, PERG: gate_up as stream-K spans dealt over the slots in use, every program the same "
                    "bytes (mono-common moe_gateup SPAN; sm_90): 128-column tiles and swap-AB MMAs unless gateup_bn / "
                    "gateup_dot say otherwise, one span a program for one row's slots; widths up to 2; exact products "
                    "summed in another order than the split-K tiles', so other bits",
    "hw_quant": "Plan.HWQ, the producers' e4m3 roundings on sm_90's conversion unit (False: the integer form)",
    "radix_loop": "Plan.TKL, the top-k's radix passes as one loop over one copy of their code",
    "next_layer_prefetch": "Plan.NXS, the stage (mla, gateup or down) after whose hand-off every program requests "
                           "the next layer's q_a/kv_a and index weights into the L2 (GlmLayerKernel.next_weights; sm_90)",
    "sync_call": "Plan.SYC, every hand-off a call of one copy of its code (sm_90)",
    "handoff_spin": "Plan.HSP, every hand-off's wait polled by one thread in a loop of sm_90 assembly (its "
                    "RMW, the abort flag and every 64 polls the clock; mono_common.device.guard.wait_ge_spin), "
                    "the verdict then broadcast once, where the default broadcasts every poll through shared "
                    "memory (~92 instructions and 5 barriers a poll); the same bits, no faster: 160.8 / 284.1 us "
                    "against 156.3 / 281.1 at 1 / 8 rows (H100, served TP8 shard, ctx 4096, session 34), though "
                    "alone its hand-off is the fastest form (1.314 us on 264 programs against 1.408)",
    "norm_spread": "Plan.ANC, addnorm's rows cut into chunks dealt over the programs, each chunk's program "
                   "summing its whole row's squares as the one-program form does (the same bits; sm_90's "
                   "default, `addnorm_default`; False: one program a row)",
    "moe_f16": "Plan.MF16, the MoE's e4m3 weights converted to f16 on sm_90's conversion unit (one instruction a "
               "pair) for f16 MMAs, not to bf16 on its integer pipes (~6 a pair): the same exact products (a TP8 "
               "rank's sm_90 default; False: the bf16 form)",
    "index_f16": "Plan.IF16, the index scores' e4m3 keys converted to f16 on sm_90's conversion unit for f16 "
                 "MMAs, as moe_f16 does the MoE's weights: the same exact products (a TP8 rank's sm_90 default; "
                 "False: the bf16 form)",
    "down_ids": "Plan.DIDV, down's pipelined slot loop (sm_90 at a TP8 rank) with the slots' expert ids read "
                "once as a vector, so the next slot's copies stay in flight: the same sums in the same order",
    "down_items": "Plan.DIT (and BND), down as (column tile, slot) items dealt in equal spans over every "
                  "program, each column tile summed in slot order by its last item's program (mono-common "
                  "moe_down_items, its loop pipelined DSTG deep, 3 where the build has no pipelined down; sm_90; true "
                  "or 32: 32-column tiles, 64: 64-column tiles, the all-reduce's blocks too): the same sums in the "
                  "same order",
    "count_in_write": "Plan.TKW, the top-k's write stage counting a row of at most this many tokens (a power of two "
                      "in 16..8192; true: 4096) from its keys, the count stage and its wait left out in a step with "
                      "no longer row (sm_90): the same entries",
    "silu_fold": "Plan.SFO, the SiLU folded into gate_up: each slot's last gate_up tile (a counter a slot) runs "
                 "the slot's SiLU, so hand-off 19 and the SiLU stage go (sm_90): the same bits",
    "index_prefetch": "Plan.ISP, the index scores' loop reading the page table two tiles ahead and requesting "
                      "the next tile's keys and scales into the L2 while a tile computes (sm_90; the same bits)",
    "radix_prefix_once": "Plan.TKP, the top-k stages (radix passes 1-3, counts, write) running a program's tiles "
                         "as a contiguous run and deriving a row's threshold digits once a run, not once a tile "
                         "(the same integers; a TP8 rank's sm_90 default; False: a tile's threshold derived "
                         "once a tile)",
    "postnorm_spread": "Plan.PNC, the post-attention norm's rows cut into chunks dealt over the programs as "
                       "norm_spread cuts addnorm's, each chunk's program summing its whole row's squares as the "
                       "one-program form does (the same bits)",
    "oproj_hw_quant": "Plan.OHQ, o_proj's input (bf16 from the value projection, not quantised by its producer) "
                      "quantised in its spans on sm_90's conversion unit instead of the integer form: the same "
                      "bits; the span's sm_90 code 19.1 -> 13.6 KB (Triton 3.8, [6144 x 2048] at 2 rows). The "
                      "sm_90 default (`isa_options`); False: the integer form",
    "qb_pair": "Plan.QBP 1, q_b and the indexer's wq_b (both over q_a's normed row) as one loop over each program's "
               "span of each (mono-common gemv_span_pair), where the default runs two inlined span loops: one copy "
               "of the span's code instead of two, the same partials (the same bits); with the indexer only",
    "qb_joint": "Plan.QBP 2, q_b's column tiles then the indexer's wq_b's as one stream-K GEMV (mono-common "
                "gemv_span_joint): where each alone gives a program one or two (column tile, K block) items (a TP8 "
                "rank: q_b 1, wq_b 2, two round trips), the joint spans give it three in one pipelined K loop, "
                "and each tile fewer partial slots (16 and 9 -> 6), so absorb and the index scores sum fewer: "
                "other sums of the same products (other bits); the stage's sm_90 code as qb_pair's; with the "
                "indexer only, not with qb_pair. A TP8 rank's sm_90 default with the indexer since mono-glm53 "
                "0.3.26 (`default_knobs`; naming qb_pair leaves it out; False: the two span loops)",
    "mlacomb_vec": "Plan.MCV, the MLA combine's chunks of a tile as one load and block reductions (mono-common "
                   "mla_combine VEC), where the default sums them in chunk order unrolled (the stage's sm_90 code "
                   "9.7 -> 6.4 KB); its sums in the reductions' order. H100, session 35, ctx 4096: mlacomb 3.3 -> "
                   "1.9 us at 1 row, 4.9 -> 3.2 at 8; the layer 160.8 / 287.4 against 161.1 / 291.7",
    "postnorm_split": "Plan.PNS, the post-attention norm as two passes over (row, 128-column chunk) items on "
                      "every program with a hand-off between: the chunks' residuals and sums of squares, then "
                      "each row's rstd from its chunks' sums and the chunks' norm (one rank; its squares summed "
                      "in another order). Built in session 35 to take the one-program norm's ~150 KB off one SM "
                      "(postnorm 8.5 us at 1 row, H100); its fused form has not run on a GPU yet",
    "postnorm_loop": "Plan.PNL, the post-attention norm's row walked in chunks by its program (each chunk's "
                     "split-K slots loaded together), twice, where the default holds it as one [4, HB] tile "
                     "(the stage's sm_90 code 18.2 -> 12.2 KB); its squares summed in another order. H100, "
                     "session 35, ctx 4096: postnorm 8.5 -> 8.8 us at 1 row, the layer 160.3 / 291.4 against "
                     "161.1 / 291.7: the stage is bound by the bytes its one program reads (six o_proj slots: "
                     "with oproj_fixup's one slot it took 6.0 us, 4.0 spread), not by its code",
    "prefetch_programs": "Plan.PFN, the programs that request the weights into the L2 ahead of their stages: "
                         "the last N of the grid (1..nprog), true for every program, or 0 for no weight prefetch "
                         "at all (sm_90; a TP8 rank's default is 0, other shapes' every program)",
    "prefetch_bulk": "Plan.PFB, the weights' L2 prefetches (prefetch_sites, prefetch_programs, the routed "
                     "down slots) as sm_90's bulk prefetches, 16 KB an instruction, not a line a lane (sm_90; "
                     "needs prefetches: a TP8 rank's default issues none)",
    "prefetch_sites": "Plan.PFS, where the weights are requested into the L2: a list of sites, each once, of "
                      "start (q_a/kv_a and the index wk / weights_proj at the launch's start), qb (q_b and the "
                      "index wq_b after q_a/kv_a) or latent (the same after hand-off 2, once every q_a/kv_a load "
                      "is done), oproj (o_proj, the router and the shared expert after absorb) or oproj_late (the "
                      "same after the index scores) or topk (the same after hand-off 7, where a short step's top-k "
                      "reads only the L2), down (the routed experts' down rows after gate_up); by every program "
                      "unless prefetch_programs says (sm_90; the default where "
                      "prefetches are on: start, qb, oproj, down)",
    "topk_row": "Plan.TKR, a step whose rows all have at most this many tokens (a power of two in 256..4096; "
                "true: 4096) taking its whole top-k in one stage, one program a row, its other four top-k "
                "hand-offs only signalled (sm_90, with the first radix pass in the index scores, whose "
                "histogram seeds the row's search: the keys of the threshold's top digit, if at most 512, "
                "packed and searched alone; the scans over 1024-key chunks): the same entries and as fast "
                "as the radix stages (H100, served TP8 shard, ctx 4096, 1 row, session 34: the layer 156.4 "
                "us against 158.0, the row stage 22.8 us against the radix stages' 23.0; unchunked ~34.4). "
                "Before: 166.3 -> 206.4 us (the unrolled search, row top-k ~60 us); the looped search "
                "157.5 -> 161.4, row top-k ~28 us (session 31-33)",
    "topk_spread": "Plan.TKS, a step whose rows all have at most this many tokens (a power of two in 256..4096; "
                   "true: 4096) taking its top-k in two stages on every program, its other three top-k hand-offs "
                   "only signalled (sm_90, with the first radix pass in the index scores): the tiles holding keys "
                   "of the threshold's top digit (from that pass's histogram) count the row's keys of that digit "
                   "above each of them, which finds the threshold; then every tile places its keys after the "
                   "row's earlier keys, counted in one sum: the same entries as the radix stages. The "
                   "candidates are the keys of the threshold's top 16 bits, from a fine histogram the index "
                   "scores add beside the first pass's (3 of 4096 keys in the bench's case, CPU reference); "
                   "with the top 8 bits (1115 keys there) the layer was slower: H100, served TP8 shard, ctx "
                   "4096, session 36: 161.0 / 336.2 us against 157.5 / 282.2, the threshold stage 19.2 / 75.6 "
                   "us. The fine form, session 37, beside the radix stages in one call: 151.6 / 284.5 us against "
                   "156.7 / 286.3. A TP8 rank's sm_90 default (`default_knobs`; false: the radix stages)",
    "topk_spread_select": "Plan.TSS, with topk_spread (named or a TP8 rank's sm_90 default): each tile of a long "
                          "row finds the row's threshold itself (histogram 0 and the fine bins give its top 16 "
                          "bits, the row's keys of those bits in registers its low 16, one bit a step) and places "
                          "its keys, the top-k in stage 7 alone, hand-offs 8-11 only signalled: one hand-off and "
                          "the thresholds' stage fewer, a fixed amount of work a tile however many keys tie (the "
                          "same entries as the radix stages; sm_90). Not yet timed",
    "topk_row_absorb": "Plan.TKA, a step that takes the row top-k (topk_row) runs the W_UK absorption and "
                       "q_pe RoPE tiles in stage 7 on the programs without a row, beside the row top-k, and "
                       "only the index tiles in stage 4: the absorption (~6 us at 1 row) off the index scores' "
                       "path (sm_90, with topk_row; the same bits). H100, ctx 4096, session 33: the absorb "
                       "stage 6.0 -> 3.3 us, the layer 162.0 -> 158.7 us at 1 row and 291.4 -> 283.4 at 8 "
                       "against topk_row alone, the default 157.1 / 284.1 (beside the 4-bit search since "
                       "removed, session 32: 182.3 -> 179.7 and 319.5 -> 311.8)",
    "wuv_combine": "Plan.WCB, the value projection's tiles (a head and 32 columns each) combining their head's "
                   "MLA chunks themselves, as the combine stage would, so hand-off 14 and the combine stage go "
                   "(sm_90; the same bits; each head combined once per tile of it): slower (H100, served TP8 shard, ctx 4096: "
                   "the layer 157.9 -> 229.3 us at 1 row, the value projection's stage 3.8 -> 79.5 us)",
    "mla_hold": "Plan.HOLD and CT, the MLA stage's chunks of this many selected tokens (16 or 32; true: 32) with "
                "their latent keys loaded once and held for both products (mono_common.stages.mla HOLD), where "
                "the default streams 64-token chunks' keys 64 columns at a time twice (sm_90; the scores as one "
                "dot may round otherwise: the bits of a build of its own, near the reference as the default's): slower "
                "in the layer (H100, served TP8 shard, ctx 4096: 157.9 -> 170.1 us at 1 row with 32 tokens, the "
                "combine summing 64 chunks 3.4 -> 5.8 us and the MLA stage 11.0 -> 15.3 us), though faster alone",
    "mla_chunk": "Plan.CT, the MLA stage's chunks of this many selected tokens (16 or 32) streamed as the "
                 "default's 64 are, so 2 or 4 times the tiles over the programs (a TP8 rank at 1 row: 32 tiles of "
                 "64 on 264 programs), the combine summing 2 or 4 times the chunks (sm_90; the sums over other "
                 "chunks: the bits of a build of its own, near the reference as the default's; best with "
                 "mlacomb_vec, whose combine's code does not grow with the chunks). H100, served TP8 shard, "
                 "ctx 4096, with mlacomb_vec, session 36: 32 tokens 156.5 / 288.2 us, 16 tokens 155.3 / 305.3, "
                 "against 157.5 / 282.2 (mla 11.0 -> 8.9 / 8.1 us at 1 row, 15.2 -> 19.7 / 30.9 at 8)",
    "norm_in_router": "Plan.NIR, the post-attention norm in the router's programs: each derives the rows' rstd "
                      "(a whole-row tile, as the norm stage's) and the h2 it reads, the (row, block) items write "
                      "res_out and h2; the norm stage is the all-reduce alone and hand-off 17 goes (sm_90; turns "
                      "oproj_fixup on, so a row is one o_proj slot to read; the same bits): slower (H100, served TP8 "
                      "shard, ctx 4096: 157.9 -> 159.9 us at 1 row, 279.0 -> 296.6 at 8; the router's stage 4.5 -> "
                      "14.1 us where the norm's 8.5 went)",
    "absorb_gather": "Plan.ABG, the W_UK absorption tiles (a head and 64 columns each) requesting their three "
                     "64-row weight blocks first and summing q_nope's q_b partial slots once for all its 192 "
                     "columns (8 slots' loads in flight a round at width 2, 2 at width 8), where the default sums them per "
                     "64-row block, 4 slots a round (12 dependent rounds at a TP8 rank); the q_pe RoPE items "
                     "tiles of their own after the index tiles, not ahead of a head's first absorption tile "
                     "(sm_90; the same bits): a little faster (H100s, served TP8 shard, ctx 4096, the layer at 1 "
                     "row 157.0 -> 155.3 us in session 30, 159.7 -> 159.0 in session 31, the absorb stage 6.0 -> "
                     "4.0 us; 8 rows 279.1 -> 278.9 and 290.6 -> 287.2; session 33 157.1 -> 154.5 and 284.1 -> "
                     "284.0). A TP8 rank's sm_90 default at most 8 rows since mono-glm53 0.3.26 (`default_knobs`; "
                     "false: per 64-row block); under Triton 3.6 it spills more (width 2: 28 bytes, without it 4)",
    "code_pad": "Plan.PADS, PADKB: [stage, KB], KB of code every program runs after the hand-off into stage "
                "1..20 (a probe: KB > 0 straight-line, each instruction fetched once; KB < 0 the same "
                "multiply-adds from a hot loop; what a KB of code costs there)",
}
# Knobs timed on the H200 and removed, none faster than the default (results README): session
# 20's, their code on branch wip/s19-stages: handoff_flag, mla_stages, qkva_fixup, qb_fixup,
# norm_in_qkva, gateup_stages, latent_late, down_id_vector; session 21's, its code in commit
# 3f5b139: weights_before_wait; session 30's (on an H100), their code in commit 8929f17:
# handoff_loads, handoff_split; session 31's (on an H100), its code in commit ce9db35: gemv_call


# where next_layer_prefetch may request the next layer's first weights: the attention's quiet
# stretch, or the MoE (later: less of the L2 turns over before the next launch reads them)
NEXT_PREFETCH_STAGES = {"mla": 12, "gateup": 18, "down": 20}
# the code_pad probe's largest size: 128 KB of straight-line code compiles in ~40 s on one core
PAD_MAX_KB = 128


def addnorm_chunks(s: GlmLayerShape, width: int, nprog: int, hb: int) -> int:
    """Chunks a row for `norm_spread` and `postnorm_spread`: the most (each a power-of-two count
    of blocks, dividing the hidden size) with every (row, chunk) item on a program of its own,
    else the fewest; 0 where the hidden size is not whole blocks or not within the [4, HB] row
    tile the chunks' programs sum the row in."""
    h, blk = s.hidden, s.block
    if h % blk or h // hb > 4:
        return 0
    sizes = [blk << i for i in range((h // blk).bit_length()) if h % (blk << i) == 0]
    fit = [h // cb for cb in sizes if width * (h // cb) <= nprog]
    return max(fit) if fit else h // sizes[-1]


def addnorm_default(isa: str, s: GlmLayerShape, width: int, nprog: int, hb: int) -> int:
    """Plan.ANC of a build for `isa`: on sm_90 addnorm's rows spread in `addnorm_chunks` chunks
    over the programs (what the knob `norm_spread` set before 0.3.21; `norm_spread: false` gives
    one program a row back), 0 (one program a row) on gfx950, where it is not timed.

    The same bits (each chunk's program sums its whole row's squares as the one-program form
    does; the GPU knob test at 2 and 8 rows, session 25). Timed as a knob, TP8 shard, ctx 4096:
    addnorm's stamp 8.7 -> 7.2 us at 1 row and the layer 178.4 -> 176.7 us at 1 row, 317.9 ->
    315.5 at 8 (H100, session 24); addnorm 7.6 -> 6.0-6.1 us at 1 and 8 rows on the H200 beside
    other knobs (session 24). Its one program a row ran ~20 KB of straight-line code once; a
    chunk's program runs ~7.5 KB. Spills (TP8 rank, world 8): 0 under Triton 3.8 at 2 and 8
    rows; under 3.6 8 bytes at 2 rows (36 with one program a row), none at 8."""
    return addnorm_chunks(s, width, nprog, hb) if isa.startswith("sm") else 0


def folded_handoffs(plan: Plan) -> tuple[int, ...]:
    """The hand-offs a launch of `plan` does not run, the stages either side of each being one
    (Plan.TKF: the first radix pass in the index scores' stage, hand-off 6; Plan.WCB: the MLA
    combine in the value projection's stage, hand-off 14; Plan.NIR: the post-attention norm in
    the router's stage, hand-off 17; Plan.SFO: the SiLU in gate_up's stage, hand-off 19); the
    emptied stage's stamps span ~0."""
    return ((6,) if plan.TKF else ()) + ((14,) if plan.WCB else ()) + ((17,) if plan.NIR else ()) + \
        ((19,) if plan.SFO else ())


def _oproj_counters(s: GlmLayerShape, plan: Plan) -> tuple[int, int, int, int, int]:
    """(first counter word, words there, N, K, PER) of o_proj's column-tile counters (Plan.FIX9):
    where they sit in the counter buffer (`stages.FIXOP`) and what `gemv.tile_spans` counts."""
    from mono_glm53.kernels.stages import CNT_WORDS, FIXOP

    return FIXOP.value, CNT_WORDS.value - FIXOP.value, s.hidden, s.heads_per_rank * s.v_head, plan.PER9


def _gateup_split(s: GlmLayerShape, bn: int, nprog: int) -> int:
    """gate_up's split-K for `bn`-column tiles: the balanced rule over one row's 1 + top_k slots
    (the plan does not know a step's distinct experts), capped at 6 (`make_plan`)."""
    return _pick_ks(_cdiv(2 * s.moe_inter_per_rank, bn) * (1 + s.top_k), s.hidden // s.block, nprog, cap=6,
                    rule="balanced")


def _row_chunks(knob: str, s: GlmLayerShape, plan: Plan, nprog: int, errors: list[str]) -> int:
    """`addnorm_chunks` for a knob that spreads a norm's rows (norm_spread, postnorm_spread),
    the reason in `errors` where the row cannot be cut (0)."""
    nc = addnorm_chunks(s, plan.W, nprog, plan.HB)
    if nc == 0:
        errors.append(f"{knob} needs the hidden size {s.hidden} in at most 4 row tiles of "
                      f"{plan.HB} and a multiple of its block {s.block}")
    return nc


def _row_tokens(knob: str, v, lo: int, hi: int, errors: list[str]) -> int:
    """A knob's row length in tokens (true: 4096), or 0 with the reason in `errors` where it is
    not a power of two in lo..hi."""
    v = 4096 if v is True else v
    if not isinstance(v, int) or v & (v - 1) or not lo <= v <= hi:
        errors.append(f"{knob} {v} is not true or a power of two in {lo}..{hi}")
        return 0
    return v


def _short_topk_refusal(knob: str, plan: Plan, change: dict[str, object]) -> str | None:
    """Why a short step's top-k form (`topk_row`, `topk_spread`) cannot be built on `plan` with
    the knobs' `change` so far, or None: both need the indexer, the first radix pass in the index
    scores (whose histogram seeds them) and the unrolled radix passes (their fallback)."""
    if not plan.INDEXER:
        return f"{knob} needs the indexer (a layer without one has no top-k)"
    if not change.get("TKF", plan.TKF) or change.get("TKL", plan.TKL):
        return (f"{knob} takes the first radix pass in the index scores and the unrolled passes: "
                "build it without hist_in_scores false and without radix_loop")
    return None


def _absorb_gather_refusal(s: GlmLayerShape, W: int) -> str | None:
    """Why `absorb_gather` cannot be built for shape s at W rows, or None."""
    bkn = 64 if s.qk_nope % 64 == 0 else (32 if s.qk_nope % 32 == 0 else 16)
    if s.qk_nope > 256 or s.qk_nope // bkn > 4 or W > 8:
        return (f"absorb_gather takes q_nope ({s.qk_nope}) in at most 4 blocks of {bkn} and 256 columns "
                f"at most 8 rows (not {W}): build without it")
    return None


# prefetch sites that request the same weights at different points: a build names one of each
_SAME_WEIGHT_SITES = (("qb", "latent"), ("oproj", "oproj_late", "topk"))


def _prefetch_sites(sites, programs, plan: Plan, hip: bool, change: dict[str, object], errors: list[str]) -> None:
    """Plan.PFS from the knob `prefetch_sites` (site names, `stages.PFS_SITES`), into `change`,
    or the reasons it is refused into `errors`. A build without prefetches (PFN -1, a TP8 rank's
    sm_90 default) gets them from every program, unless `prefetch_programs` is given too."""
    from mono_glm53.kernels.stages import PFS_SITES

    names = sorted(PFS_SITES)
    if hip:
        errors.append("prefetch_sites places sm_90's L2 prefetches: gfx950 has none, build without it")
        return
    if not isinstance(sites, (list, tuple)) or not sites or not all(isinstance(x, str) for x in sites):
        errors.append(f"prefetch_sites {sites!r} is not a non-empty list of site names ({names}); "
                      "for no prefetch at all set prefetch_programs 0")
        return
    bad = sorted(set(sites) - set(PFS_SITES))
    twice = len(set(sites)) != len(sites)
    if bad:
        errors.append(f"prefetch_sites {bad} are not sites (known: {names})")
    if twice:
        errors.append(f"prefetch_sites {list(sites)} names a site twice")
    for group in _SAME_WEIGHT_SITES:
        same = [x for x in group if x in sites]
        if len(same) > 1:
            errors.append(f"prefetch_sites {' and '.join(same)} request the same weights: name one of them")
    if type(programs) is int and programs == 0:
        errors.append("prefetch_sites with prefetch_programs 0 (no prefetch) requests nothing: drop one of them")
    if bad or twice:
        return
    change["PFS"] = sum(PFS_SITES[x] for x in sites)
    if programs is None and plan.PFN < 0:
        change["PFN"] = 0


def _with_knobs(plan: Plan, s: GlmLayerShape, nprog: int, knobs: dict[str, object], hip: bool = False) -> Plan:
    """`plan` with GlmLayerKernel's measurement knobs (`KNOBS`; a None value: the plan's);
    every unknown knob and out-of-range value refused at once, each with what is allowed."""
    kb = s.hidden // s.block
    errors, change = [], {}
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        errors.append(f"unknown knobs {unknown} (known: {sorted(KNOBS)})")
    k = {n: v for n, v in knobs.items() if v is not None and n in KNOBS}
    # the knobs that take one of a few integers
    for name, field, allowed, what in (
            ("down_step", "DSTEP", (1, 2), "1 or 2"),
            ("gateup_dot", "GDOT", (0, 1), "0 or 1 (the e4m3 MMA form sums off SGLang's)")):
        if name in k:
            if k[name] not in allowed:
                errors.append(f"{name} {k[name]} is not {what}")
            change[field] = int(k[name])
    for name, field in (("gateup_split", "KSG"), ("index_split", "KSI")):
        if name in k:
            v = k[name]
            if v < 1 or kb % v:
                errors.append(f"{name} {v} does not divide the {kb} K blocks of the hidden size")
            change[field] = int(v)
    if "qkva_programs" in k:
        qp = k["qkva_programs"]
        if qp and not 0 < qp < nprog:
            errors.append(f"qkva_programs {qp} is not 0 (no split) or in 1..{nprog - 1}")
        elif qp and not plan.INDEXER:
            errors.append("qkva_programs needs the indexer (its tiles run on the other programs)")
        else:
            per1 = span_per(s.qkv_a_out, s.hidden, BNS, s.block, qp or nprog)
            change.update(P1=int(qp), PER1=per1, KS1=span_slots(s.hidden, s.block, per1))
    if "index_tile" in k:
        it = k["index_tile"]
        if it & (it - 1) or not 16 <= it <= 256:
            errors.append(f"index_tile {it} is not a power of two in 16..256")
        change["TB"] = int(it)
    if k.get("oproj_fixup"):
        change["FIX9"] = True
        _, room, n, _, _ = _oproj_counters(s, plan)
        if _cdiv(n, BNS) > room:
            errors.append(f"oproj_fixup counts {_cdiv(n, BNS)} column tiles; the counter buffer holds {room}")
    # gfx950 (Triton 3.8 compile checks, TP8 rank, session 19): the first pass in the index
    # scores takes 236 -> 244 VGPRs, no spills
    if "hist_in_scores" in k:
        change["TKF"] = bool(k["hist_in_scores"])
    # sm_90's conversions, a bool each, only off on gfx950: its fp32 -> e4m3 cast has not been
    # checked against torch on hardware here (hw_quant), and the e4m3 -> f16 forms are PTX
    for name, field, what in (("hw_quant", "HWQ", "sm_90's conversion unit"),
                              ("moe_f16", "MF16", "sm_90's e4m3 -> f16 conversion"),
                              ("index_f16", "IF16", "sm_90's e4m3 -> f16 conversion")):
        if name in k:
            if k[name] and hip:
                errors.append(f"{name} is {what}: on gfx950 build without it")
            change[field] = bool(k[name])
    if "down_ids" in k:
        if k["down_ids"] and not plan.DSTG:
            errors.append("down_ids is a form of down's pipelined slot loop, which this build does not have "
                          "(sm_90 at a TP8 rank): build without it")
        change["DIDV"] = bool(k["down_ids"])
    if k.get("down_items"):
        from mono_glm53.kernels.stages import CNT_WORDS, DITC

        bnd = 32 if k["down_items"] is True else k["down_items"]
        if hip:
            errors.append("down_items is an sm_90 form (gfx950 spills ~80 scalar registers at 8 rows): build "
                          "without it")
        elif bnd not in (32, 64):
            errors.append(f"down_items {k['down_items']!r} is not true, 32 or 64 (its column tile)")
        elif bnd > plan.BLK:
            errors.append(f"down_items {bnd} is wider than the weights' scale block {plan.BLK}: take 32 or less")
        elif plan.W > 8:
            errors.append(f"down_items combines at most 8 rows, not {plan.W}")
        elif plan.H % bnd or plan.H // bnd > CNT_WORDS.value - DITC.value:
            errors.append(f"down_items counts {plan.H} / {bnd} column tiles; the counter buffer holds "
                          f"{CNT_WORDS.value - DITC.value}")
        else:
            change["DIT"] = True
            change["BND"] = bnd
            # the items' loop depth: the slot loop's where this build pipelines it
            change["DSTG"] = plan.DSTG or 3
    if k.get("silu_fold"):
        from mono_glm53.kernels.stages import CNT_WORDS, SLOTC

        if hip:
            errors.append("silu_fold is not resource-checked on gfx950: build without it")
        elif plan.NSLOT > CNT_WORDS.value - SLOTC.value:
            errors.append(f"silu_fold counts {plan.NSLOT} slots; the counter buffer holds "
                          f"{CNT_WORDS.value - SLOTC.value}")
        else:
            change["SFO"] = True
    if k.get("wuv_combine"):
        if hip:
            errors.append("wuv_combine is not resource-checked on gfx950: build without it")
        else:
            change["WCB"] = True
    if k.get("norm_in_router"):
        if hip:
            errors.append("norm_in_router is not resource-checked on gfx950: build without it")
        elif plan.R > 1:
            errors.append(f"norm_in_router is built for one rank alone (the bench's shard): its {plan.R}-rank "
                          "all-reduce form has not run on a GPU; build without it")
        elif k.get("postnorm_spread"):
            errors.append("norm_in_router and postnorm_spread both place the post-attention norm: name one of them")
        elif s.hidden > 4 * plan.HB:
            errors.append(f"norm_in_router takes a row as one [4, {plan.HB}] tile; the hidden size {s.hidden} "
                          "is wider: build without it")
        elif k.get("oproj_fixup") is False:
            errors.append("norm_in_router reads one o_proj slot a row (oproj_fixup): drop oproj_fixup False")
        else:
            change.update(NIR=True, FIX9=True)
            _, room, n, _, _ = _oproj_counters(s, plan)
            if _cdiv(n, BNS) > room:
                errors.append(f"norm_in_router's oproj_fixup counts {_cdiv(n, BNS)} column tiles; the counter "
                              f"buffer holds {room}")
    if k.get("mla_hold"):
        from mono_common.stages.mla import HOLD_KEYS

        ct = 32 if k["mla_hold"] is True else k["mla_hold"]
        if hip:
            errors.append("mla_hold is not resource-checked on gfx950: build without it")
        elif ct not in (16, 32) or ct * s.kv_lora > HOLD_KEYS.value or s.index_topk % ct:
            errors.append(f"mla_hold {k['mla_hold']!r} is not 16 or 32 tokens a chunk with a chunk's keys "
                          f"({s.kv_lora} values a token) at most {HOLD_KEYS.value} values and dividing the "
                          f"top-k {s.index_topk}")
        else:
            change.update(HOLD=True, CT=int(ct))
    if k.get("mla_chunk"):
        ct = k["mla_chunk"]
        if hip:
            errors.append("mla_chunk is not resource-checked on gfx950: build without it")
        elif k.get("mla_hold"):
            errors.append("mla_chunk and mla_hold each set the MLA stage's chunk: name one of them")
        elif isinstance(ct, bool) or ct not in (16, 32) or s.index_topk % ct:
            errors.append(f"mla_chunk {ct!r} is not 16 or 32 tokens a chunk dividing the top-k {s.index_topk}")
        else:
            change["CT"] = int(ct)
    if k.get("count_in_write"):
        v = _row_tokens("count_in_write", k["count_in_write"], 16, 8192, errors)
        if hip:
            errors.append("count_in_write is not resource-checked on gfx950: build without it")
        elif v:
            change["TKW"] = v
    # gfx950 (Triton 3.8, TP8 rank, width 2): the loop spilled 38 registers
    if k.get("radix_loop"):
        if hip:
            errors.append("radix_loop spills gfx950's registers: on gfx950 build without it")
        change["TKL"] = True
    if k.get("norm_spread"):
        change["ANC"] = _row_chunks("norm_spread", s, plan, nprog, errors)
    elif "norm_spread" in k:
        change["ANC"] = 0
    if k.get("absorb_gather"):
        why = _absorb_gather_refusal(s, plan.W)
        if hip:
            errors.append("absorb_gather is not resource-checked on gfx950: build without it")
        elif why:
            errors.append(why)
        else:
            change["ABG"] = True
    if k.get("handoff_spin"):
        if hip:
            errors.append("handoff_spin is sm_90 inline assembly: gfx950 builds without it")
        else:
            change["HSP"] = True
    if k.get("sync_call"):
        if hip:
            errors.append("sync_call is sm_90's: gfx950's call ABI clobbers the scalar registers")
        change["SYC"] = True
    if k.get("next_layer_prefetch") is not None:
        nx = k["next_layer_prefetch"]
        if nx not in NEXT_PREFETCH_STAGES:
            errors.append(f"next_layer_prefetch {nx!r} is not one of {sorted(NEXT_PREFETCH_STAGES)}")
        elif hip:
            errors.append("next_layer_prefetch is sm_90's L2 prefetch: gfx950 has no such instruction")
        else:
            change["NXS"] = NEXT_PREFETCH_STAGES[nx]
    if k.get("index_prefetch"):
        if hip:
            errors.append("index_prefetch is sm_90's L2 prefetch: gfx950 has none, build without it")
        elif not plan.INDEXER:
            errors.append("index_prefetch needs the indexer (a layer without one has no index scores)")
        else:
            change["ISP"] = True
    if k.get("radix_prefix_once"):
        if hip:
            errors.append("radix_prefix_once is not resource-checked on gfx950: build without it")
        elif change.get("TKL", plan.TKL):
            errors.append("radix_prefix_once takes the unrolled radix passes: build it without radix_loop")
        else:
            change["TKP"] = True
    elif "radix_prefix_once" in k or change.get("TKL"):
        # the default's contiguous runs (a TP8 rank on sm_90) are a form of the unrolled passes:
        # radix_loop builds the per-tile form
        change["TKP"] = False
    if k.get("postnorm_spread"):
        if hip:
            errors.append("postnorm_spread is not resource-checked on gfx950: build without it")
        elif plan.R > 1:
            errors.append(f"postnorm_spread is built for one rank alone (the bench's shard): its {plan.R}-rank "
                          "form, which norms the all-reduced rows, has no test yet; build it at world 1")
        else:
            change["PNC"] = _row_chunks("postnorm_spread", s, plan, nprog, errors)
    if k.get("postnorm_loop"):
        if hip:
            errors.append("postnorm_loop is not resource-checked on gfx950: build without it")
        elif k.get("postnorm_spread") or k.get("norm_in_router"):
            errors.append("postnorm_loop, postnorm_spread and norm_in_router each place the post-attention norm: "
                          "name one of them")
        else:
            change["PNL"] = True
    if k.get("postnorm_split"):
        others = [n for n in ("postnorm_loop", "postnorm_spread", "norm_in_router") if k.get(n)]
        if hip:
            errors.append("postnorm_split is not resource-checked on gfx950: build without it")
        elif plan.R > 1:
            errors.append(f"postnorm_split is built for one rank alone (the bench's shard, TP1): its {plan.R}-rank "
                          "form norms the all-reduced rows; build it at world 1")
        elif others:
            errors.append(f"postnorm_split and {', '.join(others)} each place the post-attention norm: name one of them")
        elif s.hidden % plan.BLK:
            errors.append(f"postnorm_split cuts rows into {plan.BLK}-column chunks; the hidden size {s.hidden} is not "
                          "a multiple: build without it")
        else:
            change["PNS"] = plan.BLK
    if "oproj_hw_quant" in k:
        if k["oproj_hw_quant"] and hip:
            errors.append("oproj_hw_quant is sm_90's conversion unit: gfx950 has none, build without it")
        else:
            change["OHQ"] = bool(k["oproj_hw_quant"])
    if k.get("qb_pair") and k.get("qb_joint"):
        errors.append("qb_pair and qb_joint are two forms of the q_b and wq_b spans: name one of them")
    elif k.get("qb_pair") or k.get("qb_joint"):
        name = "qb_pair" if k.get("qb_pair") else "qb_joint"
        if not plan.INDEXER:
            errors.append(f"{name} runs q_b beside the indexer's wq_b: a build without the indexer has q_b alone, "
                          "build without it")
        elif name == "qb_pair":
            change["QBP"] = 1
        else:
            # both GEMVs' column tiles as one GEMV's: q_b's tiles then wq_b's, spans over all
            nqb = _cdiv(plan.NH * s.qk_head, BNS) * BNS
            perj = span_per(nqb + s.index_heads * s.index_head_dim, s.q_lora, BNS, s.block, nprog)
            ksj = span_slots(s.q_lora, s.block, perj)
            change.update(QBP=2, PER3=perj, PERQ=perj, KS3=ksj, KSQ=ksj)
    if k.get("mlacomb_vec"):
        if hip:
            errors.append("mlacomb_vec is not resource-checked on gfx950: build without it")
        elif k.get("wuv_combine"):
            errors.append("mlacomb_vec is the combine stage's form; wuv_combine leaves that stage empty: "
                          "name one of them")
        else:
            change["MCV"] = True
    if "prefetch_programs" in k:
        pn = k["prefetch_programs"]
        if hip:
            errors.append("prefetch_programs deals sm_90's L2 prefetches: gfx950 has none, build without it")
        elif pn is True:
            change["PFN"] = 0
        elif isinstance(pn, bool) or not isinstance(pn, int) or not 0 <= pn <= nprog:
            errors.append(f"prefetch_programs {pn!r} is not 0 (no weight prefetch), a program count in 1..{nprog} "
                          "or true (every program)")
        else:
            change["PFN"] = -1 if pn == 0 else (0 if pn == nprog else pn)
    if "prefetch_sites" in k:
        _prefetch_sites(k["prefetch_sites"], k.get("prefetch_programs"), plan, hip, change, errors)
    if k.get("prefetch_bulk"):
        if hip:
            errors.append("prefetch_bulk is sm_90's bulk L2 prefetch: gfx950 has none, build without it")
        elif change.get("PFN", plan.PFN) < 0:
            errors.append("prefetch_bulk changes how the weights' L2 prefetches are issued, and this build issues "
                          "none: name prefetch_sites or prefetch_programs too")
        else:
            change["PFB"] = True
    if k.get("topk_row"):
        v = _row_tokens("topk_row", k["topk_row"], 256, 4096, errors)
        why = _short_topk_refusal("topk_row", plan, change)
        if hip:
            errors.append("topk_row spills gfx950's registers at 4096 keys (27 VGPRs): build without it")
        elif why:
            errors.append(why)
        elif v:
            change["TKR"] = v
    if k.get("topk_spread"):
        from mono_common.stages.topk import spread_keys

        v = _row_tokens("topk_spread", k["topk_spread"], 256, 4096, errors)
        why = _short_topk_refusal("topk_spread", plan, change)
        if hip:
            errors.append("topk_spread is not resource-checked on gfx950: build without it")
        elif k.get("topk_row"):
            errors.append("topk_row and topk_spread each take a short step's top-k: name one of them")
        elif why:
            errors.append(why)
        elif v:
            change.update(TKS=v, RKS=spread_keys(plan.W, v, nprog))
    if k.get("topk_spread_select"):
        if hip:
            errors.append("topk_spread_select is not resource-checked on gfx950: build without it")
        elif not change.get("TKS"):
            errors.append("topk_spread_select is a form of the spread top-k: build it with topk_spread (a TP8 "
                          "rank's sm_90 default), without topk_spread false, topk_row, radix_loop or "
                          "hist_in_scores false")
        else:
            change["TSS"] = True
    if k.get("topk_row_absorb"):
        if hip:
            errors.append("topk_row_absorb is sm_90's (it comes with topk_row): build without it")
        elif not (k.get("topk_row") or plan.TKR):
            errors.append("topk_row_absorb needs topk_row (it moves the absorption beside the row top-k)")
        else:
            change["TKA"] = True
    if "code_pad" in k:
        from mono_glm53.kernels.stages import STAGE_NAMES

        cp = k["code_pad"]
        st = kb_ = None
        if isinstance(cp, (list, tuple)) and len(cp) == 2 and isinstance(cp[1], int):
            st = STAGE_NAMES.index(cp[0]) if cp[0] in STAGE_NAMES else cp[0]
            kb_ = cp[1]
        looped = (6, 7, 8, 9) if change.get("TKL") else ()
        if not (isinstance(st, int) and 1 <= st < len(STAGE_NAMES) and kb_ and abs(kb_) <= PAD_MAX_KB
                and st not in folded_handoffs(dataclasses.replace(plan, **change)) and st not in looped):
            errors.append(f"code_pad {cp!r} is not [stage, KB]: a stage (name, or 1..{len(STAGE_NAMES) - 1}) "
                          f"whose hand-off the launch runs, not a pass of radix_loop, KB a nonzero integer "
                          f"of at most {PAD_MAX_KB} either sign")
        else:
            change.update(PADS=st, PADKB=kb_)
    if "gateup_bn" in k:
        bn = k["gateup_bn"]
        if bn not in (16, 32, 64, 128) or bn > 2 * s.block:
            errors.append(f"gateup_bn {bn} is not 16, 32, 64 or 128 (at most twice the block {s.block})")
        else:
            change["BNG"] = int(bn)
            if "gateup_split" not in k:
                change["KSG"] = _gateup_split(s, bn, nprog)
    if k.get("gateup_spans"):
        bn = int(k.get("gateup_bn", 128))
        if hip:
            errors.append("gateup_spans is not resource-checked on gfx950: build without it")
        elif "gateup_split" in k:
            errors.append("gateup_spans has no split-K (its partial count follows from the span length): "
                          "drop gateup_split")
        elif k.get("silu_fold"):
            errors.append("silu_fold counts split-K tiles, not spans: build gateup_spans without it")
        elif bn % 16 or bn > 2 * s.block:
            errors.append(f"gateup_spans takes a column tile of a multiple of 16 up to {2 * s.block}, not {bn}")
        elif plan.W > 2:
            # a form for 1-2 rows: alone at 8 rows the spans were slower (86 against 79 us, H100,
            # session 38), and the served TP8 build spills with them at widths 4 and 8 (4 and 24
            # bytes, Triton 3.8; none at width 2)
            errors.append(f"gateup_spans is a form for widths up to 2, not {plan.W}: build width {plan.W} "
                          "without it")
        else:
            # one row's slots (the shared expert and top_k) cut into one span a program
            per = _cdiv((1 + s.top_k) * _cdiv(2 * s.moe_inter_per_rank, bn) * kb, nprog)
            change.update(GSP=True, PERG=per, BNG=bn, GDOT=int(k.get("gateup_dot", 1)),
                          KSG=span_slots(s.hidden, s.block, per))
    if errors:
        raise ValueError("mono-glm53 layer kernel: " + "; ".join(errors))
    return dataclasses.replace(plan, **change)


def peer_requests(s: GlmLayerShape, width: int, world: int) -> list[tuple[str, int, str]]:
    """The peer regions a `world`-rank launch needs (mono_common.peer.allocate /
    allocate_local): per all-reduce point a bf16 mailbox [2][R][ARM][H] (ARM: the width rounded up
    to a power of two) and int32 flags [R][NBLK]."""
    p = make_tp_plan(s, width, True, 1, world)
    arm = 2 if width <= 2 else (4 if width <= 4 else 8)  # the kernel's mailbox rows (ARM)
    if width > 8:
        raise ValueError(f"width {width} > 8 is not built")
    mbox = 2 * world * arm * s.hidden * 2
    return [
        ("glm53.ar1.mbox", mbox, "data"), ("glm53.ar1.flags", world * (s.hidden // p.ARB) * 4, "flags"),
        ("glm53.ar2.mbox", mbox, "data"), ("glm53.ar2.flags", world * (s.hidden // p.BND) * 4, "flags"),
    ]


FAULT_ENV = "MONO_GLM53_FAULT"


def fault_stage(rank: int, env: str | None = None) -> int:
    """The stage hand-off this rank's program 0 skips (an injected wait fault), or -1.

    MONO_GLM53_FAULT="stage<S>" (every rank) or "rank<R>:stage<S>" (rank R only), S in
    1..20 (the hand-off into stage S, see stages.STAGE_NAMES); unset or empty: no fault."""
    from mono_glm53.kernels.stages import NSTAGES, STAGE_NAMES

    v = (os.environ.get(FAULT_ENV, "") if env is None else env).strip().lower()
    if not v:
        return -1
    want_rank, part = None, v
    if ":" in v:
        head, part = v.split(":", 1)
        if not head.startswith("rank") or not head[4:].isdigit():
            raise ValueError(f"{FAULT_ENV}={v!r}: expected 'rank<R>:stage<S>' or 'stage<S>'")
        want_rank = int(head[4:])
    if not part.startswith("stage") or not part[5:].isdigit() or not 1 <= int(part[5:]) < NSTAGES:
        raise ValueError(f"{FAULT_ENV}={v!r}: the stage must be 'stage<S>' with S in 1..{NSTAGES - 1} "
                         f"({', '.join(f'{i}={n}' for i, n in enumerate(STAGE_NAMES) if i)})")
    if want_rank is not None and want_rank != rank:
        return -1
    return int(part[5:])


_COS_SIN: dict[tuple, torch.Tensor] = {}


def cos_sin_cache(s: GlmLayerShape, n_pos: int, device) -> torch.Tensor:
    """fp32 [n_pos, rope] = cos | sin, the values `mono_common.ref.rope.rope_cos_sin` gives. One
    table per (rope dims, theta, positions, device), shared by every kernel object: at the
    served context a table is tens of MB, and the server builds one kernel per width."""
    from mono_common.ref.rope import rope_cos_sin

    key = (s.qk_rope, float(s.rope_theta), int(n_pos), str(torch.device(device)))
    if key not in _COS_SIN:
        pos = torch.arange(n_pos, device=device)
        c, sn = rope_cos_sin(pos, s.qk_rope, s.rope_theta)
        _COS_SIN[key] = torch.cat((c, sn), dim=-1).contiguous()
    return _COS_SIN[key]


def _index_weight_scales(s: GlmLayerShape) -> tuple[float, float]:
    """(iwa, iwb): the factors of the index head weights, as SGLang applies them."""
    if s.indexer_fused:
        # fused path: weights_raw * fp32(softmax_scale * ih^-0.5) * q_scale
        return float(torch.tensor(s.index_softmax_scale * s.index_heads ** -0.5, dtype=torch.float32)), 1.0
    # unfused: (mm * ih^-0.5) * q_scale * softmax_scale
    return s.index_heads ** -0.5, s.index_softmax_scale


# Programs of the persistent grid per SM (CUDA) or CU (ROCm). Two 4-warp programs fit on an
# H200 SM by registers (maxnreg 255) and shared memory, and keep twice the weight loads in
# flight: TP8 shard, ctx 4096, fused launch 346.6 -> 296.7 us at width 2 and 606.6 -> 449.2 us
# at width 8 (H200, one run side by side). MI355X keeps one a CU: not measured there.
PROGRAMS_PER_SM = {"cuda": 2, "hip": 1}


def default_nprog(device) -> int:
    """The grid of a launch on `device`: PROGRAMS_PER_SM times its SMs/CUs (on the CPU, for
    the interpreter, MONO_GLM53_INTERP_PROGRAMS or 3)."""
    device = torch.device(device)
    if device.type == "cuda":
        per = PROGRAMS_PER_SM["hip" if torch.version.hip else "cuda"]
        return per * torch.cuda.get_device_properties(device).multi_processor_count
    return int(os.environ.get("MONO_GLM53_INTERP_PROGRAMS", "3"))


def cooperative_launch_supported(device) -> bool:
    """Whether this Triton launches a grid cooperatively on `device`: its backend's compile
    options have `launch_cooperative_grid` (Triton 3.6 and 3.8, CUDA and HIP, do). This is the
    one place the choice is made; nothing is inferred from a launch that raised."""
    import dataclasses as dc

    if torch.device(device).type != "cuda":
        return False
    if torch.version.hip:
        from triton.backends.amd.compiler import HIPOptions as options
    else:
        from triton.backends.nvidia.compiler import CUDAOptions as options
    return "launch_cooperative_grid" in {f.name for f in dc.fields(options)}


def resident_per_sm(n_regs: int, shared_bytes: int, num_warps: int, props) -> int:
    """Programs of a compiled kernel (registers a thread, shared memory, warps) one SM holds at
    once, from the device's properties (NVIDIA: registers allocated in 256-register warp
    granules, 1 KiB of shared memory reserved per program)."""
    warp = int(getattr(props, "warp_size", 32) or 32)
    by_threads = props.max_threads_per_multi_processor // (num_warps * warp)
    per_warp = -(-max(1, n_regs) * warp // 256) * 256
    by_regs = props.regs_per_multiprocessor // (per_warp * num_warps)
    by_smem = props.shared_memory_per_multiprocessor // (shared_bytes + 1024) if shared_bytes else by_threads
    return max(0, min(by_threads, by_regs, by_smem, 32))


def check_co_resident(compiled, nprog: int, device) -> None:
    """Refuse a plain (non-cooperative) launch of `nprog` programs of `compiled` that the device
    cannot hold at once: its programs wait for each other, so such a grid would stall until
    every wait's deadline."""
    if torch.version.hip:
        raise RuntimeError("mono-glm53 layer kernel: a plain launch on ROCm has no co-residency check; "
                           "use a Triton whose HIP backend has launch_cooperative_grid")
    props = torch.cuda.get_device_properties(device)
    if getattr(compiled, "n_regs", None) is None and hasattr(compiled, "_init_handles"):
        compiled._init_handles()
    md = compiled.metadata
    per = resident_per_sm(int(compiled.n_regs), int(md.shared), int(md.num_warps), props)
    fits = per * props.multi_processor_count
    if nprog > fits:
        raise RuntimeError(
            f"mono-glm53 layer kernel: {nprog} programs cannot be co-resident on {props.name}: "
            f"{per} fit an SM ({compiled.n_regs} registers, {md.shared} B shared memory, {md.num_warps} warps), "
            f"{fits} the device; build with nprog <= {fits}")


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Same device, an index-less CUDA device being the current one."""
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    cur = torch.cuda.current_device()
    return (cur if a.index is None else a.index) == (cur if b.index is None else b.index)


def _capturing(device) -> bool:
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


class GlmLayerKernel:
    """One built variant (shape, width, indexer) with its static buffers and counters."""

    def __init__(self, s: GlmLayerShape, weights: dict[str, torch.Tensor], width: int,
                 max_seq_len: int, indexer: bool = True, nprog: int | None = None,
                 device=None, deadline_s: float = 2.0, num_warps: int | None = None, world: int = 1,
                 peers=None, guard=None, cooperative: bool = True, alloc=None, capture_rows: int = 512,
                 num_stages: int | None = None, ks_rule: str = "first", down_stages: int | None = None,
                 fast_cvt: bool | None = None, xq_producer: bool | None = None, l2_window: bool | None = None,
                 **knobs):
        """world > 1: this object is rank `peers.rank` of `world` ranks whose launches
        all-reduce inside the kernel through `peers` (a mono_common.peer.PeerBuffers with the
        regions of `peer_requests`; from `allocate` across GPUs or `allocate_local` for ranks
        side by side on one GPU). `guard`: a mono_common Guard of `world` ranks shared by them
        (one rank's expired wait raises the abort flag every rank polls). cooperative=False
        launches the fused grid plainly after a host co-residency check (so does a Triton
        without cooperative launches; `self.cooperative` says which it is).
        `alloc(shape, dtype, device)`: makes every buffer of this object, zeroed (default
        torch.zeros; the harness's redzone check passes one that fences each buffer).
        `capture_rows`: pointer-table rows pinned now for tables first built inside CUDA-graph
        captures (a side-by-side launch of R ranks takes R; they are never reused).
        `num_stages`: the software-pipelining depth of the stages' loops (None: Triton's
        launch default, 3 on sm_90, 2 on gfx950; a measurement knob, see bench/diag_stages.py).
        `ks_rule`: the index wk's split-K rule where the grid is too small for `_qkva_split`
        (`_pick_ks`; "balanced" is not yet run through the GPU suite, a measurement knob too). `down_stages`, `fast_cvt`: Plan.DSTG and
        Plan.FASTCVT (None: the device's, `isa_options`; measurement knobs). `xq_producer`: the
        q_a/kv_a and q_b GEMVs read inputs their producers quantised (Plan.XQP; the same bits;
        None: the ISA's, on for sm_90; True is refused on gfx950, where it spills 18 scalar
        registers at the TP8 rank, width 2). `l2_window`: each fused launch's weights (all but the
        routed-expert stacks) marked streaming in the L2 through the stream's access policy window
        (`mono_common.l2_window`; CUDA only, host-side: the same binary and bits; None: off, a
        measurement knob). `knobs`: the measurement knobs of `KNOBS` by name
        (each moves work between programs, folds a stage or changes a loop's form; every unknown
        name and out-of-range value refused at once with what is allowed)."""
        from mono_common.guard_host import Guard

        self.s = s
        self.w = weights
        self.width = width
        self.indexer = indexer
        dev = torch.device(device) if device is not None else weights["input_layernorm.weight"].device
        self.device = dev
        self.nprog = nprog or default_nprog(dev)
        if world > 1:
            missing = [n for n, _, _ in peer_requests(s, width, world) if peers is None or n not in peers.table]
            if missing or guard is None:
                raise ValueError(f"a {world}-rank launch needs peer buffers with {missing or 'its regions'} "
                                 "and a shared Guard of all ranks")
        self.world = world
        self.rank = peers.rank if world > 1 else 0
        self.peers = peers
        # decided once, by capability (not by catching what a launch raises)
        self.cooperative = bool(cooperative) and cooperative_launch_supported(dev)
        self._resident_checked = False
        isa_name = "gfx950" if torch.version.hip else "sm_90"
        isa = isa_options(isa_name, s)
        dstg = isa["DSTG"] if down_stages is None else int(down_stages)
        fcvt = isa["FASTCVT"] if fast_cvt is None else bool(fast_cvt)
        if dstg < 0:
            raise ValueError(f"down_stages {dstg} must be 0 (one slot after another) or more")
        if fcvt and torch.version.hip:
            raise ValueError("fast_cvt is sm_90 PTX: on a HIP device leave it off")
        if xq_producer and dev.type == "cuda" and torch.version.hip:
            raise ValueError("xq_producer is sm_90 only: on gfx950 the layer kernel built with it "
                             "spills 18 scalar registers (TP8 rank, width 2); build without it")
        xqp = isa["XQP"] if xq_producer is None else bool(xq_producer)
        plan = make_tp_plan(s, width, indexer, self.nprog, world, ks_rule)
        plan = dataclasses.replace(plan, **{**isa, "DSTG": dstg, "FASTCVT": fcvt, "XQP": xqp},
                                   ANC=addnorm_default(isa_name, s, width, self.nprog, plan.HB))
        knobs = knobs_with_defaults(default_knobs(isa_name, s, width, indexer), knobs)
        self.plan = _with_knobs(plan, s, self.nprog, knobs, hip=bool(torch.version.hip))
        self.num_warps = num_warps or NUM_WARPS
        self._stages_opt = {} if num_stages is None else {"num_stages": int(num_stages)}
        if l2_window and (dev.type != "cuda" or torch.version.hip):
            raise ValueError("l2_window sets a CUDA access policy window: on a HIP or CPU device leave it off")
        self.l2_window = bool(l2_window)
        # id of a weight dict -> (the dict, held so the id stays its own, its window)
        self._windows: dict[int, tuple[dict, tuple[int, int]]] = {}
        p = self.plan
        W = width
        f32, bf16, i32 = torch.float32, torch.bfloat16, torch.int32
        # whole pages, and whole index-score tiles (a tile may span pages: Plan.TB > page)
        unit = max(s.page, p.TB)
        self.max_seq_len = _cdiv(max_seq_len, unit) * unit
        self.max_pages = self.max_seq_len // s.page

        make = alloc if alloc is not None else (lambda shape, dtype, device: torch.zeros(shape, dtype=dtype, device=device))

        def z(*shape, dtype=f32, fill=None):
            t = make(tuple(shape), dtype, dev)
            return t if fill is None else t.fill_(fill)

        # static per-step inputs
        self.x = z(W, s.hidden, dtype=bf16)
        self.res = z(W, s.hidden, dtype=bf16)
        self.pos = z(W, dtype=torch.int64)
        self.loc = z(W, dtype=torch.int64, fill=-1)
        self.seqlen = z(W, dtype=i32, fill=1)
        self.req = z(W, dtype=torch.int64)
        self.prev_topk = z(W, p.TOPK, dtype=i32, fill=-1)
        # outputs
        self.out = z(W, s.hidden, dtype=bf16)
        self.res_out = z(W, s.hidden, dtype=bf16)
        self.topk = z(W, p.TOPK, dtype=i32, fill=-1)
        # scratch
        nqkv = s.qkv_a_out
        nikw = s.index_head_dim + s.index_heads
        nqb = p.NH * s.qk_head
        niq = s.index_heads * s.index_head_dim
        nch = p.TOPK // p.CT
        self.resid1 = z(W, s.hidden, dtype=bf16)
        self.hn = z(W, s.hidden, dtype=bf16)
        self.qkva = z(p.KS1, W, nqkv)
        self.ikw = z(p.KSI, W, nikw)
        self.qn = z(W, s.q_lora, dtype=bf16)
        # Plan.ABG: each absorption tile's q_nope rows after the RoPE scratch (`stages._absorb_gathered`)
        abx = p.NH * (p.KVL // (64 if p.KVL >= 64 else p.KVL)) * W * p.NOPE if p.ABG else 0
        self.rope = z(W * p.RD + W * p.ID + W * p.IH * p.ID + W * p.NH * p.RD + abx)
        self.iwraw = z(W, p.IH)
        self.qb = z(p.KS3, W, nqb)
        self.iq = z(p.KSQ, W, niq)
        self.qabs = z(W, p.NH, p.KVL + p.RD)
        self.iq8 = z(W, p.IH, p.ID)
        self.iwt = z(W, p.IH)
        self.scores = z(W, self.max_seq_len)
        # the top-k stages': per row 4 radix histograms of 256 bins, per TKC-key chunk 2 counts
        from mono_glm53.kernels.stages import TKC, TKH_ROW

        self.tkh = z(W, TKH_ROW.value, dtype=i32)
        self.tkc = z(W, _cdiv(self.max_seq_len, TKC.value), 2, dtype=i32)
        # the spread top-k's fine histograms (Plan.TKS): a row's keys by their top 16 bits
        from mono_common.stages.topk import TKS_FINE

        self.tkf = z(W, TKS_FINE.value, dtype=i32) if p.TKS else z(16, dtype=i32)
        self.part = z(W, p.NH, nch, p.KVL)
        self.ml = z(W, p.NH, nch, 2)
        self.attn = z(W, p.NH, p.KVL, dtype=bf16)
        self.ov = z(W, p.NH * p.VD, dtype=bf16)
        self.op = z(p.KS9, W, s.hidden)
        self.h2 = z(W, s.hidden, dtype=bf16)
        # Plan.XQP: hn and qn quantised by their producers (values, per-block scales)
        self.hnq = z(W, s.hidden, dtype=bf16)
        self.hns = z(W, s.hidden // p.BLK)
        self.qnq = z(W, p.QL, dtype=bf16)
        self.qns = z(W, p.QL // p.BLK)
        # h2 and the SiLU output quantised once for their FP8 GEMMs (values, per-block scales)
        self.h2q = z(W, s.hidden, dtype=bf16)
        self.h2s = z(W, s.hidden // p.BLK)
        self.lg = z(p.KSR, W, p.E)
        self.gu = z(p.NSLOT, p.KSG, W, 2 * p.I)
        self.slot_e = z(p.NSLOT, dtype=i32)
        self.slot_w = z(W, p.NSLOT)
        self.nslot = z(1, dtype=i32)
        self.inter = z(p.NSLOT, W, p.I, dtype=bf16)
        self.inters = z(p.NSLOT, W, p.I // p.BLK)
        # Plan.DIT: each slot's weighted down tiles, summed per column tile in slot order
        self.mz = z(p.NSLOT, W, s.hidden, dtype=bf16) if p.DIT else z(8, dtype=bf16)
        # all-reduce scratch (R > 1): point 1's bf16 partial and sum, point 2's bf16 partial
        # (postnorm_split: ap holds the rows' chunk sums of squares at one rank)
        nar = W * s.hidden if world > 1 or p.PNS else 16
        self.ap, self.ar1, self.dp = z(nar, dtype=bf16), z(nar, dtype=bf16), z(nar, dtype=bf16)
        if world > 1:
            self.ar_tabs = tuple(peers.table[n] for n in ("glm53.ar1.mbox", "glm53.ar1.flags",
                                                          "glm53.ar2.mbox", "glm53.ar2.flags"))
        else:
            self.ar_tabs = (z(1, dtype=torch.int64),) * 4
        # sync: one counter per stage hand-off, one epoch slot per program (zeroed once); fused
        # and staged launches bump both alike, so they can be mixed step by step. int32, compared
        # modulo 2**32 (exact at any launch count: mono_common.device.epochs); tests run
        # launches across the point where the targets epoch * nprog pass 2**31
        # the stage counters, then (stages.FIXOP, two lines on) the column-tile counters of
        # Plan.FIX9
        from mono_glm53.kernels.stages import CNT_WORDS

        self.cnt = z(CNT_WORDS.value, dtype=i32)
        self.epoch = z(self.nprog, dtype=i32)
        # per-program clock stamps of the fused launch's hand-offs, written only while
        # `self.stamp` is set (kernels.stamps reads them; profiling, not the product path)
        from mono_glm53.kernels.stages import STAMP_W

        self.stamps = z(self.nprog, STAMP_W.value, dtype=torch.int64)
        self.stamp = 0
        self.guard = guard if guard is not None else Guard(
            1, device=dev, deadline_s=deadline_s, stage_names={i: n for i, n in enumerate(_stage_names())})
        # every wait's deadline in clock ticks: the guard's, unless set per kernel before the
        # first launch (ranks side by side sharing one guard, each with its own deadline)
        self.deadline = self.guard.deadline
        self.cs = cos_sin_cache(s, max(self.max_seq_len, 1), dev)
        if alloc is not None:  # the shared table, copied into this allocator's memory
            self.cs = z(*self.cs.shape).copy_(self.cs)
        self._dummy_u8 = z(16, dtype=torch.uint8)
        self._dummy_f = z(16)
        self._dummy_bf = z(16, dtype=bf16)
        self._delay = 0
        # the weights of the layer launched after this one (a dict as `weights`), whose first
        # weights a launch with Plan.NXS requests into the L2; None: nothing requested
        self.next_weights = None
        # the compiled kernels of the last launches ("fused", or the stage index), for their
        # register/spill counts (`n_regs`, `n_spills` on a GPU)
        self.compiled: dict = {}
        self.stall = fault_stage(self.rank)
        self._iw = _index_weight_scales(s)  # per shape: computed once, not per launch
        # pointer tables by the addresses they hold (`_table`); never evicted: a captured
        # graph may still read any of them
        self._tables: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        from mono_glm53.kernels.ptable import NSLOTS

        self._capture_rows = CaptureRows(capture_rows, NSLOTS.value, pin=dev.type == "cuda")

    def reset_sync(self) -> None:
        """Zero the epochs and counters (nothing may be in flight). For after a timing loop
        that replayed single stages, which bumps their counters out of step, and for `recover`;
        a one-rank object only (peer flags of other ranks cannot be reset from here)."""
        if self.world > 1:
            raise RuntimeError("reset_sync is for one-rank kernels: peer flags would stay ahead")
        self.cnt.zero_()
        self.epoch.zero_()

    def set_sync(self, epoch: int) -> None:
        """Put every program at epoch `epoch` with each counter at what launch `epoch` leaves
        (epoch * nprog, modulo 2**32), as if `epoch` launches had run (tests start near the
        wraps this way; one rank; nothing may be in flight)."""
        if self.world > 1:
            raise RuntimeError("set_sync is for one-rank kernels: peer flags would not follow")
        wrap = lambda v: (v + 2 ** 31) % 2 ** 32 - 2 ** 31  # noqa: E731
        self.epoch.fill_(wrap(epoch))
        self.cnt.fill_(wrap(epoch * self.nprog))
        # the MoE slots' and down's tile counters (Plan.SFO, DIT) are zero between launches
        # whatever the epoch
        from mono_glm53.kernels.stages import SLOTC

        self.cnt[SLOTC.value:] = 0
        # a fixed-up GEMV's column-tile counter counts its spans' arrivals (`gemv.span_fixup`)
        if self.plan.FIX9:
            base, _, n, k, per = _oproj_counters(self.s, self.plan)
            for c in range(_cdiv(n, BNS)):
                self.cnt[base + c] = wrap(epoch * tile_spans(c, k, self.s.block, per))

    def stop_recorded(self):
        """The error word of a stop this object's guard holds for its rank (a host read of
        pinned memory: it sees launches that have finished), or None."""
        from mono_common import errors

        return errors.decode(self.guard.args(self.rank)[2].tolist())

    def recover(self) -> None:
        """After a reported stop: wait for the device, clear the guard's abort flags and error
        words and zero the epochs and counters, so the next launch starts clean (one rank: the
        peer flags of other ranks stay out of step, so a world > 1 must be rebuilt)."""
        if self.world > 1:
            raise RuntimeError("recover is for one-rank kernels: rebuild the ranks' kernels and peer buffers")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.guard.reset()
        self.reset_sync()

    def _refuse_after_stop(self) -> None:
        word = self.stop_recorded()
        if word is not None:
            from mono_common.errors import MonoDeviceError

            raise MonoDeviceError(
                "mono-glm53 layer kernel: an earlier launch stopped ("
                + word.describe(self.guard.stage_names, None)
                + "); its counters are out of step, so it launches no more: call recover() "
                "(one rank) or build new kernels", word)

    # ------------------------------------------------------------------ inputs
    def input_problems(self, hidden: torch.Tensor, residual: torch.Tensor, inputs) -> list[str]:
        """Every way a step's inputs disagree with this kernel and with each other (empty: fine).
        hidden, residual: [r, H] bf16 with 1 <= r <= width; positions, out_cache_loc, seq_lens,
        req_pool_indices: [r] int32/int64 (one value per row: a one-element tensor would be
        broadcast into every row by copy_); req_to_token: [reqs, ctx] int32; all on this
        kernel's device; max_seq_len within what the kernel was built for."""
        bad = []
        H = self.s.hidden
        r = hidden.shape[0] if hidden.dim() == 2 else -1
        for name, t in (("hidden", hidden), ("residual", residual)):
            if t.dim() != 2 or t.shape[1] != H or t.shape[0] != r:
                bad.append(f"{name} is {tuple(t.shape)}, the step needs [{max(r, 0)} rows, {H}]")
            if t.dtype != torch.bfloat16:
                bad.append(f"{name} is {t.dtype}, the kernel reads bfloat16")
        if r == 0 or r > self.width:
            bad.append(f"{r} rows: this kernel takes 1 to {self.width}")
        for name in ("positions", "out_cache_loc", "seq_lens", "req_pool_indices"):
            t = getattr(inputs, name)
            if t.dim() != 1 or t.shape[0] != r:
                bad.append(f"{name} is {tuple(t.shape)}, the step has {max(r, 0)} rows (one value per row)")
            if t.dtype not in (torch.int32, torch.int64):
                bad.append(f"{name} is {t.dtype}, not an int32/int64 tensor")
        rtt = inputs.req_to_token
        if rtt.dim() != 2 or rtt.dtype != torch.int32:
            bad.append(f"req_to_token is {rtt.dtype} {tuple(rtt.shape)}, the kernel reads int32 [reqs, ctx]")
        for name, t in (("hidden", hidden), ("residual", residual), ("positions", inputs.positions),
                        ("out_cache_loc", inputs.out_cache_loc), ("seq_lens", inputs.seq_lens),
                        ("req_pool_indices", inputs.req_pool_indices), ("req_to_token", rtt)):
            if not _same_device(t.device, self.device):
                bad.append(f"{name} is on {t.device}, the kernel on {self.device}")
        if int(inputs.max_seq_len) > self.max_seq_len:
            bad.append(f"max_seq_len {int(inputs.max_seq_len)} is larger than the {self.max_seq_len} built for")
        return bad

    def set_inputs(self, hidden: torch.Tensor, residual: torch.Tensor, inputs) -> None:
        """Copy a step of r <= width rows into the static buffers; rows r.. become pad rows.
        Inputs that disagree with the step (`input_problems`) are refused, every reason at once."""
        bad = self.input_problems(hidden, residual, inputs)
        if bad:
            raise ValueError("mono-glm53 layer kernel: the step's inputs are refused: " + "; ".join(bad))
        r = hidden.shape[0]
        self.x.zero_()
        self.res.zero_()
        self.x[:r].copy_(hidden)
        self.res[:r].copy_(residual)
        self.pos.zero_()
        self.pos[:r].copy_(inputs.positions)
        self.loc.fill_(-1)
        self.loc[:r].copy_(inputs.out_cache_loc)
        self.seqlen.fill_(1)
        self.seqlen[:r].copy_(inputs.seq_lens)
        self.req.zero_()
        self.req[:r].copy_(inputs.req_pool_indices)
        self.rtt = inputs.req_to_token

    # ------------------------------------------------------------------ launch
    def _tensors(self, caches, rtt, weights=None) -> list[torch.Tensor]:
        """Every tensor of a launch, in the pointer-table order (`ptable.SLOTS`)."""
        s, w = self.s, (weights if weights is not None else self.w)
        abort, abort_tab, errs = self.guard.args(self.rank)
        wk = w.get("self_attn.indexer.wk.weight", self._dummy_u8)
        sk = w.get("self_attn.indexer.wk.weight_scale_inv", self._dummy_f)
        wwp = w[_index_weights_proj(s)]
        idx_cache = caches.index_k if caches.index_k is not None else self._dummy_u8
        sh13 = w.get("mlp.shared_experts.gate_up_proj.weight")
        return [
            self.x, self.res, self.pos, self.loc, self.seqlen, self.req, rtt, self.prev_topk,
            caches.kv, idx_cache, self.cs,
            w["input_layernorm.weight"], _u8(w["self_attn.fused_qkv_a_proj_with_mqa.weight"]),
            w["self_attn.fused_qkv_a_proj_with_mqa.weight_scale_inv"],
            w["self_attn.q_a_layernorm.weight"], w["self_attn.kv_a_layernorm.weight"],
            _u8(w["self_attn.q_b_proj.weight"]), w["self_attn.q_b_proj.weight_scale_inv"],
            w["self_attn.w_kc"], w["self_attn.w_vc"],
            _u8(w["self_attn.o_proj.weight"]), w["self_attn.o_proj.weight_scale_inv"],
            w["post_attention_layernorm.weight"], w["mlp.gate.weight"],
            w["mlp.gate.e_score_correction_bias"],
            _u8(w["mlp.experts.w13_weight"]), w["mlp.experts.w13_weight_scale_inv"],
            _u8(w["mlp.experts.w2_weight"]), w["mlp.experts.w2_weight_scale_inv"],
            _u8(sh13), w["mlp.shared_experts.gate_up_proj.weight_scale_inv"],
            _u8(w["mlp.shared_experts.down_proj.weight"]), w["mlp.shared_experts.down_proj.weight_scale_inv"],
            _u8(w["self_attn.indexer.wq_b.weight"]), w["self_attn.indexer.wq_b.weight_scale_inv"],
            _u8(wk), sk, wwp,
            w["self_attn.indexer.k_norm.weight"], w["self_attn.indexer.k_norm.bias"],
            self.out, self.res_out, self.topk,
            self.resid1, self.hn, self.hnq, self.hns, self.qkva, self.ikw, self.qn, self.qnq, self.qns, self.rope, self.iwraw, self.qb, self.iq,
            self.qabs, self.iq8, self.iwt, self.scores, self.tkh, self.tkc, self.tkf, self.part, self.ml,
            self.attn, self.ov, self.op, self.h2, self.h2q, self.h2s, self.lg, self.gu, self.slot_e, self.slot_w,
            self.nslot, self.inter, self.inters, self.mz, self.ap, self.ar1, self.dp,
            self.cnt, self.epoch, abort, abort_tab, errs, *self.ar_tabs, self.stamps,
        ]

    def _table(self, tensors: list[torch.Tensor], rtt: torch.Tensor) -> torch.Tensor:
        """The device pointer table of one launch's tensors, built once per distinct set of
        addresses (per layer: weights and caches; the buffers are this object's) and kept, so a
        captured graph's launches keep reading valid tables."""
        return self._cached_table([(tensors, self._scalars(rtt))])

    def _cached_table(self, rows: list[tuple[list[torch.Tensor], tuple]]) -> torch.Tensor:
        """`device_table(rows)`, kept in `_tables` by the addresses and scalars it holds."""
        key = tuple(v for ts, sc in rows for v in [t.data_ptr() for t in ts] + list(sc))
        tab = self._tables.get(key)
        if tab is None:
            tab = device_table(rows, self.device, self._capture_rows)
            self._tables[key] = tab
        return tab[0]

    def _args(self, caches, rtt, weights=None, ptab=None):
        """The launch arguments in `layer_kernel`'s order: the pointer table, then scalars."""
        w = weights if weights is not None else self.w
        wkc, wvc = w["self_attn.w_kc"], w["self_attn.w_vc"]
        if ptab is None:
            ptab = self._table(self._tensors(caches, rtt, weights), rtt)
        return (ptab, wkc.stride(0), wkc.stride(1), wkc.stride(2), wvc.stride(0), wvc.stride(1), wvc.stride(2))

    def _scalars(self, rtt) -> tuple:
        """The launch's scalars in `ptable.SCALARS` order."""
        s = self.s
        iwa, iwb = self._iw
        return (s.rms_eps, s.index_k_norm_eps, s.softmax_scale, iwa, iwb,
                s.index_head_dim ** -0.5, s.routed_scaling, self.max_seq_len // self.plan.TB,
                rtt.stride(0), self.scores.stride(0), self.rank, self.deadline, self._delay, self.stall,
                int(self.stamp), *self._next_addresses())

    def _next_addresses(self) -> tuple[int, int, int]:
        """The next layer's q_a/kv_a, index wk and weights_proj addresses (`ptable` next_*), or
        zeros: without Plan.NXS or next_weights (a zero is requested by no launch)."""
        w = self.next_weights
        if not self.plan.NXS or w is None:
            return (0, 0, 0)
        wk = w.get("self_attn.indexer.wk.weight")
        wwp = w.get(_index_weights_proj(self.s))
        return (w["self_attn.fused_qkv_a_proj_with_mqa.weight"].data_ptr(),
                0 if wk is None else wk.data_ptr(), 0 if wwp is None else wwp.data_ptr())

    def launch(self, caches, mode: str = "fused", delay: int = 0, stages=None, weights=None):
        """Run the layer on the static inputs. mode "fused": one persistent launch; "staged":
        one launch a stage (`stages` picks a subset, for per-stage timing). `weights`: another
        layer's weight dict of the same shape (one kernel object serves every layer of a width:
        its buffers are scratch between launches). Returns (out, res_out, topk) views of the
        static output buffers.

        Report mode: the guard is checked after the launch (a device sync; not while a CUDA
        graph is being captured), so a stopped launch raises MonoDeviceError here and its
        outputs are never returned. An object whose earlier launch stopped refuses to launch
        until `recover()`."""
        from mono_glm53.kernels.stages import NSTAGES, layer_kernel

        if mode not in ("fused", "staged"):
            raise ValueError(f"launch mode {mode!r} is not 'fused' or 'staged'")
        self._refuse_after_stop()
        self._delay = int(delay)
        args = self._args(caches, self.rtt, weights)
        ce = self.plan.constexprs()
        clock = self.guard.clock
        grid = (self.nprog,)
        with _codegen_scope(), self._weights_streaming(mode, weights):
            if mode == "fused":
                kw = dict(ce, FIRST=0, LAST=NSTAGES - 1, FUSED=True, CLOCK=clock, FAULT=self.guard.fault,
                          num_warps=self.num_warps, **self._stages_opt, **launch_options(self.device))
                self.compiled["fused"] = self._launch_grid(layer_kernel, grid, args, kw)
            else:
                for st in (stages if stages is not None else range(NSTAGES)):
                    self.compiled[st] = layer_kernel[grid](*args, **ce, FIRST=st, LAST=st, FUSED=False, CLOCK=clock,
                                                           FAULT=self.guard.fault, num_warps=self.num_warps,
                                                           **self._stages_opt,
                                                           **launch_options(self.device))
        self._check_after_launch()
        return self.out, self.res_out, self.topk

    def _weights_streaming(self, mode: str, weights):
        """The fused launch's weights streaming in the L2 (`l2_window`), else nothing."""
        if not self.l2_window or mode != "fused":
            return contextlib.nullcontext()
        from mono_common import l2_window

        w = weights if weights is not None else self.w
        if id(w) not in self._windows:
            spans = [(t.data_ptr(), t.numel() * t.element_size()) for t in w.values() if isinstance(t, torch.Tensor)]
            self._windows[id(w)] = (w, l2_window.weight_window(spans, l2_window.max_window_bytes(self.device)))
        return l2_window.streaming(torch.cuda.current_stream(self.device).cuda_stream, *self._windows[id(w)][1])

    def _launch_grid(self, layer_kernel, grid, args, kw):
        """One fused launch of `grid` whose programs wait for each other: cooperative (the
        driver refuses a grid that cannot be co-resident), or plain after the host check."""
        if self.cooperative:
            return layer_kernel[grid](*args, **kw, launch_cooperative_grid=True)
        if self.device.type == "cuda" and not self._resident_checked:
            check_co_resident(layer_kernel.warmup(*args, grid=grid, **kw), grid[0], self.device)
            self._resident_checked = True
        return layer_kernel[grid](*args, **kw)

    def _check_after_launch(self) -> None:
        if self.guard.mode == "report" and not _capturing(self.device):
            self.guard.check()


def _index_weights_proj(s: GlmLayerShape) -> str:
    """The weight name of the indexer's head weights: merged with wk (indexer_fused) or alone."""
    return "self_attn.indexer.wk_weights_proj.weight" if s.indexer_fused else "self_attn.indexer.weights_proj.weight"


def launch_side_by_side(kernels: list[GlmLayerKernel], caches: list, delay: int = 0) -> None:
    """One fused launch running the R ranks `kernels` (world R, rank r at index r, each built
    with nprog = P) side by side on one GPU: programs [r * P, (r + 1) * P) are rank r and read
    rank r's arguments from a device pointer table (kernels on separate streams do not run
    concurrently on every GPU, and peers that wait on each other must). Cooperative where
    Triton can (`cooperative_launch_supported`), else plain after the host co-residency check,
    so a grid that cannot be co-resident fails at launch instead of stalling. Each kernel's
    fault switch (MONO_GLM53_FAULT) applies to its own rank. As `GlmLayerKernel.launch`: no
    launch after a recorded stop, and in report mode the shared guard is checked after it."""
    from mono_glm53.kernels.stages import NSTAGES, layer_kernel

    R = len(kernels)
    k0 = kernels[0]
    if any(k.world != R for k in kernels) or [k.rank for k in kernels] != list(range(R)):
        raise ValueError(f"side-by-side launch needs ranks 0..{R - 1} of one world of {R}")
    if len({k.nprog for k in kernels}) != 1:
        raise ValueError("every rank must be built with the same nprog")
    for k in kernels:
        k._refuse_after_stop()
        k._delay = int(delay)
    ptab = k0._cached_table([(k._tensors(c, k.rtt), k._scalars(k.rtt)) for k, c in zip(kernels, caches)])
    args = k0._args(caches[0], k0.rtt, ptab=ptab)  # every rank's scalars are in its row
    kw = dict(k0.plan.constexprs(), FIRST=0, LAST=NSTAGES - 1, FUSED=True, CLOCK=k0.guard.clock,
              FAULT=k0.guard.fault, SIM=True, num_warps=k0.num_warps, **k0._stages_opt, **launch_options(k0.device))
    grid = (R * k0.nprog,)
    with _codegen_scope():
        if cooperative_launch_supported(k0.device):
            layer_kernel[grid](*args, **kw, launch_cooperative_grid=True)
        else:
            if k0.device.type == "cuda":
                check_co_resident(layer_kernel.warmup(*args, grid=grid, **kw), grid[0], k0.device)
            layer_kernel[grid](*args, **kw)
    k0._check_after_launch()


def device_table(rows: list[tuple[list[torch.Tensor], tuple]], device,
                 capture_rows: CaptureRows | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(device int64 [len(rows), NSLOTS] table, its host source (CPU; pinned in a capture)) of
    rows of (tensors in `ptable.SLOTS` order, scalars in `ptable.SCALARS` order): the tensors'
    addresses, then the scalars (fp32 as their bits). Each tensor must have the dtype its slot
    declares (`ptable.DTYPES`), as the kernel reads it, and be 16-byte aligned unless its slot
    is in `ptable.UNALIGNED`. On a GPU the copy is blocking, except while a CUDA graph is being
    captured: then it is an async copy from rows of `capture_rows` (pinned before the capture;
    the graph holds the copy, the rows are kept with the table)."""
    from mono_glm53.kernels.ptable import ALIGN, SCALARS, SLOTS, UNALIGNED

    device = torch.device(device)
    bad = []
    for r, (ts, sc) in enumerate(rows):
        if len(ts) != len(SLOTS) or len(sc) != len(SCALARS):
            raise ValueError(f"pointer-table row {r} has {len(ts)} tensors and {len(sc)} scalars, "
                             f"the table {len(SLOTS)} and {len(SCALARS)}")
        for (name, dt), t in zip(SLOTS, ts):
            if _TORCH_TO_TRITON.get(t.dtype) != "*" + dt:
                bad.append(f"{name} is {t.dtype}, the kernel reads {dt}")
            if name not in UNALIGNED and t.data_ptr() % ALIGN.value:
                bad.append(f"{name} is not {ALIGN.value}-byte aligned (a view at an offset)")
            # pinned host memory is device-addressable (the guard's error words live there)
            if t.device.type != device.type and not (device.type == "cuda" and t.is_pinned()):
                bad.append(f"{name} is on {t.device}, the launch on {device}")
    if bad:
        raise ValueError("mono-glm53 layer kernel: " + "; ".join(sorted(set(bad))))
    host = torch.tensor([[t.data_ptr() for t in ts] + [_scalar_bits(v, dt) for v, (_, dt) in zip(sc, SCALARS)]
                         for ts, sc in rows], dtype=torch.int64)
    if device.type != "cuda":
        return host, host
    if not torch.cuda.is_current_stream_capturing():
        # A blocking copy: the table is on the device before the launch is enqueued.
        return host.to(device), host
    if capture_rows is None:
        raise ValueError("a pointer table built inside a CUDA-graph capture needs pinned rows made "
                         "before the capture (capture_rows): pinning during a capture is refused")
    host = capture_rows.take(host)
    dev = torch.empty(host.shape, dtype=torch.int64, device=device)
    dev.copy_(host, non_blocking=True)
    return dev, host


# ptxas otherwise caps the fused kernel at 168 registers (a 3-CTA/SM target) and spills at
# width 8; the persistent grid runs two 4-warp programs per SM, which 255 registers a thread
# still allows (2 x 128 x 256 = the SM's 64K registers).
MAXNREG_SM = 255
# Warps of every layer-kernel launch.
NUM_WARPS = 4


def isa_options(isa: str, s: GlmLayerShape) -> dict[str, object]:
    """Plan.DSTG, FASTCVT, XQP, HWQ, OHQ, TKF, MF16, IF16, TKP and PFN of shape `s`'s kernel compiled for `isa` ("sm_90"/"gfx950").

    sm_90, where a rank's expert K is at most two blocks (a TP8 rank): the MoE down slot loop
    as a pipelined loop (num_stages 3; its TTGIR keeps one slot's copies in flight, see
    Plan.DSTG) and the e4m3 conversions on the integer and bf16 pipes (H200, TP8 shard,
    fused launch stamps, session 14: down 29.1 -> 22.1 us at 2 rows, 97.4 -> 69.6 us at 8;
    gate_up 35.9 -> 32.4 and 99.4 -> 87.2 us; outputs bit-equal; 4 deep measured no better
    standalone). Not on a TP4 rank (or the whole layer), whose four K blocks a slot in the
    pipelined loop spilled 32-60 bytes on sm_90 under Triton 3.6 (the TP4 kernel without it
    spills 16 bytes at 8 rows under 3.6 too, none under 3.8; not timed there). gfx950:
    neither (its cast is a native conversion, the PTX path does not exist there, and the
    pipelined loop is not resource-checked there).

    XQP (producer-quantised GEMV inputs) on every sm_90 shape, the same bits as without it
    (1.05-1.06x at 1-2 rows, TP8 shard, H200, session 16); not on gfx950, whose scalar
    registers it spilled (18 at the TP8 rank, width 2).

    TKF (the top-k's first radix pass in the index scores, one hand-off fewer) on every sm_90
    shape: the same bits, 1.02-1.04x at 1 row and 1.01x at 8 (TP8 shard, ctx 4096: H200 180.4
    against 184.4 us in session 21, H100 175.4 against 182.4 in session 23); gfx950 keeps the
    stage (its VGPRs 236 -> 244 with it, not timed there). sm_90 TP8 rank: 0 spills under
    Triton 3.8; under 3.6 36 bytes at 2 rows (12 without it), as timed above.

    HWQ (the producers' e4m3 roundings on the conversion unit) on every sm_90 shape: the same
    bits, less code. OHQ, the same rounding of o_proj's input inside its spans (the knob
    `oproj_hw_quant` false turns it off), with it: the same bits (the bench's digest) and the
    span's code 18.4 -> 12.9 KB; H100, served TP8 shard, ctx 4096, session 40, one call:
    150.0-150.6 -> 146.3 us at 1 row and 286.4-287.4 -> 283.3 at 8 (o_proj's stamp 13.9 ->
    10.0 and 15.0 -> 11.1 us). With the waits' failure path a call (mono-common 0.1.14), it is also what
    keeps the sm_90 builds at 0 spills under Triton 3.8 (without it TP8 at 8 rows spills 8
    bytes); under 3.6 they spill 8-12 bytes either way (CHANGELOG 0.3.16). gfx950: its cast is
    not checked against torch on hardware here.

    MF16 (the MoE's e4m3 weights to f16 on the conversion unit, one instruction a pair, and f16
    MMAs; the knob `moe_f16` turns it off) where FASTCVT is on: the same bits (the GPU knob
    test, fused with stage delays at 2 and 8 rows; the bench's digest). At 8 rows the integer
    conversion was 47 % of the MoE stages' executed instructions (Nsight Compute, H100, session
    24); the layer 176.4 -> 172.9 us at 1 row and 310.8 -> 298.5 at 8 (H100, TP8 shard, ctx
    4096, two calls alike). TP8 rank: 0 spills under Triton 3.8; under 3.6 (the shard alone) 36
    bytes at 2 rows as without it, 40 at 8. Not on other shapes (not timed there) nor gfx950.

    IF16 (the index scores' e4m3 keys to f16 the same way; the knob `index_f16` turns it off)
    where MF16 is: the same bits (the GPU knob test at 2 and 8 rows; the bench's digest at ctx
    4096 and 65536); H100, TP8 shard, one call (session 25): 175.3 -> 171.8 us at 1 row and
    308.2 -> 305.7 at 8, ctx 4096 (the index scores' stamp 6.7 -> 5.9 and 12.7 -> 11.6 us),
    no change at ctx 65536 (196.5 / 195.9, 519.0 / 520.2). TP8 rank: 0 spills under Triton 3.8
    at 2 and 8 rows; under 3.6 36 bytes at 2 rows as without it, none at 8 (the shard alone
    under 3.8 spills 20 bytes at 8 rows, under 3.6 as without it).

    TKP (the top-k stages' tiles a contiguous run a program, a row's threshold digits derived
    once a run; the knob `radix_prefix_once` turns it off) where MF16 is: the same integers
    (the interpreter's staged layer; the bench's digest at ctx 4096 and 65536). H100, TP8
    shard, session 27: at ctx 65536 and 8 rows 519.0 -> 467.4 us (tkhist1..tkwrite 16.5-29.9
    -> 8.6-12.7 us each), at 1 row 192.2 / 193.0 (within the calls' noise). 0 spills under
    Triton 3.8 (TP8 rank, 2 and 8 rows); +2.9 KB of code.

    PFN -1 (no L2 prefetch of the layer's own weights; the knob `prefetch_programs` sets
    every program (true) or the last N back) where MF16 is: only the timing changes. H100, TP8
    shard, session 27, each beside the default in one call: ctx 4096 168.4 -> 165.3 us at 1
    row and 304.7 -> 295.0 at 8; ctx 65536 (with postnorm_spread) 192.2 -> 186.2 and 519.0 ->
    508.9 (addnorm's stamp 7.1 -> 2.4 us: the prefetches queued ahead of its dependent loads;
    the later GEMVs' stamps grow less than that). Other shapes keep every program's (not
    timed); gfx950 has no such prefetch.
    """
    sm = isa.startswith("sm")
    if sm and s.moe_inter_per_rank <= 2 * s.block:
        return {"DSTG": 3, "FASTCVT": True, "XQP": sm, "HWQ": sm, "OHQ": sm, "TKF": sm, "MF16": True,
                "IF16": True, "TKP": True, "PFN": -1}
    return {"DSTG": 0, "FASTCVT": False, "XQP": sm, "HWQ": sm, "OHQ": sm, "TKF": sm, "MF16": False, "IF16": False,
            "TKP": False, "PFN": 0}


# what each default knob yields to: a build naming one of these knobs with a value of that
# truth is built without the default, as if it named it false
_DEFAULT_YIELDS = {
    "topk_spread": {"topk_row": True, "topk_row_absorb": True, "radix_loop": True, "count_in_write": True,
                    "hist_in_scores": False},
    "qb_joint": {"qb_pair": True},
}


def default_knobs(isa: str, s: GlmLayerShape, width: int, indexer: bool) -> dict[str, object]:
    """The knobs of `KNOBS` a build of shape s at `width` rows takes unless it names them.

    sm_90 where MF16 is (a TP8 rank, `isa_options`), each giving the same bits as without it
    (GPU knob tests at 2 and 8 rows, fused with stage delays):
    - `topk_spread` (with the indexer): a step whose rows all have at most 4096 tokens takes its
      top-k in two stages on every program. H100, served TP8 shard, ctx 4096, session 37, beside
      the radix stages in one call: 156.7 -> 151.6 us at 1 row, 286.3 -> 284.5 at 8.
    - `absorb_gather` (at most 8 rows): the absorption 6.0 -> 4.0 us (sessions 30-33, H100:
      154.5 / 284.0 against 157.1 / 284.1 us in session 33).
    And one that changes the bits (other sums of the same products; the GPU reference test
    `test_qb_joint_matches_reference` at 2 and 8 rows, session 42):
    - `qb_joint` (with the indexer): q_b's and wq_b's tiles as one stream-K GEMV. H100, served
      TP8 shard, ctx 4096, session 42, two calls, each beside the default: 145.7 -> 141.8 and
      146.4 -> 139.7 us at 1 row, 279.9 -> 275.7 and 272.9 -> 272.8 at 8 (qb's stamp 9.2 -> 7.5
      and 10.2 -> 8.2 us; absorb's 4.1 -> 3.6 and 6.9 -> 5.4). The width-4 build is not timed
      with it yet; it takes it too, so a row's bits do not depend on the step's width.
    A build naming `topk_row`, `topk_row_absorb`, `radix_loop` or `count_in_write`, or
    `hist_in_scores` false, takes the radix stages; one naming `qb_pair` its two span loops
    (`_DEFAULT_YIELDS`). Not on other shapes (not timed there) nor gfx950 (not timed there; it
    compiles without spills at a TP8 rank, widths 2 and 8)."""
    if not isa.startswith("sm") or not isa_options(isa, s)["MF16"]:
        return {}
    out: dict[str, object] = {}
    if indexer:
        out["topk_spread"] = True
        out["qb_joint"] = True
    if _absorb_gather_refusal(s, width) is None:
        out["absorb_gather"] = True
    return out


def knobs_with_defaults(defaults: dict[str, object], knobs: dict[str, object]) -> dict[str, object]:
    """`knobs` over `defaults` (`default_knobs`): a knob named (not None) wins; a default one of
    whose `_DEFAULT_YIELDS` knobs is named with the truth listed there is left out."""
    named = {n: v for n, v in knobs.items() if v is not None}
    out = {n: v for n, v in defaults.items()
           if not any(y in named and bool(named[y]) == truth for y, truth in _DEFAULT_YIELDS.get(n, {}).items())}
    return {**knobs, **out, **named}


def launch_options(device) -> dict:
    """Launch options of every layer-kernel launch on `device` (beyond grid and num_warps)."""
    if torch.device(device).type == "cuda" and not torch.version.hip:
        return {"maxnreg": MAXNREG_SM}
    return {}


def _codegen_scope():
    """What the layer kernel's launches compile under: no AMD buffer ops (their per-base scalar
    descriptors spill gfx950's SGPRs in a kernel of ~80 table-loaded pointers; see
    mono_common.triton_knobs). On CUDA nothing is switched (the knob is AMD-only)."""
    if torch.version.hip:
        return amd_buffer_ops(False)
    return contextlib.nullcontext()


def _scalar_bits(v, dtype: str) -> int:
    """A scalar as its table slot holds it: fp32 bits in the low word, or the integer."""
    if dtype == "fp32":
        return struct.unpack("<I", struct.pack("<f", float(v)))[0]
    return int(v)


def _u8(t: torch.Tensor) -> torch.Tensor:
    """FP8 weights are passed as their bytes (the kernel bitcasts: one path for the
    interpreter and both ISAs)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _stage_names():
    from mono_glm53.kernels.stages import STAGE_NAMES

    return STAGE_NAMES


_TORCH_TO_TRITON = {
    torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.int32: "*i32", torch.int64: "*i64",
    torch.uint8: "*u8",
}


def kernel_signature() -> dict[str, str]:
    """Triton type strings of `layer_kernel`'s runtime arguments (for the CPU compile check).

    The dtypes do not depend on the shape (dims are constexprs), so they are read off a tiny
    instance built on the CPU."""
    import inspect

    from mono_glm53.config import tiny
    from mono_glm53.kernels.stages import layer_kernel
    from mono_glm53.weights import make_caches, make_weights

    s = tiny()
    w = make_weights(s, device="cpu", seed=0)
    inputs, caches = make_caches(s, 1, 8, device="cpu", seed=1)
    k = GlmLayerKernel(s, w, 2, 8, nprog=2, device="cpu")
    k.set_inputs(torch.zeros(1, s.hidden, dtype=torch.bfloat16), torch.zeros(1, s.hidden, dtype=torch.bfloat16), inputs)
    args = k._args(caches, k.rtt)
    names = [p for p in inspect.signature(layer_kernel.fn).parameters]
    sig = {}
    for name, a in zip(names, args):
        if isinstance(a, torch.Tensor):
            sig[name] = _TORCH_TO_TRITON[a.dtype]
        elif isinstance(a, float):
            sig[name] = "fp32"
        elif name in ("deadline", "delay"):
            sig[name] = "i64"
        else:
            sig[name] = "i32"
    return sig


def variant_constexprs(s: GlmLayerShape, width: int, indexer: bool, nprog: int, isa: str,
                       fused: bool = True, world: int = 1,
                       knobs: dict[str, object] | None = None) -> dict[str, object]:
    """Constexprs of one compiled variant (the fused launch unless `fused` is False), with the
    ISA's options, its default knobs and `knobs` as GlmLayerKernel's."""
    from mono_common.device.timer import CLOCK_GLOBALTIMER, CLOCK_MEMREALTIME
    from mono_glm53.kernels.stages import NSTAGES

    plan = make_tp_plan(s, width, indexer, nprog, world)
    plan = dataclasses.replace(plan, **isa_options(isa, s), ANC=addnorm_default(isa, s, width, nprog, plan.HB))
    kn = knobs_with_defaults(default_knobs(isa, s, width, indexer), knobs or {})
    ce = _with_knobs(plan, s, nprog, kn, hip=not isa.startswith("sm")).constexprs()
    ce.update(FIRST=0, LAST=NSTAGES - 1, FUSED=fused, FAULT=0, SIM=False,
              CLOCK=CLOCK_GLOBALTIMER if isa.startswith("sm") else CLOCK_MEMREALTIME)
    return ce


# Triton's launch defaults per ISA (the layer launch passes none)
LAUNCH_NUM_STAGES = {"sm_90": 3, "gfx950": 2}


def compile_variant(s: GlmLayerShape, width: int, indexer: bool, isa: str, world: int = 1,
                    knobs: dict[str, object] | None = None):
    """The fused variant compiled on the CPU for `isa` as a launch there compiles it
    (`mono_common.compilecheck.Resources`): a grid of `spec.RESIDENT_BLOCKS` x `PROGRAMS_PER_SM`
    programs, 16-byte aligned pointers, the launch's num_stages, no AMD buffer ops
    (`_codegen_scope`), maxnreg on sm_90 (`launch_options`); knobs as GlmLayerKernel's."""
    from mono_common.compilecheck import compile_kernel
    from mono_glm53.kernels.stages import layer_kernel
    from mono_glm53.spec import RESIDENT_BLOCKS

    sm = isa.startswith("sm")
    nprog = RESIDENT_BLOCKS[isa] * PROGRAMS_PER_SM["cuda" if sm else "hip"]
    ce = variant_constexprs(s, width, indexer, nprog, isa, world=world, knobs=knobs)
    return compile_kernel(layer_kernel, kernel_signature(), ce, isa, num_warps=NUM_WARPS,
                          num_stages=LAUNCH_NUM_STAGES[isa], pointer_align=16, amd_buffer_ops=False,
                          **({"maxnreg": MAXNREG_SM} if sm else {}))
