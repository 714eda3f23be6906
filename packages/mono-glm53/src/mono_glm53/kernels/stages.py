"""Stage bodies of the GLM-5.3 decoder-layer kernel, shared by the fused and the staged launch.

The generic pieces come from mono-common's stage library (`mono_common.stages`: numerics, GEMV
tiles, norms, RoPE / Hadamard, the radix top-k, sparse MLA and its combine, biased routing, the
MoE expert GEMV over expert slots, tile assignment); this module holds GLM-5.3's own stage
bodies and the launch that links them.

Every stage is a `@triton.jit` function `stage_<name>(pid, nprog, ...)` that loops over its tiles
`for t in range(pid, ntiles, nprog)`: the tiles of a stage are shared among the resident
programs. `layer_kernel` (below) runs the stages FIRST..LAST in order; with FUSED it links them
with monotonic epoch counters (mono_common guarded waits), without FUSED it is one launch of one
stage (the staged mode, which also runs under TRITON_INTERPRET=1).

Stage list (index: what it does; who reads its output):
  0  ADDNORM   residual add + input RMSNorm, per row             -> resid1, hn
  1  QKVA      FP8 GEMV hn @ [q_a | kv_a | k_pe]^T (split-K) and bf16 GEMV hn @ [wk | weights]^T
  2  LATENT    q_a norm -> qn; kv_a norm + k_pe RoPE -> MLA cache at out_cache_loc;
               indexer: index-k LayerNorm + RoPE (+Hadamard) + FP8 -> paged index-K cache
  3  QB        FP8 GEMV qn @ q_b^T and (indexer) qn @ wq_b^T (split-K)
  4  ABSORB    per head: q_pe RoPE, q_nope @ W_UK -> qabs;  per index head: RoPE (+Hadamard),
               FP8 quant of index q, head weight * scale
  5  ISCORE    index scores over the context pages (FP8 keys from the paged cache); zeroes the
               rows' top-k histograms
  6-9 TKHIST   exact top-TOPK per row, 8-bit radix select on order-preserving keys, one pass a
               stage: the histogram of the next digit among the keys sharing the threshold's
               prefix, every 256-key chunk of every row a tile (atomic integer sums)
  10 TKCOUNT   per chunk: keys above the threshold and keys equal to it
  11 TKWRITE   per chunk: its keys' slots after the earlier chunks' counts -> topk
               (Plan.TKR, a knob: a step whose rows are all short takes its whole top-k in
               stage 7, one program a row; hand-offs 8-11 only signal; Plan.TKA with it: stage
               4's absorption and q_pe RoPE tiles run in stage 7 on the programs without a row.
               Plan.TKS, a knob: such a step's threshold in stage 7 and its write in stage 8, on
               every program; hand-offs 9-11 only signal; Plan.TSS with it: both in stage 7,
               hand-offs 8-11 only signal)
  12 MLA       sparse MLA over the selected tokens, split over token chunks: each chunk's
               unnormalised output and (max, sum) per (row, head)
  13 MLACOMB   the chunks combined in chunk order, per (row, head, 64-column block) -> attn
  14 WUV       attn @ W_UV per (head, v block)
  15 OPROJ     FP8 GEMV o_proj (split-K)
  16 POSTNORM  all-reduce point 1 (R > 1 ranks: one-shot push + rank-order sum, then a hand-off
               inside the stage) + residual add + post RMSNorm -> h2
  17 ROUTER    bf16 GEMV router logits (fp32, split-K); h2 quantised for gate_up once
               (h2q, h2s), not by every gate_up tile
  18 GATEUP    every program: sigmoid + bias routing of the real rows (pad rows: none), top-8,
               renorm, x2.5, unique expert list; FP8 GEMV gate_up for shared + unique routed
               experts (split-K)
  19 SILU      sum split-K partials, SiLU(g) * u (bf16) quantised for down -> inter, inters
  20 DOWN      FP8 GEMV down (two slots a step at K <= 2 blocks), weighted sum over the experts in fixed order;
               all-reduce point 2
               (R > 1: each program pushes the tiles it computed, then sums its blocks)

Numerics follow SGLang's decode path: bf16 rounding at the outputs of every linear and norm,
per-token-group (block) FP8 quantisation of the activation before every FP8 GEMM (as
`per_token_group_quant_fp8`), fp32 accumulation, fp32 router and routing. FP8 e4m3 weights
are read as uint8 and bitcast (one path for the interpreter and both ISAs). Rounding is done
by the library's helpers (`mono_common.stages.numerics`, under the names `_rbf`, `_e4m3_bits`,
`_div`, `_dot` here) because the Triton 3.8 interpreter truncates fp32->bf16, misrounds
fp32->fp8 and computes bf16 tl.dot wrongly.

Arguments: the kernel takes one device table (`ptable`: every tensor address and runtime
scalar of the launch, one row per rank) plus the W_UK/W_UV strides (kept as arguments so
Triton specialises a unit stride), and each stage loads the pointers it uses where it uses
them (`_p`, 16-byte aligned like a specialised pointer argument). A pointer is then live for
one stage only: as ~80 kernel arguments they sat in scalar registers for the whole launch and
spilled on gfx950. On sm_90 the table is read through the read-only (non-coherent) cache: the
host never writes a row while a launch reads it, so after its first touch a word costs an L1
hit, not the L2 round trip a volatile load pays after every hand-off's acquire (`_ld_word`). Stages whose tiles fall in ranges (several GEMVs, a row's parts) loop over
each range apart for the same reason (`_first_tile`).

Cross-program hand-offs: every stage boundary is a counter that each program bumps once per
step (release; the staged launch bumps it too) and the fused launch waits on for
epoch * nprog (acquire, guarded wait with deadline and abort flag); the epoch is a per-program
slot bumped by the kernel itself. Cross-rank hand-offs (R > 1) are the flags of
mono_common.device.allreduce, one set per all-reduce point, waited on with the same guard.
All split-K partials (the MLA token chunks too) are summed by their consumer in fixed order,
with no reduction tree (whose order is the compiled layout's, which the fused and a one-stage
binary may choose differently), so fused and staged results are bit-identical.
"""

import triton
import triton.language as tl

from mono_common.device.allreduce import allreduce_push, allreduce_sum
from mono_common.device.epochs import epoch_begin
from mono_common.device.guard import signal, wait_ge, wait_ge_spin
from mono_common.device.timer import now
from mono_common.stages.gemv import FMT_BF16, FMT_FP8, _load_w, gemv_span, gemv_span_joint, gemv_span_pair
from mono_common.stages.gemv import gemv_tile as _gemv_tile
from mono_common.stages.gemv import sum_slots as _sum_splits
from mono_common.stages.mla import mla_combine as stage_mlacomb
from mono_common.stages.mla import mla_combined_cols
from mono_common.stages.mla import mla_partial as stage_mla
from mono_common.stages.moe import fill_slots as _fill_slots
from mono_common.stages.moe import moe_down as _moe_down
from mono_common.stages.moe import moe_down_items as _moe_down_items
from mono_common.stages.moe import moe_gateup as _moe_gateup
from mono_common.stages.moe import moe_silu as stage_silu
from mono_common.stages.moe import prefetch_slots as _prefetch_slots
from mono_common.stages.norm import rmsnorm_vec as _rmsnorm_vec
from mono_common.stages.numerics import CVT_F16 as _CVT_F16

# the library's numerics under the names the stage bodies use
from mono_common.stages.numerics import bf16r as _bf16
from mono_common.stages.numerics import div_rn as _div
from mono_common.stages.numerics import dot as _dot
from mono_common.stages.numerics import dot_as as _dot_as
from mono_common.stages.numerics import e4m3_bits as _e4m3_bits
from mono_common.stages.numerics import e4m3_operand as _e4m3_operand
from mono_common.stages.numerics import e4m3_val as _e4m3_val
from mono_common.stages.numerics import quant_blocks as _quant_blocks
from mono_common.stages.numerics import rbf as _rbf
from mono_common.stages.prefetch import prefetch_lines as _prefetch_lines
from mono_common.stages.prefetch import prefetch_range as _prefetch
from mono_common.stages.rope import hadamard as _hadamard
from mono_common.stages.rope import rope_cs as _rope_cs
from mono_common.stages.rope import rope_rotate as _rope_rotate
from mono_common.stages.routing import biased_topk as _routing
from mono_common.stages.tiles import first_tile as _first_tile
from mono_common.stages.topk import TKC, TKH_ROW  # noqa: F401 (the host sizes tkh / tkc from them)
from mono_common.stages.topk import tk_locate as _tk_locate
from mono_common.stages.topk import tk_rows as _tk_rows
from mono_common.stages.topk import tk_tiles as _tk_tiles
from mono_common.stages.topk import topk_count as stage_tkcount
from mono_common.stages.topk import topk_hist as stage_tkhist
from mono_common.stages.topk import topk_hist_fine as _topk_hist_fine
from mono_common.stages.topk import topk_hist_first as _topk_hist_first
from mono_common.stages.topk import topk_rows_one as _topk_rows_one
from mono_common.stages.topk import topk_rows_short as _tk_rows_short
from mono_common.stages.topk import topk_spread_select as _topk_spread_select
from mono_common.stages.topk import topk_spread_threshold as _topk_spread_threshold
from mono_common.stages.topk import topk_spread_write as _topk_spread_write
from mono_common.stages.topk import topk_spread_zero as _topk_spread_zero
from mono_common.stages.topk import topk_write as stage_tkwrite
from mono_glm53.kernels import ptable as P

NSTAGES = 21
STAGE_NAMES = (
    "addnorm", "qkva", "latent", "qb", "absorb", "iscore", "tkhist0", "tkhist1", "tkhist2",
    "tkhist3", "tkcount", "tkwrite", "mla", "mlacomb", "wuv", "oproj", "postnorm", "router", "gateup",
    "silu", "down",
)


# Clock stamps of a fused launch (row of `ptable.STAMPS`, one per program): entry 2 s is when the
# program reached hand-off s (its stage s-1 done), 2 s + 1 when it passed it (stage s starts);
# entry 1 is the program's start, entry 2 NSTAGES its end. Written only when the STAMP scalar is set.
STAMP_W = tl.constexpr(2 * NSTAGES + 2)
# The counter of the hand-off inside POSTNORM (all-reduce point 1, R > 1): past the stage
# hand-offs' counters 0..NSTAGES-2.
STAGE_AR1 = tl.constexpr(NSTAGES - 1)
# o_proj's column-tile counters (Plan.FIX9), 128 words from here in the counter buffer, two
# lines past the stage counters (whose line every arrival RMWs)
FIXOP = tl.constexpr(64)
# the MoE slots' gate_up tile counters (Plan.SFO: the SiLU folded into gate_up), one word a
# slot from here, up to 128 slots; zero between launches
SLOTC = tl.constexpr(192)
# down's column-tile counters (Plan.DIT: `moe_down_items`), one word a tile from here, up to
# 192 tiles; zero between launches
DITC = tl.constexpr(320)
# the counter buffer's words (GlmLayerKernel.cnt)
CNT_WORDS = tl.constexpr(512)
# Where a fused launch requests its own weights into the L2 (Plan.PFS, a bit each; sm_90 with
# PFN >= 0): at its start (q_a/kv_a and the index wk / weights_proj), after q_a/kv_a (q_b and
# the index wq_b), after absorb or else after the index scores (o_proj, the router, the shared
# expert), and gate_up's routed experts' down rows; or after the hand-offs whose next stages
# leave the HBM quiet: q_b's and the index wq_b's at the start of the latent stage (after
# hand-off 2), o_proj's, the router's and the shared expert's at the start of the top-k's
# threshold stage (after hand-off 7, where a short step's top-k reads only the L2; a step that
# takes the radix stages requests them before its top-k instead)
PFS_START = tl.constexpr(1)
PFS_QB = tl.constexpr(2)
PFS_OPROJ = tl.constexpr(4)
PFS_DOWN = tl.constexpr(8)
PFS_OPROJ_LATE = tl.constexpr(16)
PFS_LATENT = tl.constexpr(32)
PFS_TOPK = tl.constexpr(64)
PFS_SITES = {"start": PFS_START.value, "qb": PFS_QB.value, "oproj": PFS_OPROJ.value,
             "down": PFS_DOWN.value, "oproj_late": PFS_OPROJ_LATE.value, "latent": PFS_LATENT.value,
             "topk": PFS_TOPK.value}


# ----------------------------------------------------------------------------- helpers
# The table row as the launch reads it on sm_90: a pointer to uint64 (the words are the same
# bits), which `_ld_word` turns into read-only-cache loads; int64 elsewhere (volatile loads).
TABLE_RO = tl.uint64


@triton.jit
def _ld_word(addr):
    """The 8-byte table word at addr as int64, loaded where it is called (never hoisted to the
    launch's start or merged with another load, so it is live for one stage only).

    addr to uint64 (`TABLE_RO`, sm_90): `ld.global.nc`, the read-only cache. Table words never
    change during a launch, so the cache's lack of coherence is safe, and the acquire of every
    hand-off does not send them back to the L2: H200, TP8 shard, 1 row, ctx 4096 (session 17),
    a program's stage with no tile of its own took ~2.0 us with volatile loads and ~0.7 us
    with these; the layer 218.2 -> 199.2 us with the same output bits. addr to int64 (gfx950,
    the interpreter): a volatile load, which the compiler keeps in place."""
    if addr.dtype.element_ty == TABLE_RO:
        a = addr.to(tl.int64, bitcast=True)
        v = tl.inline_asm_elementwise("ld.global.nc.b64 $0, [$1];", "=l,l", [a], dtype=tl.int64,
                                      is_pure=False, pack=1)
    else:
        v = tl.load(addr, volatile=True)
    return v


@triton.jit
def _p(row, slot: tl.constexpr, dt: tl.constexpr):
    """The pointer in `slot` of a pointer-table row (`ptable`), as a pointer to `dt`, 16-byte
    aligned (the host checks it): what Triton assumes of an aligned pointer argument, without
    which every access compiles to scalar loads. Loaded where a stage needs it (after that
    stage's acquire), so it is live for that stage only."""
    # on the pointer: Triton 3.8 drops a hint on the integer through the cast
    return tl.multiple_of(_ld_word(row + slot).to(tl.pointer_type(dt)), P.ALIGN)


@triton.jit
def _pu(row, slot: tl.constexpr, dt: tl.constexpr):
    """`_p` for the slots of `ptable.UNALIGNED` (single words: nothing to vectorise)."""
    return _ld_word(row + slot).to(tl.pointer_type(dt))


@triton.jit
def _sf(row, slot: tl.constexpr):
    """The fp32 scalar in `slot` of a pointer-table row (its low 4 bytes)."""
    return _ld_word(row + slot).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _sl(row, slot: tl.constexpr):
    """The int64 scalar in `slot` of a pointer-table row."""
    return _ld_word(row + slot)


@triton.jit
def _si(row, slot: tl.constexpr):
    """The integer scalar in `slot` of a pointer-table row, as int32."""
    return _ld_word(row + slot).to(tl.int32)


@triton.jit
def _index_quant(x, PLAIN: tl.constexpr, HW: tl.constexpr = False):
    """FP8 quantisation of one index head / key (fp32 in). PLAIN: SGLang's index-K store and the
    fused index q (s = max(amax, 1e-4) / 448, q = x * (1 / s)); else act_quant with ue8m0
    (s = 2^ceil(log2(max(amax, 1e-4) * (1/448))), q = x / s). Returns (codes, scale)."""
    amax = tl.maximum(tl.max(tl.abs(x), 0), 1e-4)
    if PLAIN:
        s = _div(amax, 448.0)
        code = _e4m3_bits(x * _div(1.0, s), HW)
    else:
        # ceil to a power of two on the bits (exp2/log2 lower to approximate instructions)
        r = amax * (1.0 / 448.0)
        b = r.to(tl.int32, bitcast=True)
        b = ((b >> 23) + ((b & 0x7FFFFF) != 0).to(tl.int32)) << 23
        s = b.to(tl.float32, bitcast=True)
        code = _e4m3_bits(_div(x, tl.zeros_like(x) + s), HW)
    return code, s


# ----------------------------------------------------------------------------- stages
@triton.jit
def _row_as_4_chunks(H: tl.constexpr, HB: tl.constexpr):
    """Offsets [4, HB] of a row of H <= 4 HB values as chunk rows of HB, and the mask of the
    chunk rows that exist (H // HB of them): the whole row in one tile, so its loads are
    issued together (one memory round trip, not one a chunk)."""
    ch = tl.arange(0, 4)
    c = tl.arange(0, HB)
    return ch[:, None] * HB + c[None, :], (ch < H // HB)[:, None] & (c >= 0)[None, :]


@triton.jit
def _row_residual(x_ptr, res_ptr, m, off, cm, H: tl.constexpr, eps):
    """Row m's fp32 residual sum x + res as the [4, HB] tile of `_row_as_4_chunks`, and its
    RMSNorm rstd: the one reduction order of every form that norms a whole-row tile."""
    r = (tl.load(x_ptr + m * H + off, mask=cm, other=0.0).to(tl.float32)
         + tl.load(res_ptr + m * H + off, mask=cm, other=0.0).to(tl.float32))
    return r, _tile_rstd(r, H, eps)


@triton.jit
def _tile_rstd(r, H: tl.constexpr, eps):
    """RMSNorm's rstd of a row held as a whole-row [4, HB] tile (masked values 0): the one
    reduction order of every form that norms such a tile (addnorm's and the post-attention
    norm's, a program a row or a chunk), so their bits agree."""
    return tl.rsqrt(tl.sum(tl.sum(r * r, 1), 0) / H + eps)


@triton.jit
def _norm_chunk_out(r, rstd, m, h0, w, hn_ptr, hnq_ptr, hns_ptr, H: tl.constexpr, CB: tl.constexpr,
                    BLK: tl.constexpr, XQP: tl.constexpr, HWQ: tl.constexpr):
    """Row m's normed chunk h0..h0+CB from its fp32 residual sum r [CB], rstd and the chunk's
    fp32 norm weight w [CB]: hn, and (XQP) its per-BLK quantisation for the q_a/kv_a GEMV."""
    c = tl.arange(0, CB)
    hn = r * rstd * w
    tl.store(hn_ptr + m * H + h0 + c, _rbf(hn))
    if XQP:
        q, qs = _quant_blocks(_bf16(hn), CB, BLK, HWQ)
        tl.store(hnq_ptr + m * H + h0 + c, q)
        tl.store(hns_ptr + m * (H // BLK) + h0 // BLK + tl.arange(0, CB // BLK), qs)


@triton.jit
def _addnorm_spread(pid, nprog, x_ptr, res_ptr, resid1_ptr, hn_ptr, w_in_ptr, eps, hnq_ptr, hns_ptr,
                    W: tl.constexpr, H: tl.constexpr, HB: tl.constexpr, BLK: tl.constexpr, XQP: tl.constexpr,
                    HWQ: tl.constexpr, NC: tl.constexpr):
    """`stage_addnorm` with each row cut into NC chunks, one (row, chunk) an item over the
    programs (Plan.ANC: sm_90's default, the knob `norm_spread`): every item's program computes its row's sum of
    squares from the whole row as the one-program form does (`_row_residual`: the same rstd
    bits), then writes only its chunk. A program then runs the
    code of one whole-row load and sum plus a chunk's norm and quantisation, not the whole
    row's (~20 KB of straight-line SASS run once, at ~0.3 us a KB cold: results README)."""
    CB: tl.constexpr = H // NC
    off, cm = _row_as_4_chunks(H, HB)
    c = tl.arange(0, CB)
    for t in range(pid, W * NC, nprog):
        m = t // NC
        h0 = (t % NC) * CB
        # the chunk and its norm weight requested with the row, not behind the row's reduction
        # (its barrier holds every later load; the weight is not in the L2 after a weight stream)
        rc = (tl.load(x_ptr + m * H + h0 + c).to(tl.float32)
              + tl.load(res_ptr + m * H + h0 + c).to(tl.float32))
        wc = tl.load(w_in_ptr + h0 + c).to(tl.float32)
        _, rstd = _row_residual(x_ptr, res_ptr, m, off, cm, H, eps)
        tl.store(resid1_ptr + m * H + h0 + c, _rbf(rc))
        _norm_chunk_out(rc, rstd, m, h0, wc, hn_ptr, hnq_ptr, hns_ptr, H, CB, BLK, XQP, HWQ)


@triton.jit
def stage_addnorm(pid, nprog, x_ptr, res_ptr, resid1_ptr, hn_ptr, w_in_ptr, eps, hnq_ptr, hns_ptr,
                  W: tl.constexpr, H: tl.constexpr, HB: tl.constexpr, BLK: tl.constexpr, XQP: tl.constexpr,
                  HWQ: tl.constexpr = False, NC: tl.constexpr = 0):
    # H (6144) is not a power of two: the row as HB-wide chunks (the norm multiplies the fp32
    # sum, as SGLang's fused_add_rmsnorm). XQP: also the row quantised per BLK group for the
    # q_a/kv_a GEMV (hnq values, hns scales), the bits its K blocks would otherwise each
    # compute again (`gemv` XQ). NC > 0 (Plan.ANC, sm_90's default): `_addnorm_spread`
    if NC > 0:
        _addnorm_spread(pid, nprog, x_ptr, res_ptr, resid1_ptr, hn_ptr, w_in_ptr, eps, hnq_ptr, hns_ptr,
                        W, H, HB, BLK, XQP, HWQ, NC)
    elif H // HB <= 4:
        # the whole row as [4, HB] (chunk rows past H // HB masked): every load of the row is
        # issued at once, one memory round trip where the chunk loop took one per chunk and
        # pass (H200, alone and cold: 3.7 us at 3 chunks, 6.1 at 6, 10.7 at 12)
        off, cm = _row_as_4_chunks(H, HB)
        for m in range(pid, W, nprog):
            # the norm weight requested with the row, not behind its reduction's barrier
            w = tl.load(w_in_ptr + off, mask=cm, other=0.0).to(tl.float32)
            r, rstd = _row_residual(x_ptr, res_ptr, m, off, cm, H, eps)
            tl.store(resid1_ptr + m * H + off, _rbf(r), mask=cm)
            hn = r * rstd * w
            tl.store(hn_ptr + m * H + off, _rbf(hn), mask=cm)
            if XQP:
                # the chunk rows are consecutive in the row, so the flattened tile's BLK groups
                # are the row's (the masked chunk rows' groups past H // BLK are not stored)
                q, qs = _quant_blocks(tl.reshape(_bf16(hn), [4 * HB]), 4 * HB, BLK, HWQ)
                tl.store(hnq_ptr + m * H + tl.reshape(off, [4 * HB]), q, mask=tl.reshape(cm, [4 * HB]))
                g = tl.arange(0, 4 * HB // BLK)
                tl.store(hns_ptr + m * (H // BLK) + g, qs, mask=g < H // BLK)
    else:
        # two passes over the chunks, the sum recomputed in the second
        c = tl.arange(0, HB)
        for m in range(pid, W, nprog):
            ssq = tl.zeros([HB], tl.float32)
            for h0 in range(0, H, HB):
                r = tl.load(x_ptr + m * H + h0 + c).to(tl.float32) + tl.load(res_ptr + m * H + h0 + c).to(tl.float32)
                tl.store(resid1_ptr + m * H + h0 + c, _rbf(r))
                ssq += r * r
            rstd = tl.rsqrt(tl.sum(ssq, 0) / H + eps)
            for h0 in range(0, H, HB):
                r = tl.load(x_ptr + m * H + h0 + c).to(tl.float32) + tl.load(res_ptr + m * H + h0 + c).to(tl.float32)
                _norm_chunk_out(r, rstd, m, h0, tl.load(w_in_ptr + h0 + c).to(tl.float32), hn_ptr, hnq_ptr, hns_ptr,
                                H, HB, BLK, XQP, HWQ)


@triton.jit
def _index_programs(pid, nprog, P1: tl.constexpr):
    """(ip, inp): program pid's number among the programs that run stage_qkva's index tiles,
    and their count (P1 > 0: programs P1.., renumbered from 0; ip < 0 below P1)."""
    if P1 == 0:
        ip = pid
        inp = nprog
    else:
        ip = pid - P1
        inp = nprog - P1
    return ip, inp


@triton.jit
def stage_qkva(pid, nprog, hn_ptr, wqkv_ptr, sqkv_ptr, qkva_ptr, wk_ptr, sk_ptr, wwp_ptr, ikw_ptr, hnq_ptr, hns_ptr,
               W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, NQKV: tl.constexpr,
               ID: tl.constexpr, IH: tl.constexpr, INDEXER: tl.constexpr,
               IDX_FUSED: tl.constexpr, BN: tl.constexpr, BLK: tl.constexpr,
               KS1: tl.constexpr, KSI: tl.constexpr, BNS: tl.constexpr, PER1: tl.constexpr,
               DOTF: tl.constexpr, XQP: tl.constexpr, FASTCVT: tl.constexpr = False, P1: tl.constexpr = 0):
    # P1 > 0: programs 0..P1-1 run the q_a/kv_a spans (PER1 sized for P1 programs), programs
    # P1.. the index GEMVs' tiles, so no program runs both (`make_plan`)
    NIKW: tl.constexpr = ID + IH
    if INDEXER:
        if IDX_FUSED:
            T2: tl.constexpr = ((NIKW + BN - 1) // BN) * KSI  # bf16 [wk | weights_proj]
            T3: tl.constexpr = 0
        else:
            T2: tl.constexpr = ((ID + BN - 1) // BN) * KSI  # FP8 wk
            T3: tl.constexpr = ((IH + BN - 1) // BN) * KSI  # bf16 weights_proj, fp32 out
    else:
        T2: tl.constexpr = 0
        T3: tl.constexpr = 0
    # q_a/kv_a (16 MB at GLM-5.3's shape): one stream-K span a program, every program the same
    # bytes (KS1 partial slots). One loop per indexer GEMV after it: what each hoists out of
    # its loop is then live during that loop only (gfx950 has ~100 scalar registers).
    # XQP: the input addnorm quantised (hnq, scales hns); the index GEMVs below read hn
    if P1 == 0 or pid < P1:
        gemv_span(pid, hnq_ptr if XQP else hn_ptr, H, wqkv_ptr, sqkv_ptr, qkva_ptr, NQKV, NQKV, H, W, BM, BNS,
                  BLK, PER1, FMT_FP8, hns_ptr, XQP, DOT=DOTF)
    # P1 > 0: the index tiles on programs P1.., renumbered from 0 (programs below P1 get none)
    ip, inp = _index_programs(pid, nprog, P1)
    if P1 == 0 or ip >= 0:
        _qkva_index_tiles(ip, inp, hn_ptr, wk_ptr, sk_ptr, wwp_ptr, ikw_ptr, W, BM, H, ID, IH,
                          IDX_FUSED, BN, BLK, KSI, T2, T3, FASTCVT)


@triton.jit
def _qkva_index_tiles(ip, inp, hn_ptr, wk_ptr, sk_ptr, wwp_ptr, ikw_ptr, W: tl.constexpr, BM: tl.constexpr,
                      H: tl.constexpr, ID: tl.constexpr, IH: tl.constexpr, IDX_FUSED: tl.constexpr,
                      BN: tl.constexpr, BLK: tl.constexpr, KSI: tl.constexpr, T2: tl.constexpr,
                      T3: tl.constexpr, FASTCVT: tl.constexpr):
    """The indexer GEMVs' tiles of stage_qkva: tile t on program ip of inp when t = ip mod inp."""
    NIKW: tl.constexpr = ID + IH
    for t in range(ip, T2, inp):
        if IDX_FUSED:
            _gemv_tile(t, hn_ptr, H, wwp_ptr, sk_ptr, ikw_ptr, NIKW, NIKW, H, W, BM, BN, BLK, KSI, False)
        else:
            _gemv_tile(t, hn_ptr, H, wk_ptr, sk_ptr, ikw_ptr, ID, NIKW, H, W, BM, BN, BLK, KSI, True,
                       FASTCVT=FASTCVT)
    for t in range(_first_tile(ip, inp, T2), T2 + T3, inp):
        _gemv_tile(t - T2, hn_ptr, H, wwp_ptr, sk_ptr, ikw_ptr + ID, IH, NIKW, H, W, BM, BN, BLK, KSI, False)


@triton.jit
def stage_latent(pid, nprog, row,
                 W: tl.constexpr, QL: tl.constexpr, KVL: tl.constexpr, RD: tl.constexpr,
                 NQKV: tl.constexpr, ID: tl.constexpr, IH: tl.constexpr, PG: tl.constexpr,
                 KS1: tl.constexpr, KSI: tl.constexpr, INDEXER: tl.constexpr,
                 IDX_FUSED: tl.constexpr, HADAMARD: tl.constexpr, MLA_NEOX: tl.constexpr,
                 IDX_NEOX: tl.constexpr, GS: tl.constexpr, BLK: tl.constexpr, XQP: tl.constexpr,
                 HWQ: tl.constexpr = False):
    # GS: the split partials' loads in flight at once in the narrow sums (`sum_slots` GROUP; 0
    # on gfx950, whose SGPRs they spilled). Three small parts per row (tiles t = part * W + m), each its own loop loading its own
    # pointers from the table: one loop over every part keeps what each part hoists (pointers,
    # lane offsets) live through all of them, past gfx950's scalar registers.
    NIKW: tl.constexpr = ID + IH
    for t in range(_first_tile(pid, nprog, 0), W, nprog):
        m = t
        qkva_ptr = _p(row, P.QKVA, tl.float32)
        qn_ptr = _p(row, P.QN, tl.bfloat16)
        wqa_ptr = _p(row, P.WQA, tl.bfloat16)
        eps = _sf(row, P.EPS)
        q = _bf16(_sum_splits(qkva_ptr, m, 0, W, NQKV, KS1, QL))
        qn = _rmsnorm_vec(q, wqa_ptr, QL, eps)
        tl.store(qn_ptr + m * QL + tl.arange(0, QL), _rbf(qn))
        if XQP:  # the q_b / index wq_b GEMVs' input quantised once (as stage_addnorm's)
            qq, qs = _quant_blocks(_bf16(qn), QL, BLK, HWQ)
            tl.store(_p(row, P.QNQ, tl.bfloat16) + m * QL + tl.arange(0, QL), qq)
            tl.store(_p(row, P.QNS, tl.float32) + m * (QL // BLK) + tl.arange(0, QL // BLK), qs)
    for t in range(_first_tile(pid, nprog, W), 2 * W, nprog):
        m = t - W
        qkva_ptr = _p(row, P.QKVA, tl.float32)
        rope_ptr = _p(row, P.ROPE, tl.float32)
        cs_ptr = _p(row, P.CS, tl.float32)
        wkva_ptr = _p(row, P.WKVA, tl.bfloat16)
        eps = _sf(row, P.EPS)
        pos = tl.load(_p(row, P.POS, tl.int64) + m)
        loc = tl.load(_p(row, P.LOC, tl.int64) + m)
        # the RoPE table's row requested now, not behind the barrier below (`_rope_cs`)
        rc, rs = _rope_cs(pos, cs_ptr, RD, MLA_NEOX)
        kv = _bf16(_sum_splits(qkva_ptr, m, QL, W, NQKV, KS1, KVL, GS))
        kvn = _rmsnorm_vec(kv, wkva_ptr, KVL, eps)
        kpe = _bf16(_sum_splits(qkva_ptr, m, QL + KVL, W, NQKV, KS1, RD, GS))
        # RoPE reads its partner lane from memory: park k_pe in this row's scratch slot
        sp = rope_ptr + m * RD
        tl.store(sp + tl.arange(0, RD), kpe)
        tl.debug_barrier()
        kr = _rope_rotate(sp, rc, rs, RD, MLA_NEOX)
        if loc >= 0:  # pad rows (loc < 0) write no cache
            base = _p(row, P.KV_CACHE, tl.bfloat16) + loc * (KVL + RD)
            tl.store(base + tl.arange(0, KVL), _rbf(kvn))
            tl.store(base + KVL + tl.arange(0, RD), _rbf(kr))
    if INDEXER:
        for t in range(_first_tile(pid, nprog, 2 * W), 3 * W, nprog):
            m = t - 2 * W
            ikw_ptr = _p(row, P.IKW, tl.float32)
            rope_ptr = _p(row, P.ROPE, tl.float32)
            cs_ptr = _p(row, P.CS, tl.float32)
            pos = tl.load(_p(row, P.POS, tl.int64) + m)
            loc = tl.load(_p(row, P.LOC, tl.int64) + m)
            # the RoPE table's row and the cache slot requested now, not behind the barriers below
            rc, rs = _rope_cs(pos, cs_ptr, RD, IDX_NEOX)
            d = tl.arange(0, ID)
            rj = tl.arange(0, RD)
            # the LayerNorm's weight and bias requested with the partials, not behind its reductions
            lnw = tl.load(_p(row, P.LNW, tl.float32) + d)
            lnb = tl.load(_p(row, P.LNB, tl.float32) + d)
            k = _bf16(_sum_splits(ikw_ptr, m, 0, W, NIKW, KSI, ID, GS))
            wts = _sum_splits(ikw_ptr, m, ID, W, NIKW, KSI, IH, GS)
            if IDX_FUSED:
                wts = _bf16(wts)  # the merged wk_weights_proj GEMM writes bf16
            tl.store(_p(row, P.IWRAW, tl.float32) + m * IH + tl.arange(0, IH), wts)
            # LayerNorm with fp32 weight and bias
            mu = tl.sum(k, 0) / ID
            dk = k - mu
            var = tl.sum(dk * dk, 0) / ID
            kn = dk * tl.rsqrt(var + _sf(row, P.LN_EPS)) * lnw + lnb
            if not IDX_FUSED:
                kn = _bf16(kn)  # unfused: LayerNorm out bf16, then rope, then Hadamard
            sp = rope_ptr + W * RD + m * ID
            tl.store(sp + d, kn)
            tl.debug_barrier()
            kr = _rope_rotate(sp, rc, rs, RD, IDX_NEOX)
            tl.debug_barrier()
            tl.store(sp + rj, kr)
            tl.debug_barrier()
            kk = _bf16(tl.load(sp + d))
            if HADAMARD:
                tl.debug_barrier()
                tl.store(sp + d, kk)
                tl.debug_barrier()
                kk = _bf16(_hadamard(sp, ID, _sf(row, P.HSCALE)))
            code, sc = _index_quant(kk, True, HWQ)
            if loc >= 0:
                page = loc // PG
                off = loc % PG
                pb = _p(row, P.IDX_CACHE, tl.uint8) + page * (PG * (ID + 4))
                tl.store(pb + off * ID + d, code.to(tl.uint8))
                sp32 = (pb + PG * ID).to(tl.pointer_type(tl.float32))
                tl.store(sp32 + off, sc)


@triton.jit
def stage_qb(pid, nprog, qn_ptr, wqb_ptr, sqb_ptr, qb_ptr, wiq_ptr, siq_ptr, iq_ptr, qns_ptr,
             W: tl.constexpr, BM: tl.constexpr, QL: tl.constexpr, NQB: tl.constexpr,
             NIQ: tl.constexpr, INDEXER: tl.constexpr, BNS: tl.constexpr, BLK: tl.constexpr,
             PER3: tl.constexpr, PERQ: tl.constexpr, DOTF: tl.constexpr, XQP: tl.constexpr,
             tkh_ptr=None, TKF: tl.constexpr = False, tkf_ptr=None, fine=False, QBP: tl.constexpr = 0):
    # q_b and the indexer's wq_b: each GEMV in stream-K spans over every program. XQP: qn_ptr
    # holds the quantised values and qns_ptr their scales (stage_latent's). QBP 1: both spans as
    # one loop (one copy of the span's code, the same partials); 2: both as one GEMV, spans of
    # PER3 items over q_b's tiles then wq_b's (PERQ unused)
    if INDEXER and QBP == 2:
        gemv_span_joint(pid, qn_ptr, QL, qns_ptr, QL, wqb_ptr, sqb_ptr, qb_ptr, NQB, wiq_ptr, siq_ptr, iq_ptr, NIQ,
                        PER3, W, BM, BNS, BLK, FMT_FP8, XQP, DOTF)
    elif INDEXER and QBP:
        gemv_span_pair(pid, qn_ptr, QL, qns_ptr, QL, wqb_ptr, sqb_ptr, qb_ptr, NQB, PER3, wiq_ptr, siq_ptr, iq_ptr,
                       NIQ, PERQ, W, BM, BNS, BLK, FMT_FP8, XQP, DOTF)
    else:
        gemv_span(pid, qn_ptr, QL, wqb_ptr, sqb_ptr, qb_ptr, NQB, NQB, QL, W, BM, BNS, BLK, PER3, FMT_FP8, qns_ptr,
                  XQP, DOT=DOTF)
        if INDEXER:
            gemv_span(pid, qn_ptr, QL, wiq_ptr, siq_ptr, iq_ptr, NIQ, NIQ, QL, W, BM, BNS, BLK, PERQ, FMT_FP8,
                      qns_ptr, XQP, DOT=DOTF)
    if INDEXER:
        if TKF:
            # the top-k histograms zeroed here, not by the index scores, which add to them
            # (Plan.TKF), dealt from the last program down
            _zero_tkh(nprog - 1 - pid, nprog, tkh_ptr, W)
        if tkf_ptr is not None:
            if fine:
                # and, in a step that takes the spread top-k (Plan.TKS), its fine histograms,
                # which the index scores add to
                _topk_spread_zero(pid, nprog, tkf_ptr, W)


@triton.jit
def _absorb_rope(m, h, qb_ptr, qabs_ptr, pos_ptr, cs_ptr, rope_ptr, W: tl.constexpr, NH: tl.constexpr,
                 NOPE: tl.constexpr, RD: tl.constexpr, KVL: tl.constexpr, IH: tl.constexpr, ID: tl.constexpr,
                 KS3: tl.constexpr, MLA_NEOX: tl.constexpr, GS: tl.constexpr):
    """Row m's q_pe of head h (q_b's KS3 partial slots summed) with its RoPE, into qabs."""
    QH: tl.constexpr = NOPE + RD
    rj = tl.arange(0, RD)
    pos = tl.load(pos_ptr + m).to(tl.int64)
    # the RoPE table's row requested with the partials, not behind the barrier (`_rope_cs`)
    rc, rs = _rope_cs(pos, cs_ptr, RD, MLA_NEOX)
    pe = _bf16(_sum_splits(qb_ptr, m, h * QH + NOPE, W, NH * QH, KS3, RD, GS))
    sp = rope_ptr + W * RD + W * ID + W * IH * ID + (m * NH + h) * RD
    tl.store(sp + rj, pe)
    tl.debug_barrier()
    pr = _bf16(_rope_rotate(sp, rc, rs, RD, MLA_NEOX))
    tl.store(qabs_ptr + (m * NH + h) * (KVL + RD) + KVL + rj, pr)


@triton.jit
def _absorb_gathered(t, h, cols, acc, qb_ptr, wkc_ptr, wkc_s0, wkc_s1, wkc_s2, xs_ptr,
                     W: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr, NOPE: tl.constexpr, RD: tl.constexpr,
                     KS3: tl.constexpr, BKN: tl.constexpr):
    """acc += q_nope[:W] of head h @ w_kc[h][:, cols] (Plan.ABG, the knob `absorb_gather`):
    the chunks' weight blocks requested first (they do not depend on q_b), then q_nope's KS3
    partial slots summed for all NOPE columns at once, G slots' loads in flight a round (16 over W
    rounded up to a power of two: 2 rounds of 8 for a TP8 rank's 16 slots at width 2, where the
    tile form takes NOPE / BKN chunks of KS3 / 4 rounds each, 12 in all), rounded
    to bf16 into this tile's scratch rows xs_ptr [t, W, NOPE] and read back as the chunks' MMA
    operands. The same sums in the same order as the tile form: each element's slots from 0
    up, each chunk's product added to acc in chunk order. NOPE / BKN <= 4, NOPE <= 256."""
    QH: tl.constexpr = NOPE + RD
    NQB: tl.constexpr = NH * QH
    NKC: tl.constexpr = NOPE // BKN
    NP2: tl.constexpr = 64 if NOPE <= 64 else (128 if NOPE <= 128 else 256)
    WP: tl.constexpr = 1 if W == 1 else (2 if W <= 2 else (4 if W <= 4 else 8))
    G: tl.constexpr = max(1, min(KS3, 16 // WP))
    FULL: tl.constexpr = KS3 - KS3 % G
    rows = tl.arange(0, BM)
    rmask = rows < W
    kk = tl.arange(0, BKN)
    wb = wkc_ptr + h * wkc_s0 + kk[:, None] * wkc_s1 + cols[None, :] * wkc_s2
    w0 = tl.load(wb)
    w1 = tl.load(wb + BKN * wkc_s1) if NKC > 1 else w0
    w2 = tl.load(wb + 2 * BKN * wkc_s1) if NKC > 2 else w0
    w3 = tl.load(wb + 3 * BKN * wkc_s1) if NKC > 3 else w0
    r = tl.arange(0, WP)
    c = tl.arange(0, NP2)
    xm = (r[:, None] < W) & (c[None, :] < NOPE)
    xp = qb_ptr + r[:, None] * NQB + h * QH + c[None, :]
    xs = tl.zeros([WP, NP2], tl.float32)
    for s0 in range(0, FULL, G):
        for g in tl.static_range(G):
            xs += tl.load(xp + (s0 + g) * (W * NQB), mask=xm, other=0.0)
    for g in tl.static_range(KS3 % G):
        xs += tl.load(xp + (FULL + g) * (W * NQB), mask=xm, other=0.0)
    xt = xs_ptr + t * (W * NOPE)
    tl.store(xt + r[:, None] * NOPE + c[None, :], _rbf(xs).to(tl.float32), mask=xm)
    tl.debug_barrier()
    xq = xt + rows[:, None] * NOPE + kk[None, :]
    acc += _dot(tl.load(xq, mask=rmask[:, None], other=0.0), w0)
    if NKC > 1:
        acc += _dot(tl.load(xq + BKN, mask=rmask[:, None], other=0.0), w1)
    if NKC > 2:
        acc += _dot(tl.load(xq + 2 * BKN, mask=rmask[:, None], other=0.0), w2)
    if NKC > 3:
        acc += _dot(tl.load(xq + 3 * BKN, mask=rmask[:, None], other=0.0), w3)
    return acc


@triton.jit
def stage_absorb(pid, nprog, qb_ptr, wkc_ptr, wkc_s0, wkc_s1, wkc_s2, qabs_ptr, iq_ptr, iq8_ptr,
                 iwraw_ptr, iwt_ptr, pos_ptr, cs_ptr, rope_ptr, row,
                 W: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr, NOPE: tl.constexpr,
                 RD: tl.constexpr, KVL: tl.constexpr, IH: tl.constexpr, ID: tl.constexpr,
                 KS3: tl.constexpr, KSQ: tl.constexpr, INDEXER: tl.constexpr,
                 IDX_FUSED: tl.constexpr, HADAMARD: tl.constexpr, MLA_NEOX: tl.constexpr,
                 IDX_NEOX: tl.constexpr, GS: tl.constexpr, HWQ: tl.constexpr = False, ABG: tl.constexpr = False,
                 part=0):
    # ABG (Plan.ABG, the knob `absorb_gather`): the absorption tiles as `_absorb_gathered`
    # (their x scratch past the rope scratch: ABX), and the q_pe RoPE items as tiles of their
    # own after the index tiles, not before a head's first absorption tile. part (Plan.TKA, the
    # knob `topk_row_absorb`): 0 every tile; 1 the index tiles only (stage 4 of a row top-k
    # step); 2 the absorption and RoPE tiles only (stage 7, beside the row top-k). row: the
    # pointer-table row, whose index-weight scalars (IWA, IWB, HSCALE) the index tiles load
    # themselves: loaded at the call, two of them stayed live through the absorption tiles and
    # spilled 8 bytes (sm_90, Triton 3.8, a TP8 rank at width 4 with qb_joint, and at width 2
    # with mla_chunk 32 too)
    QH: tl.constexpr = NOPE + RD
    NQB: tl.constexpr = NH * QH
    NIQ: tl.constexpr = IH * ID
    DA: tl.constexpr = KVL + RD
    T2: tl.constexpr = W * IH if INDEXER else 0
    rows = tl.arange(0, BM)
    rmask = rows < W
    rj = tl.arange(0, RD)
    # W_UK absorption tiles: (head, CB-column block) pairs, so the 1.5 MB of w_kc of a TP8 rank
    # is read by NH * KVL / CB programs at once (one tile a head, 4 KB a load, read it in ~36 us
    # on the H200: session 12 stamps); a block's weight load issued before its x sums.
    CB: tl.constexpr = 64 if KVL >= 64 else KVL
    NCB: tl.constexpr = KVL // CB
    BKN: tl.constexpr = 64 if NOPE % 64 == 0 else (32 if NOPE % 32 == 0 else 16)
    NKC: tl.constexpr = NOPE // BKN
    T1: tl.constexpr = NH * NCB
    T3: tl.constexpr = W * NH if ABG else 0
    ABX: tl.constexpr = W * RD + W * ID + W * IH * ID + W * NH * RD
    kk = tl.arange(0, BKN)
    nt = T1 + T2 + T3 - (part == 1) * (T1 + T3) - (part == 2) * T2
    for u in range(pid, nt, nprog):
        t = u + (part == 1) * T1 + ((part == 2) & (u >= T1)) * T2
        if t < T1:
            h = t // NCB
            cb = t % NCB
            # row m's q_pe RoPE by the head's tile m % NCB: at most a row or two a tile, not
            # every row on one tile (each row sums KS3 partials, one load latency a slot)
            if not ABG:
                if cb < W:
                    for m in range(cb, W, NCB):
                        _absorb_rope(m, h, qb_ptr, qabs_ptr, pos_ptr, cs_ptr, rope_ptr, W, NH, NOPE, RD, KVL, IH, ID,
                                     KS3, MLA_NEOX, GS)
            # q_nope[:W] (NOPE) @ w_kc[h][:, block] (NOPE x CB), bf16 in, fp32 sum
            cols = cb * CB + tl.arange(0, CB)
            acc = tl.zeros([BM, CB], tl.float32)
            if ABG:
                acc = _absorb_gathered(t, h, cols, acc, qb_ptr, wkc_ptr, wkc_s0, wkc_s1, wkc_s2, rope_ptr + ABX,
                                       W, BM, NH, NOPE, RD, KS3, BKN)
            for kc in range(0 if ABG else NKC):
                w = tl.load(wkc_ptr + h * wkc_s0 + (kc * BKN + kk[:, None]) * wkc_s1 + cols[None, :] * wkc_s2)
                xs = tl.zeros([BM, BKN], tl.float32)
                xp = qb_ptr + rows[:, None] * NQB + h * QH + kc * BKN + kk[None, :]
                # q_b's split partials in slot order, KG slots' loads in flight at once
                KG: tl.constexpr = 4 if KS3 % 4 == 0 else (2 if KS3 % 2 == 0 else 1)
                for k0 in range(0, KS3, KG):
                    for kg in tl.static_range(KG):
                        xs += tl.load(xp + (k0 + kg) * (W * NQB), mask=rmask[:, None], other=0.0)
                acc += _dot(_rbf(xs), w)
            tl.store(qabs_ptr + (rows[:, None] * NH + h) * DA + cols[None, :], _bf16(acc),
                     mask=rmask[:, None])
        elif t >= T1 + T2:
            v = t - T1 - T2
            _absorb_rope(v // NH, v % NH, qb_ptr, qabs_ptr, pos_ptr, cs_ptr, rope_ptr, W, NH, NOPE, RD, KVL, IH, ID,
                         KS3, MLA_NEOX, GS)
        else:
            u = t - T1
            m = u // IH
            g = u % IH
            pos = tl.load(pos_ptr + m).to(tl.int64)
            # the RoPE table's row and the head's raw weight requested with the partials, not
            # behind the barriers below
            rc, rs = _rope_cs(pos, cs_ptr, RD, IDX_NEOX)
            wr = tl.load(iwraw_ptr + m * IH + g)
            iwa = _sf(row, P.IWA)
            iwb = _sf(row, P.IWB)
            d = tl.arange(0, ID)
            q = _bf16(_sum_splits(iq_ptr, m, g * ID, W, NIQ, KSQ, ID, GS))
            sp = rope_ptr + W * RD + W * ID + (m * IH + g) * ID
            tl.store(sp + d, q)
            tl.debug_barrier()
            qr = _rope_rotate(sp, rc, rs, RD, IDX_NEOX)
            if not IDX_FUSED:
                qr = _bf16(qr)  # unfused: rope out bf16 (fused: fp32 straight into the quant)
            tl.debug_barrier()
            tl.store(sp + rj, qr)
            tl.debug_barrier()
            qq = tl.load(sp + d)
            if HADAMARD:
                qq = _bf16(_hadamard(sp, ID, _sf(row, P.HSCALE)))
            code, sc = _index_quant(qq, IDX_FUSED, HWQ)
            tl.store(iq8_ptr + (m * IH + g) * ID + d, _e4m3_val(code))
            tl.store(iwt_ptr + m * IH + g, ((wr * iwa) * sc) * iwb)


@triton.jit
def stage_iscore(pid, nprog, iq8_ptr, iwt_ptr, idx_cache_ptr, seqlen_ptr, req_ptr, rtt_ptr,
                 stride_rtt, scores_ptr, max_tb, stride_sc, tkh_ptr,
                 W: tl.constexpr, IH: tl.constexpr, IHP: tl.constexpr, ID: tl.constexpr,
                 PG: tl.constexpr, TB: tl.constexpr, INDEXER: tl.constexpr, FASTCVT: tl.constexpr = False,
                 TOPK: tl.constexpr = 0, TKF: tl.constexpr = False, IF16: tl.constexpr = False,
                 ISP: tl.constexpr = False, PF: tl.constexpr = False, tkf_ptr=None, fine=False):
    # ISP (Plan.ISP, a measurement knob): the page-table entries read two tiles ahead, and the
    # next tile's keys and scales requested into the L2 (PF: sm_90's prefetch; without it only
    # the lookahead runs) while this tile computes, so a tile's keys come from the L2, not the
    # HBM: at long contexts each program runs tens of tiles, one key round trip each
    # TKF (Plan.TKF, sm_90's default): each tile's scores also go into the row's first
    # top-k histogram (`topk_hist_first`), so the first radix pass has no stage of its own; the
    # histograms are zeroed by stage_qb then, two hand-offs before
    CVT: tl.constexpr = _CVT_F16 if IF16 else FASTCVT
    if INDEXER:
        if not TKF:
            # the top-k stages' histograms (4 passes x 256 bins a row) start from zero every step
            _zero_tkh(pid, nprog, tkh_ptr, W)
        # The tiles of the rows' tokens only (not of max_tb, the served context's), numbered
        # row after row as the top-k stages number their chunks (`tk_tiles`); row m's n and req
        # read once for all its tiles. Each iteration requests the next tile's page-table
        # entries before it uses its own keys, so a tile waits on one memory round trip (its
        # keys), not four (seqlen -> req -> page table -> keys)
        rows, ns = _tk_rows(seqlen_ptr, W)
        reqs = tl.load(req_ptr + rows, mask=rows < W, other=0).to(tl.int64)
        ntl = tl.minimum((ns + TB - 1) // TB, max_tb)
        first, total = _tk_tiles(rows, ntl)
        d = tl.arange(0, ID)
        hh = tl.arange(0, IHP)
        hm = hh < IH
        m, ti, tv, phys = _iscore_tile(pid, rows, ns, reqs, first, ntl, rtt_ptr, stride_rtt, TB)
        if ISP:
            m1, ti1, tv1, phys1 = _iscore_tile(pid + nprog, rows, ns, reqs, first, ntl, rtt_ptr, stride_rtt, TB)
        # num_stages=1: Triton's own pipelining of this loop (it has no branch now) took 52 more
        # VGPRs on gfx950 (220 -> 272: one program a CU, not two) and spilled 4 bytes on sm_90
        # under Triton 3.6 at 8 rows (Triton 3.8 compile checks, session 18)
        for t in tl.range(pid, total, nprog, num_stages=1):
            if ISP:
                m2, ti2, tv2, phys2 = _iscore_tile(t + 2 * nprog, rows, ns, reqs, first, ntl, rtt_ptr, stride_rtt,
                                                   TB)
                _iscore_keys_ahead(idx_cache_ptr, phys1, tv1, PG, ID, PF)
            else:
                m1, ti1, tv1, phys1 = _iscore_tile(t + nprog, rows, ns, reqs, first, ntl, rtt_ptr, stride_rtt, TB)
            pg = phys // PG
            off = phys % PG
            kb = idx_cache_ptr + pg * (PG * (ID + 4))
            kc = tl.load(kb[:, None] + off[:, None] * ID + d[None, :], mask=tv[:, None], other=0)
            ks = tl.load((kb + PG * ID).to(tl.pointer_type(tl.float32)) + off, mask=tv, other=0.0)
            q = tl.load(iq8_ptr + (m * IH + hh[:, None]) * ID + d[None, :], mask=hm[:, None], other=0.0)
            # [IHP, TB]: exact fp8 products, fp32 sum (IF16: the keys to f16 on the conversion
            # unit and f16 MMAs, the same products)
            s = _dot_as(q, tl.trans(_e4m3_operand(kc, CVT)), CVT)
            wt = tl.load(iwt_ptr + m * IH + hh, mask=hm, other=0.0)
            logit = tl.sum(tl.maximum(s, 0.0) * wt[:, None], 0) * ks
            tl.store(scores_ptr + m * stride_sc + ti, logit, mask=tv)
            if TKF:
                nm = tl.sum(tl.where(rows == m, ns, 0), 0)
                _topk_hist_first(tkh_ptr, m, logit, tv, nm, TOPK)
                if tkf_ptr is not None:
                    if fine:
                        # the spread top-k's fine histogram beside it, in a step that takes
                        # that form (Plan.TKS): not the atomics of a long step's keys
                        _topk_hist_fine(tkf_ptr, m, logit, tv, nm, TOPK)
            m = m1
            ti = ti1
            tv = tv1
            phys = phys1
            if ISP:
                m1 = m2
                ti1 = ti2
                tv1 = tv2
                phys1 = phys2


@triton.jit
def _iscore_keys_ahead(idx_cache_ptr, phys, tv, PG: tl.constexpr, ID: tl.constexpr, ON: tl.constexpr):
    """The L2 lines of a tile's index keys (a line a token) and scales at cache slots `phys`
    (the tile's tokens `tv`; the others point at the cache's first line), requested ahead."""
    page = (phys // PG) * (PG * (ID + 4))
    off = phys % PG
    row = tl.where(tv, page + off * ID, 0)
    scale = tl.where(tv, page + PG * ID + off * 4, 0)
    _prefetch_lines(idx_cache_ptr + row, ON)
    _prefetch_lines(idx_cache_ptr + scale, ON)


@triton.jit
def _zero_tkh(p, nprog, tkh_ptr, W: tl.constexpr):
    """Program p's rows of the top-k histograms (4 passes x 256 bins a row) set to zero."""
    for m in range(p, W, nprog):
        tl.store(tkh_ptr + m * TKH_ROW + tl.arange(0, TKH_ROW), tl.zeros([TKH_ROW], tl.int32))


@triton.jit
def _iscore_tile(t, rows, ns, reqs, first, ntl, rtt_ptr, stride_rtt, TB: tl.constexpr):
    """Index-score tile t of the rows' tiles (row m's are first[m] .. first[m] + ntl[m] - 1):
    its row, token indices, which of them are the row's, and their cache slots (none past the
    last tile: its row matches no row)."""
    m, p, n = _tk_locate(t, rows, ns, first, ntl)
    req = tl.sum(tl.where(rows == m, reqs, 0), 0)
    ti = p * TB + tl.arange(0, TB)
    tv = ti < n
    phys = tl.load(rtt_ptr + req * stride_rtt + ti, mask=tv, other=0).to(tl.int64)
    return m, ti, tv, phys


@triton.jit
def stage_wuv(pid, nprog, attn_ptr, wvc_ptr, wvc_s0, wvc_s1, wvc_s2, ov_ptr,
              W: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr, KVL: tl.constexpr,
              VD: tl.constexpr, VB: tl.constexpr, part_ptr=None, ml_ptr=None, NCH: tl.constexpr = 0):
    """ov = attn @ W_UV per head, a tile a (head, VB-column block). NCH > 0 (Plan.WCB, the knob
    `wuv_combine`): the tile combines the MLA chunks' partials of its head itself
    (`mla_combined_cols`, the combine stage's bits) instead of reading attn, so the combine
    stage is empty and its hand-off folded; each of a head's VD / VB tiles combines it again."""
    NVB: tl.constexpr = VD // VB
    rows = tl.arange(0, BM)
    rmask = rows < W
    vc = tl.arange(0, VB)
    BK: tl.constexpr = 64 if KVL >= 64 else KVL
    kk = tl.arange(0, BK)
    for t in range(pid, NH * NVB, nprog):
        h = t // NVB
        vb = t % NVB
        acc = tl.zeros([BM, VB], tl.float32)
        if NCH > 0:
            # not software-pipelined: each step's NCH partial loads are already in flight
            # together, and the pipeliner staged them all in shared memory (516 KB at NCH 64)
            for k0 in tl.range(0, KVL, BK, num_stages=1):
                a = mla_combined_cols(part_ptr, ml_ptr, rows, rmask, h, k0, NH, KVL, NCH, BK)
                w = tl.load(wvc_ptr + h * wvc_s0 + (k0 + kk[:, None]) * wvc_s1 + (vb * VB + vc[None, :]) * wvc_s2)
                acc += _dot(a.to(tl.bfloat16), w)
        else:
            for k0 in range(0, KVL, BK):
                a = tl.load(attn_ptr + (rows[:, None] * NH + h) * KVL + k0 + kk[None, :], mask=rmask[:, None],
                            other=0.0)
                w = tl.load(wvc_ptr + h * wvc_s0 + (k0 + kk[:, None]) * wvc_s1 + (vb * VB + vc[None, :]) * wvc_s2)
                acc += _dot(a.to(tl.bfloat16), w)
        tl.store(ov_ptr + rows[:, None] * (NH * VD) + h * VD + vb * VB + vc[None, :], _bf16(acc),
                 mask=rmask[:, None])


@triton.jit
def stage_oproj(pid, nprog, ov_ptr, wo_ptr, so_ptr, op_ptr,
                W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, KO: tl.constexpr,
                BNS: tl.constexpr, BLK: tl.constexpr, PER9: tl.constexpr, DOTF: tl.constexpr,
                fix_ptr=None, epoch=0, KSF: tl.constexpr = 0, HWX: tl.constexpr = False):
    # KSF > 0 (Plan.FIX9, a measurement knob): each column tile's last span sums its KSF slots
    # into slot 0 (`gemv.span_fixup`), so postnorm reads one (a one-rank postnorm's row
    # program summed KS9 = 6 slots of the whole row: a 7.3 us chain at 1 row, session 18).
    # HWX (Plan.OHQ): the input's e4m3 rounding on sm_90's conversion unit
    gemv_span(pid, ov_ptr, KO, wo_ptr, so_ptr, op_ptr, H, H, KO, W, BM, BNS, BLK, PER9, FMT_FP8, DOT=DOTF,
              fix_ptr=fix_ptr, epoch=epoch, KSF=KSF, HWX=HWX)


@triton.jit
def _attn_plus_resid(op_ptr, ar1_ptr, resid1_ptr, m, h0, W: tl.constexpr, H: tl.constexpr,
                     HB: tl.constexpr, KS9: tl.constexpr, R: tl.constexpr, GS: tl.constexpr = 0):
    """fp32 (attention output + residual) of row m, columns h0..h0+HB: the all-reduced bf16
    sum (R > 1) or this rank's o_proj split-K sum rounded to bf16 (GS: the slots' loads in
    flight together, `sum_slots` GROUP)."""
    c = tl.arange(0, HB)
    if R > 1:
        a = tl.load(ar1_ptr + m * H + h0 + c).to(tl.float32)
    else:
        a = _bf16(_sum_splits(op_ptr, m, h0, W, H, KS9, HB, GS))
    return a + tl.load(resid1_ptr + m * H + h0 + c).to(tl.float32)


@triton.jit
def _post_residual(op_ptr, ar1_ptr, resid1_ptr, m, off, cm, W: tl.constexpr, H: tl.constexpr,
                   KS9: tl.constexpr, R: tl.constexpr):
    """Row m's fp32 attention output + residual at offsets `off` (mask cm; any tile shape): the
    all-reduced bf16 row (R > 1) or this rank's o_proj split-K slots added in slot order and
    rounded to bf16. Elementwise, so a chunk's values are the whole-row tile's bits."""
    if R > 1:
        a = tl.load(ar1_ptr + m * H + off, mask=cm, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros(off.shape, tl.float32)
        for sl in range(KS9):
            acc += tl.load(op_ptr + sl * (W * H) + m * H + off, mask=cm, other=0.0)
        a = _bf16(acc)
    return a + tl.load(resid1_ptr + m * H + off, mask=cm, other=0.0).to(tl.float32)


@triton.jit
def stage_postnorm(pid, nprog, op_ptr, resid1_ptr, res_out_ptr, h2_ptr, w_post_ptr, eps,
                   ap_ptr, ar1_ptr, cnt_ptr, epoch, mbox_tab, flag_tab, abort_ptr, abort_tab,
                   err_ptr, rank, deadline,
                   W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, HB: tl.constexpr,
                   KS9: tl.constexpr, R: tl.constexpr, RP2: tl.constexpr, ARB: tl.constexpr,
                   CLOCK: tl.constexpr, FAULT: tl.constexpr, NC: tl.constexpr = 0, NORM: tl.constexpr = True,
                   LOOP: tl.constexpr = False, SPLIT: tl.constexpr = 0, WAIT: tl.constexpr = True):
    """TP all-reduce point 1 + residual add + post-attention RMSNorm -> res_out, h2.
    NORM False (Plan.NIR, the knob `norm_in_router`): the all-reduce alone (R > 1; nothing at
    R == 1), the norm left to the router's programs (`stage_router_normed`).

    R == 1 (one rank, or a shard run alone): the o_proj output is this rank's sum. R > 1:
    every program rounds its ARB-column blocks of the o_proj output to bf16 (the GEMM's
    output dtype), pushes them to every rank (mono_common one-shot all-reduce), and stores
    the fp32 rank-order sum rounded to bf16 (SGLang's all-reduce output) in ar1; after a
    hand-off inside the stage (the norm needs whole rows) the rows are normed from ar1.
    NC > 0 (Plan.PNC, the knob `postnorm_spread`): each row cut into NC chunks, one (row,
    chunk) an item over the programs, as `_addnorm_spread` does addnorm's: every item's program
    sums its whole row's squares as the one-program form does, then writes only its chunk.
    LOOP (Plan.PNL, the knob `postnorm_loop`): a row's program walks it in HB-column chunks,
    twice (the residual sum and its squares, then the norm from the residual made again),
    each chunk one round of loads: compact code where the whole-row [4, HB] tile's elementwise
    work (64 values a thread) is ~18 KB of straight code that a launch runs once, cold (sm_90,
    `bench/code_size.py`). Its squares are summed a chunk at a time, an order of its own.
    SPLIT > 0 (Plan.PNS, the knob `postnorm_split`; one rank): two passes over (row, SPLIT-column
    chunk) items dealt over every program, a hand-off between them (the counter the all-reduce's
    ranks use, idle at one rank): the first sums each chunk's split-K slots and residual, writes
    res_out and the chunk's sum of squares (into ap, the all-reduce's push rows, unused at one
    rank); the second sums a row's chunk partials in order for its rstd, makes its chunk's
    residual again and writes h2. So no program reads a whole row: at 1 row the one-program
    forms read its six o_proj slots (~150 KB) through one SM (H100, session 35). WAIT False (the
    staged launch, whose programs may run one after another): no wait; each second-pass item
    makes its row's chunk partials itself, the same values summed the same way (the same bits)."""
    c = tl.arange(0, HB)
    ok = True
    WHOLE: tl.constexpr = NORM and SPLIT == 0 and NC == 0 and H // HB <= 4 and not LOOP
    if WHOLE:
        # the whole-row form's norm weight requested before the all-reduce's waits (R > 1) and
        # the slots' loads, by the programs that norm a row (after a weight stream it is not in
        # the L2: an HBM round trip that the waits' barriers would otherwise hold behind them)
        woff, wcm = _row_as_4_chunks(H, HB)
        wrow = tl.load(w_post_ptr + woff, mask=wcm & (pid < W), other=0.0).to(tl.float32)
    if R > 1:
        ca = tl.arange(0, ARB)
        for blk in range(pid, H // ARB, nprog):
            for m in range(W):
                a = _sum_splits(op_ptr, m, blk * ARB, W, H, KS9, ARB)
                tl.store(ap_ptr + m * H + blk * ARB + ca, _rbf(a))
        tl.debug_barrier()
        ARM: tl.constexpr = 2 if W <= 2 else (4 if W <= 4 else 8)  # mailbox rows (pow2 >= W)
        allreduce_push(ap_ptr, H, W, epoch, mbox_tab, flag_tab, rank, pid, nprog, H, ARB, ARM, R, RP2, True)
        ok = allreduce_sum(ar1_ptr, H, W, epoch, mbox_tab, flag_tab, abort_ptr, abort_tab, err_ptr, rank,
                           pid, nprog, 16, deadline, H, ARB, ARM, R, RP2, R, CLOCK, FAULT, True, tl.bfloat16)
        if ok:
            # counter NSTAGES - 1: past the stage hand-offs' (0..NSTAGES-2)
            signal(cnt_ptr + STAGE_AR1, 1, False)
            ok = wait_ge(cnt_ptr + STAGE_AR1, epoch * nprog, abort_ptr, abort_tab, err_ptr, rank, pid, 16,
                         deadline, R, CLOCK, FAULT, False)
    if not NORM:
        pass
    elif SPLIT > 0:
        tl.static_assert(R == 1, "postnorm_split is the one-rank form")
        NCK: tl.constexpr = H // SPLIT
        NCP: tl.constexpr = 16 if NCK <= 16 else (32 if NCK <= 32 else (64 if NCK <= 64 else (
            128 if NCK <= 128 else 256)))
        tl.static_assert(NCK <= 256, "postnorm_split reads a row's chunk sums as one vector of at most 256")
        cs = tl.arange(0, SPLIT)
        pss = ap_ptr.to(tl.pointer_type(tl.float32))  # [W, NCK] chunk sums of squares
        for t in range(pid, W * NCK, nprog):
            m = t // NCK
            h0 = (t % NCK) * SPLIT
            r = _attn_plus_resid(op_ptr, ar1_ptr, resid1_ptr, m, h0, W, H, SPLIT, KS9, R, KS9)
            tl.store(res_out_ptr + m * H + h0 + cs, _rbf(r))
            tl.store(pss + t + tl.arange(0, 1), tl.sum(r * r, 0) + tl.zeros([1], tl.float32))
        # counted in both launches, so fused and staged steps can be mixed
        signal(cnt_ptr + STAGE_AR1, 1, False)
        if WAIT:
            ok = wait_ge(cnt_ptr + STAGE_AR1, epoch * nprog, abort_ptr, abort_tab, err_ptr, rank, pid, 16,
                         deadline, R, CLOCK, FAULT, False)
        if ok:
            cp = tl.arange(0, NCP)
            for t in range(pid, W * NCK, nprog):
                m = t // NCK
                h0 = (t % NCK) * SPLIT
                if WAIT:
                    part = tl.load(pss + m * NCK + cp, mask=cp < NCK, other=0.0)
                else:
                    part = tl.zeros([NCP], tl.float32)
                    for j in range(NCK):
                        rj = _attn_plus_resid(op_ptr, ar1_ptr, resid1_ptr, m, j * SPLIT, W, H, SPLIT, KS9, R, KS9)
                        part = tl.where(cp == j, tl.sum(rj * rj, 0), part)
                ssq = tl.sum(part, 0)
                rstd = tl.rsqrt(ssq / H + eps)
                r = _attn_plus_resid(op_ptr, ar1_ptr, resid1_ptr, m, h0, W, H, SPLIT, KS9, R, KS9)
                w = tl.load(w_post_ptr + h0 + cs).to(tl.float32)
                tl.store(h2_ptr + m * H + h0 + cs, _rbf(r * rstd * w))
    elif ok and NC > 0:
        CB: tl.constexpr = H // NC
        off, cm = _row_as_4_chunks(H, HB)
        cq = tl.arange(0, CB)
        for t in range(pid, W * NC, nprog):
            m = t // NC
            h0 = (t % NC) * CB
            rstd = _tile_rstd(_post_residual(op_ptr, ar1_ptr, resid1_ptr, m, off, cm, W, H, KS9, R), H, eps)
            rc = _post_residual(op_ptr, ar1_ptr, resid1_ptr, m, h0 + cq, cq >= 0, W, H, KS9, R)
            w = tl.load(w_post_ptr + h0 + cq).to(tl.float32)
            tl.store(res_out_ptr + m * H + h0 + cq, _rbf(rc))
            tl.store(h2_ptr + m * H + h0 + cq, _rbf(rc * rstd * w))
    elif ok and WHOLE:
        # the whole row as [4, HB] (as stage_addnorm): the sum and the residual computed once
        # and kept, the split-K slots one whole-row load each (KS9 memory round trips in all,
        # where the chunk loop paid ~KS9 / 2 a chunk and pass: ~18 at a TP8 rank, ~11 us);
        # the slots are added in slot order, as `_sum_splits` adds them; the weight read above
        for m in range(pid, W, nprog):
            r = _post_residual(op_ptr, ar1_ptr, resid1_ptr, m, woff, wcm, W, H, KS9, R)
            tl.store(res_out_ptr + m * H + woff, _rbf(r), mask=wcm)
            rstd = _tile_rstd(r, H, eps)
            tl.store(h2_ptr + m * H + woff, _rbf(r * rstd * wrow), mask=wcm)
    elif ok:
        # the row in HB-column chunks, twice; LOOP: a chunk's split-K slots loaded together (up
        # to 16K values in flight, 128 a thread), else `sum_slots`'s groups of 4096 values
        LG: tl.constexpr = KS9 if LOOP and KS9 * HB <= 16384 else 0
        for m in range(pid, W, nprog):
            ssq = tl.zeros([HB], tl.float32)
            for h0 in range(0, H, HB):
                r = _attn_plus_resid(op_ptr, ar1_ptr, resid1_ptr, m, h0, W, H, HB, KS9, R, LG)
                tl.store(res_out_ptr + m * H + h0 + c, _rbf(r))
                ssq += r * r
            rstd = tl.rsqrt(tl.sum(ssq, 0) / H + eps)
            for h0 in range(0, H, HB):
                r = _attn_plus_resid(op_ptr, ar1_ptr, resid1_ptr, m, h0, W, H, HB, KS9, R, LG)
                w = tl.load(w_post_ptr + h0 + c).to(tl.float32)
                tl.store(h2_ptr + m * H + h0 + c, _rbf(r * rstd * w))
    return ok


@triton.jit
def stage_router(pid, nprog, h2_ptr, wg_ptr, lg_ptr, h2q_ptr, h2s_ptr,
                 W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, E: tl.constexpr,
                 BNR: tl.constexpr, BLK: tl.constexpr, KSR: tl.constexpr, HWQ: tl.constexpr = False):
    """Router logits (bf16 GEMV, split-K), and h2 quantised for gate_up (h2q, h2s:
    `_quant_blocks`), one (row, block) an item, dealt from the last program down: the router's
    few tiles fill the first programs, and the norm stage, where only a row's program could do
    it, took ~15 us for it (H200, TP8 shard)."""
    T: tl.constexpr = ((E + BNR - 1) // BNR) * KSR
    for t in range(pid, T, nprog):
        _gemv_tile(t, h2_ptr, H, wg_ptr, wg_ptr, lg_ptr, E, E, H, W, BM, BNR, BLK, KSR, False)
    NB: tl.constexpr = H // BLK
    kb = tl.arange(0, BLK)
    for i in range(nprog - 1 - pid, W * NB, nprog):
        m = i // NB
        b0 = (i % NB) * BLK
        q, qs = _quant_blocks(tl.load(h2_ptr + m * H + b0 + kb).to(tl.float32), BLK, BLK, HWQ)
        tl.store(h2q_ptr + m * H + b0 + kb, q)
        tl.store(h2s_ptr + m * NB + b0 // BLK + tl.arange(0, 1), qs)


@triton.jit
def _post_rstd(op_ptr, ar1_ptr, resid1_ptr, m, eps, W: tl.constexpr, H: tl.constexpr, HB: tl.constexpr,
               KSX: tl.constexpr, R: tl.constexpr):
    """Row m's post-attention RMSNorm rstd as stage_postnorm's whole-row form takes it (the
    [4, HB] tile of `_row_as_4_chunks`, `_tile_rstd`): the same bits in every program."""
    off, cm = _row_as_4_chunks(H, HB)
    return _tile_rstd(_post_residual(op_ptr, ar1_ptr, resid1_ptr, m, off, cm, W, H, KSX, R), H, eps)


@triton.jit
def stage_router_normed(pid, nprog, op_ptr, ar1_ptr, resid1_ptr, res_out_ptr, h2_ptr, w_post_ptr, eps,
                        wg_ptr, lg_ptr, h2q_ptr, h2s_ptr,
                        W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, HB: tl.constexpr, E: tl.constexpr,
                        BNR: tl.constexpr, BLK: tl.constexpr, KSR: tl.constexpr, KSX: tl.constexpr,
                        R: tl.constexpr, HWQ: tl.constexpr):
    """`stage_router` with the post-attention norm folded in (Plan.NIR, the knob
    `norm_in_router`): no norm stage wrote h2, so each program derives what it reads from the
    attention output + residual (this rank's o_proj sum over KSX slots, or the all-reduced row
    when R > 1) and the rows' rstd (`_post_rstd`, each row's whole-row tile read by every
    program that needs it). The router tiles are `gemv_tile`'s bf16 x @ w^T with x = h2 made in
    the loop; the (row, block) items write res_out and h2 beside h2q / h2s. The values are the
    norm stage's: the same operations in the same order."""
    T: tl.constexpr = ((E + BNR - 1) // BNR) * KSR
    NKS: tl.constexpr = H // BLK // KSR
    rows = tl.arange(0, BM)
    rmask = rows < W
    kk = tl.arange(0, BLK)
    if pid < T:
        rs = tl.zeros([BM], tl.float32)
        for m in tl.static_range(W):
            rs = tl.where(rows == m, _post_rstd(op_ptr, ar1_ptr, resid1_ptr, m, eps, W, H, HB, KSX, R), rs)
        for t in range(pid, T, nprog):
            cols = (t // KSR) * BNR + tl.arange(0, BNR)
            cmask = cols < E
            ks = t % KSR
            acc = tl.zeros([BM, BNR], tl.float32)
            for kb in range(ks * NKS, ks * NKS + NKS):
                w = _load_w(wg_ptr, cols, cmask, kb, H, BLK, FMT_BF16)
                off = (kb * BLK + kk)[None, :] + 0 * rows[:, None]
                r = _post_residual(op_ptr, ar1_ptr, resid1_ptr, rows[:, None], off, rmask[:, None] & (off >= 0), W, H,
                                   KSX, R)
                x = _rbf(r * rs[:, None] * tl.load(w_post_ptr + kb * BLK + kk).to(tl.float32)[None, :])
                acc += _dot(x, tl.trans(w.to(tl.bfloat16)))
            tl.store(lg_ptr + ks * (W * E) + rows[:, None] * E + cols[None, :], acc,
                     mask=rmask[:, None] & cmask[None, :])
    NB: tl.constexpr = H // BLK
    for i in range(nprog - 1 - pid, W * NB, nprog):
        m = i // NB
        b0 = (i % NB) * BLK
        rstd = _post_rstd(op_ptr, ar1_ptr, resid1_ptr, m, eps, W, H, HB, KSX, R)
        r = _post_residual(op_ptr, ar1_ptr, resid1_ptr, m, b0 + kk, kk >= 0, W, H, KSX, R)
        tl.store(res_out_ptr + m * H + b0 + kk, _rbf(r))
        h2 = _rbf(r * rstd * tl.load(w_post_ptr + b0 + kk).to(tl.float32))
        tl.store(h2_ptr + m * H + b0 + kk, h2)
        q, qs = _quant_blocks(h2.to(tl.float32), BLK, BLK, HWQ)
        tl.store(h2q_ptr + m * H + b0 + kk, q)
        tl.store(h2s_ptr + m * NB + b0 // BLK + tl.arange(0, 1), qs)


@triton.jit
def stage_gateup(pid, nprog, lg_ptr, bias_ptr, h2q_ptr, h2s_ptr, w13_ptr, s13_ptr, wsh13_ptr, ssh13_ptr,
                 gu_ptr, slot_e_ptr, slot_w_ptr, nslot_ptr, w2_ptr, loc_ptr,
                 W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, E: tl.constexpr,
                 TOPE: tl.constexpr, KSR: tl.constexpr, I: tl.constexpr, BN: tl.constexpr,
                 BLK: tl.constexpr, KSG: tl.constexpr, NSLOT: tl.constexpr, PF: tl.constexpr,
                 FASTCVT: tl.constexpr = False, GDOT: tl.constexpr = 0, fold_ptr=None, inter_ptr=None,
                 inters_ptr=None, BI: tl.constexpr = 128, HWQ: tl.constexpr = False,
                 PFN: tl.constexpr = 0, SPAN: tl.constexpr = False, PER: tl.constexpr = 1):
    # GDOT (Plan.GDOT; BN is Plan.BNG when set): gate_up's MMA form (`moe_gateup`), a
    # measurement knob; fold_ptr (Plan.SFO, a measurement knob): the slots' tile counters, each
    # slot's last tile running its SiLU (`moe_gateup`'s fold)
    # every program routes (the same bits everywhere), so no extra hand-off is needed
    WP2: tl.constexpr = 2 if W <= 2 else (4 if W <= 4 else 8)
    # Pad rows route to no expert: their cache slot is -1 (`GlmLayerKernel.set_inputs`) or
    # SGLang's padding slot 0 (its KV pools reserve slot 0's page for the writes of graph-padded
    # rows; real tokens get slots of later pages). Their experts were computed for nothing: at 1
    # row of a width-2 launch, 16 experts instead of 8. A pad row's MoE output is then its
    # shared expert alone; no real row's output changes.
    rw = tl.arange(0, WP2)
    live = tl.load(loc_ptr + rw, mask=rw < W, other=0) > 0
    wmat, used = _routing(lg_ptr, bias_ptr, W, WP2, E, TOPE, KSR, live)
    csum, nu = _fill_slots(pid, wmat, used, slot_e_ptr, slot_w_ptr, nslot_ptr, W, WP2, E, NSLOT)
    # the routed experts' down rows are requested once this program's gate_up tiles are done
    # (requesting their gate_up rows first too made gate_up slower: 40 against 34 us at 2 rows,
    # H200 stamps, session 12: its tiles wait on their own loads either way)
    _moe_gateup(pid, nprog, used, csum, nu, h2q_ptr, h2s_ptr, w13_ptr, s13_ptr, wsh13_ptr, ssh13_ptr, gu_ptr,
                W, BM, H, E, I, BN, BLK, KSG, NSLOT, SPAN=SPAN, PER=PER, FASTCVT=FASTCVT, GDOT=GDOT,
                fold_ptr=fold_ptr,
                inter_ptr=inter_ptr, inters_ptr=inters_ptr, BI=BI, HW=HWQ)
    q, n, on = _pf_programs(pid, nprog, PFN)
    if on:
        _prefetch_slots(q, n, used, csum, nu, w2_ptr, H * I, E, PF)


@triton.jit
def stage_down(pid, nprog, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, slot_e_ptr, slot_w_ptr,
               nslot_ptr, out_ptr, routed_scale, dp_ptr, epoch, mbox_tab, flag_tab, abort_ptr,
               abort_tab, err_ptr, rank, deadline,
               W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, I: tl.constexpr,
               BND: tl.constexpr, BLK: tl.constexpr, NSLOT: tl.constexpr, R: tl.constexpr,
               RP2: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr, DSTG: tl.constexpr = 0,
               FASTCVT: tl.constexpr = False, DSTEP: tl.constexpr = 1, IDV: tl.constexpr = False,
               z_ptr=None, dcnt_ptr=None, DIT: tl.constexpr = False):
    # R > 1: this rank's partial goes to dp, which all-reduce point 2 sums into out
    if R > 1:
        o_ptr = dp_ptr
    else:
        o_ptr = out_ptr
    # DIT (Plan.DIT, a knob): (column tile, slot) items in equal spans, each tile summed by its
    # last item's program, which pushes it to the all-reduce itself (R > 1)
    if DIT:
        _moe_down_items(pid, nprog, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, slot_e_ptr,
                        slot_w_ptr, nslot_ptr, z_ptr, dcnt_ptr, o_ptr, routed_scale, W, BM, H, I, BND, BLK, NSLOT,
                        DSTG, FASTCVT, R, epoch, mbox_tab, flag_tab, rank, RP2)
    else:
        _moe_down(pid, nprog, inter_ptr, inters_ptr, w2_ptr, s2_ptr, wsh2_ptr, ssh2_ptr, slot_e_ptr, slot_w_ptr,
                  nslot_ptr, o_ptr, routed_scale, W, BM, H, I, BND, BLK, NSLOT, DSTG, FASTCVT, DSTEP, IDV)
    # TP all-reduce point 2 (R > 1): this rank's bf16 MoE partial, pushed per BND-column tile
    # by the program that computed it, summed in rank order into the layer output
    ok = True
    if R > 1:
        tl.debug_barrier()
        ARM: tl.constexpr = 2 if W <= 2 else (4 if W <= 4 else 8)  # mailbox rows (pow2 >= W)
        if not DIT:
            allreduce_push(dp_ptr, H, W, epoch, mbox_tab, flag_tab, rank, pid, nprog, H, BND, ARM, R, RP2, True)
        ok = allreduce_sum(out_ptr, H, W, epoch, mbox_tab, flag_tab, abort_ptr, abort_tab, err_ptr, rank,
                           pid, nprog, 20, deadline, H, BND, ARM, R, RP2, R, CLOCK, FAULT, True, tl.bfloat16)
    return ok


# ----------------------------------------------------------------------------- the launch
@triton.jit
def _code_pad(stamps, pid, PAD: tl.constexpr):
    """A measurement probe of what a KB of code costs where the layer runs it (Plan.PADKB):
    |PAD| x 16 steps of four independent fused multiply-add chains (~|PAD| KB of SASS: four
    16-byte instructions a step, every constant an immediate so nothing folds) on values only
    the program id decides, their sum stored in entry 0 of the program's stamp row (no other
    reader). PAD > 0: straight-line, each instruction fetched once (cold, from wherever the
    layer left the line: L2 or HBM); PAD < 0: the same steps as a loop whose trip count the
    compiler cannot know (ptxas unrolls it to a ~4 KB body, Triton 3.8), so the same
    instructions issue from lines fetched once. The launch's time with one form against the
    other is the fetch cost of |PAD| - 4 KB there."""
    a = (pid + 1).to(tl.float32) * 1e-3
    b = a + 1.0
    c = a + 2.0
    d = a + 3.0
    if PAD > 0:
        for i in tl.static_range(PAD * 16):
            a = a * (1.0 + (i + 1) * 1e-7) + 0.25
            b = b * (1.0 - (i + 1) * 1e-7) + 0.5
            c = c * (1.0 + (i + 1) * 2e-7) - 0.25
            d = d * (1.0 - (i + 1) * 2e-7) - 0.5
    else:
        # pid >> 30 is 0 at any grid, unknown to the compiler: a loop of four steps a trip
        # (16 multiply-adds and the loop's own ~3 instructions), kept rolled
        for _ in tl.range((pid >> 30), -PAD * 4 + (pid >> 30), loop_unroll_factor=1):
            for j in tl.static_range(4):
                a = a * (1.0 + (j + 1) * 1e-7) + 0.25
                b = b * (1.0 - (j + 1) * 1e-7) + 0.5
                c = c * (1.0 + (j + 1) * 2e-7) - 0.25
                d = d * (1.0 - (j + 1) * 2e-7) - 0.5
    tl.store(stamps, (a + b + c + d).to(tl.int64))


@triton.jit
def _prefetch_next(row, pid, nprog, NQKV: tl.constexpr, H: tl.constexpr, ID: tl.constexpr, IH: tl.constexpr,
                   INDEXER: tl.constexpr, IDX_FUSED: tl.constexpr, PFN: tl.constexpr = 0):
    """Plan.NXS: the next layer's fused q_a/kv_a weights and (INDEXER) its index wk /
    weights_proj requested into the L2, dealt over the programs (`ptable` next_*: addresses the
    host sets from GlmLayerKernel.next_weights, zero for none), so the next launch's first
    stages find them there instead of waiting on the HBM at its start. sm_90 only."""
    _prefetch_at(_sl(row, P.NEXT_WQKV), pid, nprog, NQKV * H, PFN)
    if INDEXER:
        if IDX_FUSED:
            _prefetch_at(_sl(row, P.NEXT_WWP), pid, nprog, (ID + IH) * H * 2, PFN)
        else:
            _prefetch_at(_sl(row, P.NEXT_WK), pid, nprog, ID * H, PFN)
            _prefetch_at(_sl(row, P.NEXT_WWP), pid, nprog, IH * H * 2, PFN)


@triton.jit
def _prefetch_attn_out(row, pid, nprog, H: tl.constexpr, NH: tl.constexpr, VD: tl.constexpr, E: tl.constexpr,
                       I: tl.constexpr, PF: tl.constexpr, PFN: tl.constexpr):
    """o_proj's, the router's and the shared expert's weights requested into the L2 (Plan.PFS
    site PFS_OPROJ or PFS_OPROJ_LATE)."""
    _prefetch_pf(pid, nprog, _p(row, P.WO, tl.uint8), H * NH * VD, PF, PFN)
    _prefetch_pf(pid, nprog, _p(row, P.WG, tl.bfloat16), E * H * 2, PF, PFN)
    _prefetch_pf(pid, nprog, _p(row, P.WSH13, tl.uint8), 2 * I * H, PF, PFN)
    _prefetch_pf(pid, nprog, _p(row, P.WSH2, tl.uint8), H * I, PF, PFN)


@triton.jit
def _prefetch_topk_site(row, pid, nprog, ON: tl.constexpr, H: tl.constexpr, NH: tl.constexpr, VD: tl.constexpr,
                        E: tl.constexpr, I: tl.constexpr, PF: tl.constexpr, PFN: tl.constexpr):
    """Site PFS_TOPK (ON): `_prefetch_attn_out` where the top-k begins."""
    if ON:
        _prefetch_attn_out(row, pid, nprog, H, NH, VD, E, I, PF, PFN)


@triton.jit
def _prefetch_at(a, pid, nprog, nbytes, PFN: tl.constexpr = 0):
    """`_prefetch_pf` of nbytes at address a (an int64 table word), none when it is zero."""
    if a != 0:
        _prefetch_pf(pid, nprog, a.to(tl.pointer_type(tl.uint8)), nbytes, True, PFN)


@triton.jit
def _pf_programs(pid, nprog, PFN: tl.constexpr):
    """(q, n, on): the programs that issue the weights' L2 prefetches, every program (PFN 0) or
    the last PFN only (Plan.PFN, the knob `prefetch_programs`: fewer programs keep fewer prefetches
    queued in the memory system ahead of the other programs' dependent loads): program pid's
    number among them, their count, and whether pid is one of them."""
    if PFN > 0:
        q = pid - (nprog - PFN)
        n = PFN
        on = q >= 0
    else:
        q = pid
        n = nprog
        on = True
    return q, n, on


@triton.jit
def _prefetch_pf(pid, nprog, base, nbytes, ON: tl.constexpr, PFN: tl.constexpr):
    """`_prefetch` by the programs of `_pf_programs`."""
    q, n, on = _pf_programs(pid, nprog, PFN)
    if on:
        _prefetch(q, n, base, nbytes, ON)


@triton.jit
def _stamp(row, i: tl.constexpr, pid, CLOCK: tl.constexpr):
    """Store the clock at this program's stamp entry i when the launch profiles (STAMP)."""
    if _si(row, P.STAMP) != 0:
        tl.store(_p(row, P.STAMPS, tl.int64) + pid * STAMP_W + i, now(CLOCK))


@triton.jit
def _sync(row, s, epoch, nprog, pid,
          WAIT: tl.constexpr, NRANK: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr,
          PAD: tl.constexpr = 0, CALL: tl.constexpr = False):
    """`_sync_now` inlined, or (CALL bit 0, sm_90: Plan.SYC, a measurement knob) as a call of one
    copy of it for every hand-off, its stage a runtime value (`_sync_call`). CALL bit 1 (sm_90:
    Plan.HSP, a measurement knob): the wait's poll in one thread's loop (`guard.wait_ge_spin`)."""
    SPIN: tl.constexpr = CALL >= 2 and CLOCK == 0
    if CALL % 2 == 1 and CLOCK == 0:
        ok = _sync_call(row, s + tl.zeros([], tl.int32), epoch, nprog, pid, WAIT, NRANK, CLOCK, FAULT, PAD, SPIN)
    else:
        ok = _sync_now(row, s, epoch, nprog, pid, WAIT, NRANK, CLOCK, FAULT, PAD, SPIN)
    return ok


@triton.jit(noinline=True)
def _sync_call(row, s, epoch, nprog, pid, WAIT: tl.constexpr, NRANK: tl.constexpr, CLOCK: tl.constexpr,
               FAULT: tl.constexpr, PAD: tl.constexpr, SPIN: tl.constexpr):
    return _sync_now(row, s, epoch, nprog, pid, WAIT, NRANK, CLOCK, FAULT, PAD, SPIN)


@triton.jit
def _sync_now(row, s, epoch, nprog, pid,
              WAIT: tl.constexpr, NRANK: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr,
              PAD: tl.constexpr = 0, SPIN: tl.constexpr = False):
    """Hand-off between stage s-1 and s: release this program's stage s-1 stores (counter
    s-1 += 1), then, when WAIT (the fused launch), wait until every program did (counter >=
    epoch * nprog). The staged launch signals without waiting (its launch boundary orders),
    so both modes share one epoch and one set of counters and can be mixed step by step.

    s is a constexpr but in the radix passes' loop (Plan.TKL, `_tkhist_loop`) and in `_sync_call`.
    Returns ok (False: the error word is written, stop). delay > 0 spins a pseudo-random
    0..delay ticks first (runtime, so the delay-injection test runs the product's binary).
    stall == s: program 0 stops here without signalling (the injected wait fault of
    MONO_GLM53_FAULT): every other program's wait on this hand-off must expire.

    PAD != 0 (the fused launch only; Plan.PADKB, a measurement probe): every program runs
    `_code_pad` of |PAD| KB after passing the hand-off, before stage s."""
    # sm_90: the table words the hand-off reads are loaded first, before any branch on one of
    # them: the loads are independent, so they cost one memory latency together, not one each
    # (read one by one, each behind the branch on the one before, ~2 us a hand-off). gfx950
    # (CLOCK 1) reads each where it is used, as before: held from the start they spilled its
    # SGPRs (TP8 rank, 8 rows).
    ok = True
    if CLOCK == 1:
        ok = _sync_lazy(row, s, epoch, nprog, pid, WAIT, NRANK, CLOCK, FAULT, PAD)
    else:
        stall = _si(row, P.STALL)
        stamp_on = _si(row, P.STAMP)
        cnt_ptr = _p(row, P.CNT, tl.int32)
        if WAIT:
            delay = _sl(row, P.DELAY)
            stamps = _p(row, P.STAMPS, tl.int64) + pid * STAMP_W
            abort_ptr = _pu(row, P.ABORT, tl.int32)
            abort_tab = _p(row, P.ABORT_TAB, tl.int64)
            err_ptr = _p(row, P.ERR, tl.int64)
            rank = _si(row, P.RANK)
            deadline = _sl(row, P.DEADLINE)
        if (stall == s) & (pid == 0):
            return False
        if WAIT:
            _delay(pid, epoch, s, delay, CLOCK)
            if stamp_on != 0:
                tl.store(stamps + 2 * s, now(CLOCK))
        signal(cnt_ptr + (s - 1), 1, False)
        if WAIT:
            if SPIN:
                ok = wait_ge_spin(cnt_ptr + (s - 1), epoch * nprog, abort_ptr, abort_tab, err_ptr, rank, pid,
                                  s, deadline, NRANK, CLOCK, FAULT, False)
            else:
                ok = wait_ge(cnt_ptr + (s - 1), epoch * nprog, abort_ptr, abort_tab, err_ptr, rank, pid,
                             s, deadline, NRANK, CLOCK, FAULT, False)
            if stamp_on != 0:
                tl.store(stamps + 2 * s + 1, now(CLOCK))
            if PAD != 0:
                _code_pad(stamps, pid, PAD)
    return ok


@triton.jit
def _skip(row, s: tl.constexpr, pid, WAIT: tl.constexpr, CLOCK: tl.constexpr):
    """Hand-off s where the stages either side of it are one (`layer.folded_handoffs`:
    Plan.TKF): no counter, no wait. A fused launch writes both its stamps with one clock
    reading (the emptied stage's span reads ~0; `stamps.summarize` reports no hand-off here).
    stall == s (the injected wait fault) stops program 0 here: the next hand-off's waits
    expire instead."""
    ok = True
    if (_si(row, P.STALL) == s) & (pid == 0):
        return False
    if WAIT:
        if _si(row, P.STAMP) != 0:
            t = now(CLOCK)
            st = _p(row, P.STAMPS, tl.int64) + pid * STAMP_W + 2 * s
            tl.store(st, t)
            tl.store(st + 1, t)
    return ok


@triton.jit
def _handoff(row, s: tl.constexpr, FOLD: tl.constexpr, epoch, nprog, pid, WAIT: tl.constexpr, NRANK: tl.constexpr,
             CLOCK: tl.constexpr, FAULT: tl.constexpr, PAD: tl.constexpr, CALL: tl.constexpr):
    """Hand-off s: `_sync`, or `_skip` where the stages either side of it are one (FOLD: a
    hand-off of `layer.folded_handoffs`)."""
    if FOLD:
        ok = _skip(row, s, pid, WAIT, CLOCK)
    else:
        ok = _sync(row, s, epoch, nprog, pid, WAIT, NRANK, CLOCK, FAULT, PAD, CALL)
    return ok


@triton.jit
def _signal_only(row, s: tl.constexpr, pid, WAIT: tl.constexpr, CLOCK: tl.constexpr):
    """Hand-off s that this step needs no wait at (Plan.TKW when no row is longer than it:
    stage s has nothing to do, the next hand-off orders what comes after): release counter
    s - 1 as `_sync` does, so its targets stay in step for the steps that wait there, but do
    not wait. Stamps and the injected fault as `_skip`."""
    ok = _skip(row, s, pid, WAIT, CLOCK)
    if ok:
        signal(_p(row, P.CNT, tl.int32) + (s - 1), 1, False)
    return ok


@triton.jit
def _delay(pid, epoch, s, delay, CLOCK: tl.constexpr):
    """delay > 0: spin a pseudo-random 0..delay ticks (the random stage-delay test)."""
    if delay > 0:
        hsh = (pid * 1103515245 + epoch * 12345 + s * 7919) & 0x7FFFFFFF
        dl = (hsh % delay).to(tl.int64)
        t0 = now(CLOCK)
        while now(CLOCK) - t0 < dl:
            pass


@triton.jit
def _sync_lazy(row, s, epoch, nprog, pid,
               WAIT: tl.constexpr, NRANK: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr,
               PAD: tl.constexpr = 0):
    """`_sync` reading each table word where it is used (gfx950)."""
    ok = True
    if (_si(row, P.STALL) == s) & (pid == 0):
        return False
    if WAIT:
        _delay(pid, epoch, s, _sl(row, P.DELAY), CLOCK)
        _stamp(row, 2 * s, pid, CLOCK)
    cnt_ptr = _p(row, P.CNT, tl.int32)
    signal(cnt_ptr + (s - 1), 1, False)
    if WAIT:
        ok = wait_ge(cnt_ptr + (s - 1), epoch * nprog, _pu(row, P.ABORT, tl.int32),
                     _p(row, P.ABORT_TAB, tl.int64), _p(row, P.ERR, tl.int64), _si(row, P.RANK), pid,
                     s, _sl(row, P.DEADLINE), NRANK, CLOCK, FAULT, False)
        _stamp(row, 2 * s + 1, pid, CLOCK)
        if PAD != 0:
            _code_pad(_p(row, P.STAMPS, tl.int64) + pid * STAMP_W, pid, PAD)
    return ok


@triton.jit
def _tkhist_at(row, ok, s: tl.constexpr, epoch, nprog, pid, nck, FIRST: tl.constexpr, LAST: tl.constexpr,
               FUSED: tl.constexpr, R: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr,
               W: tl.constexpr, TOPK: tl.constexpr, INDEXER: tl.constexpr, TKF: tl.constexpr = False,
               PADS: tl.constexpr = 0, PADKB: tl.constexpr = 0, SYC: tl.constexpr = False, TKP: tl.constexpr = False):
    """Stage s of 6..9 when in FIRST..LAST: the hand-off into it, then radix pass s - 6 (TKF:
    pass 0 ran in the index scores, stage 6 is empty and has no hand-off; TKP: the rows'
    threshold digits derived once a run of a program's tiles, `topk_hist` ONCE)."""
    if FIRST <= s and LAST >= s and TKF and s == 6:
        if ok:
            ok = _skip(row, s, pid, FUSED and FIRST < s, CLOCK)
    elif FIRST <= s and LAST >= s:
        ok = _tkhist_pass(row, ok, s, epoch, nprog, pid, nck, FUSED and FIRST < s, R, CLOCK, FAULT, W, TOPK,
                          INDEXER, PADKB if PADS == s else 0, SYC, False, TKP)
    return ok


@triton.jit
def _tkhist_pass(row, ok, s, epoch, nprog, pid, nck, WAIT: tl.constexpr, R: tl.constexpr, CLOCK: tl.constexpr,
                 FAULT: tl.constexpr, W: tl.constexpr, TOPK: tl.constexpr, INDEXER: tl.constexpr,
                 PAD: tl.constexpr = 0, SYC: tl.constexpr = False, RT: tl.constexpr = False,
                 ONCE: tl.constexpr = False):
    """Stage s of 6..9: the hand-off into it, then radix pass s - 6 (RT: s a runtime value;
    ONCE: `topk_hist` ONCE)."""
    if ok:
        ok = _sync(row, s, epoch, nprog, pid, WAIT, R, CLOCK, FAULT, PAD, SYC)
    if ok:
        stage_tkhist(pid, nprog, _p(row, P.SCORES, tl.float32), _si(row, P.STRIDE_SC),
                     _p(row, P.SEQLEN, tl.int32), _p(row, P.TKH, tl.int32), nck, W, TOPK, INDEXER, s - 6, RT, ONCE)
    return ok


@triton.jit
def _tkcount_at(row, ok, epoch, nprog, pid, nck, WAIT: tl.constexpr, R: tl.constexpr, CLOCK: tl.constexpr,
                FAULT: tl.constexpr, PAD: tl.constexpr, SYC: tl.constexpr, W: tl.constexpr, TOPK: tl.constexpr,
                INDEXER: tl.constexpr, TKW: tl.constexpr = 0, TKP: tl.constexpr = False):
    """Stage 10: the hand-off into it, then the top-k's chunk counts (TKW: of the rows longer
    than TKW only, `stage_tkcount` SHORT; TKP: `stage_tkcount` ONCE)."""
    if ok:
        ok = _sync(row, 10, epoch, nprog, pid, WAIT, R, CLOCK, FAULT, PAD, SYC)
    if ok:
        stage_tkcount(pid, nprog, _p(row, P.SCORES, tl.float32), _si(row, P.STRIDE_SC),
                      _p(row, P.SEQLEN, tl.int32), _p(row, P.TKH, tl.int32), _p(row, P.TKC, tl.int32), nck, W, TOPK,
                      INDEXER, TKW, TKP)
    return ok


@triton.jit
def _tkhist_loop(row, ok, epoch, nprog, pid, nck, FIRST: tl.constexpr, LAST: tl.constexpr,
                 FUSED: tl.constexpr, R: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr,
                 W: tl.constexpr, TOPK: tl.constexpr, INDEXER: tl.constexpr, TKF: tl.constexpr,
                 SYC: tl.constexpr = False):
    """`_tkhist_at` for stages 6..9 in FIRST..LAST as one runtime loop over the passes
    (Plan.TKL): one copy of the hand-off and the pass in the binary, not four, the same
    integers. TKF: stage 6 is the empty one, unrolled as before."""
    A: tl.constexpr = FIRST if FIRST > 6 + TKF else 6 + TKF
    B: tl.constexpr = LAST + 1 if LAST < 9 else 10
    # a fused launch runs every stage (FIRST 0), so each looped hand-off waits
    tl.static_assert(not FUSED or FIRST < 6, "a fused launch starts before the radix passes")
    if TKF:
        ok = _tkhist_at(row, ok, 6, epoch, nprog, pid, nck, FIRST, LAST, FUSED, R, CLOCK, FAULT, W, TOPK, INDEXER,
                        TKF, 0, 0, SYC)
    for s in range(A, B):
        ok = _tkhist_pass(row, ok, s, epoch, nprog, pid, nck, FUSED, R, CLOCK, FAULT, W, TOPK, INDEXER, 0, SYC, True)
    return ok


# Every runtime value but the weight-absorption strides is in the table: rank, deadline, delay
# and the fault stage too, so no value Triton would specialise on (rank 1, delay 0) varies
# between ranks or launches, and none holds a scalar register for the whole launch.
@triton.jit
def _topk_stages(row, ok, epoch, nprog, pid, nck, FIRST: tl.constexpr, LAST: tl.constexpr, FUSED: tl.constexpr,
                 R: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr, W: tl.constexpr, TOPK: tl.constexpr,
                 INDEXER: tl.constexpr, TKF: tl.constexpr, TKL: tl.constexpr, TKW: tl.constexpr, TKP: tl.constexpr,
                 PADS: tl.constexpr, PADKB: tl.constexpr, SYC: tl.constexpr):
    """Stages 6-11 in FIRST..LAST: the exact top-k's four radix passes, the chunk counts and the
    write (TKC keys a tile)."""
    i32 = tl.int32
    f32 = tl.float32
    if TKL:
        ok = _tkhist_loop(row, ok, epoch, nprog, pid, nck, FIRST, LAST, FUSED, R, CLOCK, FAULT, W, TOPK, INDEXER, TKF,
                          SYC)
    else:
        for s in tl.static_range(6, 10):
            ok = _tkhist_at(row, ok, s, epoch, nprog, pid, nck, FIRST, LAST, FUSED, R, CLOCK, FAULT, W, TOPK,
                            INDEXER, TKF, PADS, PADKB, SYC, TKP)
    if FIRST <= 10 and LAST >= 10:
        # TKW: the write counts rows of at most TKW tokens itself; a step with no longer row
        # has nothing to count, and its hand-off only signals (every program decides alike)
        if TKW > 0 and INDEXER:
            if ok:
                if _tk_rows_short(_p(row, P.SEQLEN, i32), W, TKW):
                    ok = _signal_only(row, 10, pid, FUSED and FIRST < 10, CLOCK)
                else:
                    ok = _tkcount_at(row, ok, epoch, nprog, pid, nck, FUSED and FIRST < 10, R, CLOCK, FAULT,
                                     PADKB if PADS == 10 else 0, SYC, W, TOPK, INDEXER, TKW, TKP)
        else:
            ok = _tkcount_at(row, ok, epoch, nprog, pid, nck, FUSED and FIRST < 10, R, CLOCK, FAULT,
                             PADKB if PADS == 10 else 0, SYC, W, TOPK, INDEXER, 0, TKP)
    if FIRST <= 11 and LAST >= 11:
        if ok:
            ok = _sync(row, 11, epoch, nprog, pid, FUSED and FIRST < 11, R,
                       CLOCK, FAULT, PADKB if PADS == 11 else 0, SYC)
        if ok:
            stage_tkwrite(pid, nprog, _p(row, P.SCORES, f32), _si(row, P.STRIDE_SC), _p(row, P.SEQLEN, i32),
                          _p(row, P.TKH, i32), _p(row, P.TKC, i32), _p(row, P.TOPK, i32), nck, W, TOPK, INDEXER,
                          TKW, TKP)
    return ok


@triton.jit
def _tka_part(row, W: tl.constexpr, TKR: tl.constexpr, TKA: tl.constexpr, INDEXER: tl.constexpr):
    """stage_absorb's part for stage 4: 1 (the index tiles alone) in a step that takes the row
    top-k with the absorption beside it (Plan.TKA: every program reads the same lengths, so
    every program takes the same part), else 0 (every tile)."""
    if TKA and TKR > 0 and INDEXER:
        part = tl.where(_tk_rows_short(_p(row, P.SEQLEN, tl.int32), W, TKR), 1, 0)
    else:
        part = 0
    return part


@triton.jit
def _tkrow_stages(row, ok, epoch, nprog, pid, FIRST: tl.constexpr, LAST: tl.constexpr, FUSED: tl.constexpr,
                  R: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr, W: tl.constexpr, TOPK: tl.constexpr,
                  TKR: tl.constexpr, SYC: tl.constexpr):
    """Stages 6 and 7 in FIRST..LAST of a step whose rows all have at most TKR tokens (Plan.TKR),
    after `_tk_short_entry` (the caller's: hand-offs 6 and 7): stage 6 is empty (TKF: the first
    radix pass ran in the index scores), stage 7 waits for the scores and gives each row's whole
    top-k to one program (`topk_rows_one`), its search seeded
    by that pass's histogram (HIST); then hand-offs 8-11 only signal (`_tkrow_signals`): hand-
    off 12 orders the rows' writes before the MLA as hand-off 8 would have."""
    if FIRST <= 7 and LAST >= 7:
        if ok:
            _topk_rows_one(pid, nprog, _p(row, P.SCORES, tl.float32), _si(row, P.STRIDE_SC),
                           _p(row, P.SEQLEN, tl.int32), _p(row, P.TOPK, tl.int32), W, TOPK, TKR,
                           _p(row, P.TKH, tl.int32), True)
    return ok


@triton.jit
def _tk_spread_step(row, W: tl.constexpr, TKS: tl.constexpr, INDEXER: tl.constexpr):
    """Whether this step takes the spread top-k (Plan.TKS: every row at most TKS tokens); every
    program reads the same lengths, so every program (and every stage) decides alike."""
    if TKS > 0 and INDEXER:
        spread = _tk_rows_short(_p(row, P.SEQLEN, tl.int32), W, TKS)
    else:
        spread = False
    return spread


@triton.jit
def _tk_short_entry(row, ok, epoch, nprog, pid, FIRST: tl.constexpr, LAST: tl.constexpr, FUSED: tl.constexpr,
                    R: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr, SYC: tl.constexpr):
    """Hand-offs 6 and 7 in FIRST..LAST of a short step's top-k (Plan.TKR or TKS): 6 folded (the
    first radix pass ran in the index scores), 7 waits for the scores."""
    if FIRST <= 6 and LAST >= 6:
        if ok:
            ok = _skip(row, 6, pid, FUSED and FIRST < 6, CLOCK)
    if FIRST <= 7 and LAST >= 7:
        if ok:
            ok = _sync(row, 7, epoch, nprog, pid, FUSED and FIRST < 7, R, CLOCK, FAULT, 0, SYC)
    return ok


@triton.jit
def _tkspread_stages(row, ok, epoch, nprog, pid, FIRST: tl.constexpr, LAST: tl.constexpr, FUSED: tl.constexpr,
                     R: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr, W: tl.constexpr, TOPK: tl.constexpr,
                     TKS: tl.constexpr, RKS: tl.constexpr, SYC: tl.constexpr, TSS: tl.constexpr = False):
    """Stages 6-11 in FIRST..LAST of a step whose rows all have at most TKS tokens (Plan.TKS),
    after `_tk_short_entry` (the caller's: hand-offs 6 and 7): stage 6 is empty (TKF: the first
    radix pass and the fine histograms ran in the index scores, zeroed by stage_qb), stage 7
    waits for the scores and finds each long row's threshold by the tiles holding its
    candidates (`topk_spread_threshold`, from those histograms), stage 8
    waits for the thresholds and places every row's keys (`topk_spread_write`); hand-offs 9-11
    only signal: hand-off 12 orders the writes before the MLA as after the radix stages'. TSS
    (Plan.TSS): stage 7 does both, each tile finding its row's threshold itself
    (`topk_spread_select`), hand-offs 8-11 only signal."""
    i32 = tl.int32
    if TSS:
        if FIRST <= 7 and LAST >= 7:
            if ok:
                _topk_spread_select(pid, nprog, _p(row, P.SCORES, tl.float32), _si(row, P.STRIDE_SC),
                                    _p(row, P.SEQLEN, i32), _p(row, P.TKH, i32), _p(row, P.TKFINE, i32),
                                    _p(row, P.TOPK, i32), W, TOPK, TKS, RKS)
        ok = _tkrow_signals(row, ok, pid, FIRST, LAST, FUSED, CLOCK, 8)
    else:
        if FIRST <= 7 and LAST >= 7:
            if ok:
                _topk_spread_threshold(pid, nprog, _p(row, P.SCORES, tl.float32), _si(row, P.STRIDE_SC),
                                       _p(row, P.SEQLEN, i32), _p(row, P.TKH, i32), _p(row, P.TKFINE, i32), W, TOPK,
                                       TKS, RKS)
        if FIRST <= 8 and LAST >= 8:
            if ok:
                ok = _sync(row, 8, epoch, nprog, pid, FUSED and FIRST < 8, R, CLOCK, FAULT, 0, SYC)
            if ok:
                _topk_spread_write(pid, nprog, _p(row, P.SCORES, tl.float32), _si(row, P.STRIDE_SC),
                                   _p(row, P.SEQLEN, i32), _p(row, P.TKH, i32), _p(row, P.TOPK, i32), W, TOPK, TKS,
                                   RKS)
        ok = _tkrow_signals(row, ok, pid, FIRST, LAST, FUSED, CLOCK, 9)
    return ok


@triton.jit
def _tkrow_signals(row, ok, pid, FIRST: tl.constexpr, LAST: tl.constexpr, FUSED: tl.constexpr,
                   CLOCK: tl.constexpr, S0: tl.constexpr = 8):
    """Hand-offs S0-11 of a short step's top-k, signalled only (`_tkrow_stages`: from 8,
    `_tkspread_stages`: from 9)."""
    for s in tl.static_range(S0, 12):
        if FIRST <= s and LAST >= s:
            if ok:
                ok = _signal_only(row, s, pid, FUSED and FIRST < s, CLOCK)
    return ok


@triton.jit
def layer_kernel(
    # every tensor of the launch, one row of `ptable.SLOTS` (R rows when SIM)
    ptab,
    # strides
    wkc_s0, wkc_s1, wkc_s2, wvc_s0, wvc_s1, wvc_s2,
    # shape
    W: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, QL: tl.constexpr, KVL: tl.constexpr,
    RD: tl.constexpr, NOPE: tl.constexpr, VD: tl.constexpr, NH: tl.constexpr, IH: tl.constexpr,
    IHP: tl.constexpr, ID: tl.constexpr, TOPK: tl.constexpr, E: tl.constexpr,
    TOPE: tl.constexpr, I: tl.constexpr, BLK: tl.constexpr, PG: tl.constexpr, HB: tl.constexpr,
    NSLOT: tl.constexpr, INDEXER: tl.constexpr, IDX_FUSED: tl.constexpr,
    HADAMARD: tl.constexpr, MLA_NEOX: tl.constexpr, IDX_NEOX: tl.constexpr,
    # tiling
    BN: tl.constexpr, KS1: tl.constexpr, KSI: tl.constexpr, KS3: tl.constexpr,
    KSQ: tl.constexpr, KS9: tl.constexpr, BNR: tl.constexpr, KSR: tl.constexpr,
    KSG: tl.constexpr, BNS: tl.constexpr, PER1: tl.constexpr, PER3: tl.constexpr, PERQ: tl.constexpr,
    PER9: tl.constexpr, DOTF: tl.constexpr, BND: tl.constexpr, CT: tl.constexpr, HG: tl.constexpr, VB: tl.constexpr,
    BI: tl.constexpr, TB: tl.constexpr,
    # tensor parallel: R ranks (1: one rank, or a shard run alone), RP2 >= R a power of two,
    # ARB the column block of all-reduce point 1
    R: tl.constexpr, RP2: tl.constexpr, ARB: tl.constexpr, XQP: tl.constexpr,
    # fp32 -> e4m3 by sm_90's conversion unit (Plan.HWQ)
    HWQ: tl.constexpr,
    # mode (SIM: R simulated ranks in one launch, row r of ptab each)
    FIRST: tl.constexpr, LAST: tl.constexpr, FUSED: tl.constexpr, CLOCK: tl.constexpr,
    FAULT: tl.constexpr, SIM: tl.constexpr = False,
    # the MoE down slot loop's num_stages (0: one slot after another;
    # `mono_common.stages.moe._down_tile_pipelined`, whose docstring says what Triton makes of
    # it); FASTCVT: e4m3 weights and index keys
    # converted to bf16 on sm_90's integer and bf16 pipes (`mono_common.stages.numerics.e4m3_bf16`)
    DSTG: tl.constexpr = 0, FASTCVT: tl.constexpr = False,
    # down's slots a step (`mono_common.stages.moe.moe_down` STEP; Plan.DSTEP), and the
    # programs that run q_a/kv_a's spans (Plan.P1; 0: all, the index tiles dealt over all)
    DSTEP: tl.constexpr = 1, P1: tl.constexpr = 0,
    # o_proj's column tiles summed by their last span (Plan.FIX9, a measurement knob)
    FIX9: tl.constexpr = False,
    # the top-k's first radix pass in the index scores (Plan.TKF: sm_90's default), gate_up's
    # MMA form and column tile (Plan.GDOT, BNG: 0 the default BN: measurement knobs)
    TKF: tl.constexpr = False, GDOT: tl.constexpr = 0, BNG: tl.constexpr = 0,
    # gate_up as stream-K spans of PERG (column tile, K block) items (Plan.GSP, PERG: the knob
    # `gateup_spans`; `mono_common.stages.moe.moe_gateup` SPAN)
    GSP: tl.constexpr = False, PERG: tl.constexpr = 1,
    # a measurement probe (Plan.PADS, PADKB): |PADKB| KB of code run by every program after
    # hand-off PADS (`_code_pad`; 0: none)
    PADS: tl.constexpr = 0, PADKB: tl.constexpr = 0,
    # the radix passes as one runtime loop (Plan.TKL, a measurement knob: `_tkhist_loop`)
    TKL: tl.constexpr = False,
    # every hand-off a call of one copy of its code (Plan.SYC, a measurement knob: `_sync`)
    SYC: tl.constexpr = False,
    # every hand-off's wait polled by one thread's loop (Plan.HSP, a measurement knob: `_sync`)
    HSP: tl.constexpr = False,
    # the next layer's first weights requested after hand-off NXS (Plan.NXS; 0: not;
    # `_prefetch_next`), sm_90's fused launch only
    NXS: tl.constexpr = 0,
    # each addnorm row cut into ANC chunks over the programs (Plan.ANC, sm_90's default:
    # `_addnorm_spread`; 0: one program a row)
    ANC: tl.constexpr = 0,
    # the MoE's weights to f16 on the conversion unit, f16 MMAs, its quantised inputs (h2q,
    # inter) stored as f16 in their bf16-typed buffers (Plan.MF16: a TP8 rank's sm_90 default)
    MF16: tl.constexpr = False,
    # the index scores' e4m3 keys to f16 on the conversion unit, f16 MMAs (Plan.IF16: a TP8
    # rank's sm_90 default, as MF16)
    IF16: tl.constexpr = False,
    # down's slot loop with the slots' expert ids read once as a vector (Plan.DIDV, a
    # measurement knob; `mono_common.stages.moe.moe_down` IDV)
    DIDV: tl.constexpr = False,
    # down as (column tile, slot) items in equal spans, each tile summed by its last item's
    # program (Plan.DIT, a measurement knob; `mono_common.stages.moe.moe_down_items`)
    DIT: tl.constexpr = False,
    # the top-k write counting rows of at most TKW tokens itself (Plan.TKW, a measurement knob;
    # 0: the count stage counts every row; `mono_common.stages.topk` SHORT)
    TKW: tl.constexpr = 0,
    # the SiLU folded into gate_up, each slot's by its last tile, its stage empty and hand-off 19
    # folded (Plan.SFO, a measurement knob; `mono_common.stages.moe.moe_gateup` fold_ptr)
    SFO: tl.constexpr = False,
    # the index scores' page-table entries two tiles ahead and the next tile's keys requested
    # into the L2 (Plan.ISP, a measurement knob)
    ISP: tl.constexpr = False,
    # the top-k stages' tiles a contiguous run a program, a row's threshold derived once a run
    # (Plan.TKP: a TP8 rank's sm_90 default, the knob `radix_prefix_once`; mono_common.stages.topk
    # ONCE)
    TKP: tl.constexpr = False,
    # post-attention norm's rows each cut into PNC chunks over the programs (Plan.PNC, a
    # measurement knob; 0: one program a row)
    PNC: tl.constexpr = 0,
    # the post-attention norm's row walked in chunks by its program (Plan.PNL, a measurement knob)
    PNL: tl.constexpr = False,
    # the post-attention norm as two passes over column chunks with a hand-off (Plan.PNS, a
    # measurement knob; 0: not)
    PNS: tl.constexpr = 0,
    # the MLA combine's chunks as one load and block reductions (Plan.MCV, a measurement knob)
    MCV: tl.constexpr = False,
    # q_b and wq_b as one loop over each program's spans of both (Plan.QBP 1), or as one GEMV
    # (Plan.QBP 2): measurement knobs
    QBP: tl.constexpr = 0,
    # o_proj's input quantised on the conversion unit (Plan.OHQ: sm_90's default, `isa_options`)
    OHQ: tl.constexpr = False,
    # the programs that request the layer's weights into the L2 (Plan.PFN: 0 every program, N
    # the last N, -1 none, a TP8 rank's sm_90 default; the knob `prefetch_programs`)
    PFN: tl.constexpr = 0,
    # a step whose rows all have at most TKR tokens takes its whole top-k in stage 7, one
    # program a row, and only signals hand-offs 8-11 (Plan.TKR, a measurement knob; 0: never)
    TKR: tl.constexpr = 0,
    # a step whose rows all have at most TKS tokens takes its top-k in stages 7 and 8 on every
    # program, RKS keys a tile, and only signals hand-offs 9-11 (Plan.TKS, a measurement knob)
    TKS: tl.constexpr = 0,
    RKS: tl.constexpr = 16,
    # with TKS: the threshold and the write in stage 7 alone, each tile finding its row's
    # threshold itself, hand-offs 8-11 only signalled (Plan.TSS, a measurement knob)
    TSS: tl.constexpr = False,
    # a row top-k step's absorption and q_pe RoPE tiles in stage 7 beside the row top-k, by the
    # programs without a row, stage 4 the index tiles alone (Plan.TKA, a measurement knob with TKR)
    TKA: tl.constexpr = False,
    # where the weights' L2 prefetches are issued (Plan.PFS, bits PFS_*; the knob
    # `prefetch_sites`), when PFN >= 0
    PFS: tl.constexpr = 15,
    # the weights' L2 prefetches as bulk prefetches (Plan.PFB, a measurement knob)
    PFB: tl.constexpr = False,
    # the value projection combining the MLA chunks itself, the combine stage empty and
    # hand-off 14 folded (Plan.WCB, a measurement knob: `stage_wuv` NCH)
    WCB: tl.constexpr = False,
    # the MLA chunks' latent keys loaded once and held for both products (Plan.HOLD, a
    # measurement knob: mono_common.stages.mla HOLD)
    HOLD: tl.constexpr = False,
    # the post-attention norm in the router's programs, the norm stage the all-reduce alone and
    # hand-off 17 folded (Plan.NIR, a measurement knob: `stage_router_normed`)
    NIR: tl.constexpr = False,
    # the absorption tiles' q_nope summed once a tile for all its chunks, the chunks' weights
    # requested first, the q_pe RoPE items tiles of their own (Plan.ABG, a measurement knob:
    # `_absorb_gathered`)
    ABG: tl.constexpr = False,
):
    """Stages FIRST..LAST of one decoder layer. Fused: FIRST=0, LAST=NSTAGES-1, FUSED, stages linked by
    counters. Staged: FIRST=LAST=s, one launch a stage, no waits (the launch boundary orders)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    row = ptab
    if SIM:
        # R ranks side by side in ONE launch (kernels on two streams do not overlap on every
        # GPU): programs [r * P, (r + 1) * P) are rank r, reading its tensors from row r
        P_ = nprog // R
        row = ptab + (pid // P_) * P.NSLOTS
        pid = pid % P_
        nprog = P_
    if CLOCK == 0:
        # sm_90: the table through the read-only cache (`_ld_word`)
        row = row.to(tl.pointer_type(TABLE_RO))
    bf16: tl.constexpr = tl.bfloat16
    f32: tl.constexpr = tl.float32
    # the MoE's weight conversion, and its quantised inputs (h2q, inter): bf16 slots holding f16
    # bits under Plan.MF16
    MCVT: tl.constexpr = _CVT_F16 if MF16 else FASTCVT
    xmoe: tl.constexpr = tl.float16 if MF16 else tl.bfloat16
    i32: tl.constexpr = tl.int32
    i64: tl.constexpr = tl.int64
    u8: tl.constexpr = tl.uint8
    # The epoch: bumped by each program itself at the start of a step (the fused launch, or
    # the first staged launch), so counters only grow and a replayed graph needs no reset.
    epoch_ptr = _p(row, P.EPOCH, i32)
    if FIRST == 0:
        epoch = epoch_begin(epoch_ptr + pid)
        if FUSED:
            _stamp(row, 1, pid, CLOCK)
    else:
        epoch = tl.load(epoch_ptr + pid)
    NQKV: tl.constexpr = QL + KVL + RD
    NQB: tl.constexpr = NH * (NOPE + RD)
    NIQ: tl.constexpr = IH * ID
    ok = True
    # the hand-offs' form (`_sync` CALL): bit 0 Plan.SYC, bit 1 Plan.HSP
    SY: tl.constexpr = (1 if SYC else 0) + (2 if HSP else 0)
    # Weight streaming (sm_90: CLOCK 0): each stage's weights are requested into the L2 before
    # the hand-off that gates its inputs (mono_common.stages.prefetch; gfx950 and the
    # interpreter: no prefetch, the stages load as before). The fused launch only.
    # PF 2 (PFB): as bulk prefetches (mono-common `prefetch.prefetch_range` ON 2)
    PF: tl.constexpr = ((2 if PFB else 1) if CLOCK == 0 and PFN >= 0 else 0)
    GS: tl.constexpr = 8 if CLOCK == 0 else 0
    # the site after hand-off 7 (PFS_TOPK), in every top-k path
    PFT: tl.constexpr = FUSED and FIRST == 0 and (PFS & PFS_TOPK) != 0
    if FUSED and FIRST == 0 and (PFS & PFS_START) != 0:
        _prefetch_pf(pid, nprog, _p(row, P.WQKV, u8), NQKV * H, PF, PFN)
        if INDEXER:
            if IDX_FUSED:
                _prefetch_pf(pid, nprog, _p(row, P.WWP, bf16), (ID + IH) * H * 2, PF, PFN)
            else:
                _prefetch_pf(pid, nprog, _p(row, P.WK, u8), ID * H, PF, PFN)
                _prefetch_pf(pid, nprog, _p(row, P.WWP, bf16), IH * H * 2, PF, PFN)
    if FIRST <= 0 and LAST >= 0:
        stage_addnorm(pid, nprog, _p(row, P.X, bf16), _p(row, P.RES, bf16), _p(row, P.RESID1, bf16),
                      _p(row, P.HN, bf16), _p(row, P.W_IN, bf16), _sf(row, P.EPS), _p(row, P.HNQ, bf16),
                      _p(row, P.HNS, f32), W, H, HB, BLK, XQP, HWQ, ANC)
    if FIRST <= 1 and LAST >= 1:
        ok = _sync(row, 1, epoch, nprog, pid, FUSED and FIRST < 1, R, CLOCK, FAULT, PADKB if PADS == 1 else 0, SY)
        if ok:
            stage_qkva(pid, nprog, _p(row, P.HN, bf16), _p(row, P.WQKV, u8), _p(row, P.SQKV, f32),
                       _p(row, P.QKVA, f32), _p(row, P.WK, u8), _p(row, P.SK, f32), _p(row, P.WWP, bf16),
                       _p(row, P.IKW, f32), _p(row, P.HNQ, bf16), _p(row, P.HNS, f32), W, BM, H, NQKV, ID, IH,
                       INDEXER, IDX_FUSED, BN, BLK, KS1, KSI, BNS, PER1, DOTF, XQP, FASTCVT, P1)
    if FUSED and FIRST == 0 and (PFS & PFS_QB) != 0:
        _prefetch_pf(pid, nprog, _p(row, P.WQB, u8), NQB * QL, PF, PFN)
        if INDEXER:
            _prefetch_pf(pid, nprog, _p(row, P.WIQ, u8), NIQ * QL, PF, PFN)
    if FIRST <= 2 and LAST >= 2:
        if ok:
            ok = _sync(row, 2, epoch, nprog, pid, FUSED and FIRST < 2, R,
                       CLOCK, FAULT, PADKB if PADS == 2 else 0, SY)
        if FUSED and FIRST == 0 and (PFS & PFS_LATENT) != 0:
            # after q_a/kv_a's loads are all done: the latent stage reads only what they wrote
            if ok:
                _prefetch_pf(pid, nprog, _p(row, P.WQB, u8), NQB * QL, PF, PFN)
                if INDEXER:
                    _prefetch_pf(pid, nprog, _p(row, P.WIQ, u8), NIQ * QL, PF, PFN)
        if ok:
            stage_latent(pid, nprog, row, W, QL, KVL, RD, NQKV, ID, IH, PG,
                         KS1, KSI, INDEXER, IDX_FUSED, HADAMARD, MLA_NEOX, IDX_NEOX, GS, BLK, XQP, HWQ)
    if FIRST <= 3 and LAST >= 3:
        if ok:
            ok = _sync(row, 3, epoch, nprog, pid, FUSED and FIRST < 3, R,
                       CLOCK, FAULT, PADKB if PADS == 3 else 0, SY)
        if ok:
            stage_qb(pid, nprog, _p(row, P.QNQ if XQP else P.QN, bf16), _p(row, P.WQB, u8), _p(row, P.SQB, f32),
                     _p(row, P.QB, f32), _p(row, P.WIQ, u8), _p(row, P.SIQ, f32), _p(row, P.IQ, f32),
                     _p(row, P.QNS, f32), W, BM, QL, NQB, NIQ, INDEXER, BNS, BLK, PER3, PERQ, DOTF, XQP,
                     _p(row, P.TKH, i32) if TKF else None, TKF, _p(row, P.TKFINE, i32) if TKS > 0 else None,
                     _tk_spread_step(row, W, TKS, INDEXER), QBP)
    if FIRST <= 4 and LAST >= 4:
        if ok:
            ok = _sync(row, 4, epoch, nprog, pid, FUSED and FIRST < 4, R,
                       CLOCK, FAULT, PADKB if PADS == 4 else 0, SY)
        if ok:
            stage_absorb(pid, nprog, _p(row, P.QB, f32), _p(row, P.WKC, bf16), wkc_s0, wkc_s1, wkc_s2,
                         _p(row, P.QABS, f32), _p(row, P.IQ, f32), _p(row, P.IQ8, f32),
                         _p(row, P.IWRAW, f32), _p(row, P.IWT, f32), _p(row, P.POS, i64),
                         _p(row, P.CS, f32), _p(row, P.ROPE, f32), row,
                         W, BM, NH, NOPE, RD, KVL, IH, ID, KS3, KSQ, INDEXER, IDX_FUSED, HADAMARD,
                         MLA_NEOX, IDX_NEOX, GS, HWQ, ABG, _tka_part(row, W, TKR, TKA, INDEXER))
    if FUSED and FIRST == 0 and (PFS & PFS_OPROJ) != 0:
        # o_proj, the router and the shared expert: ~20 MB at the TP8 shard, requested ahead of
        # the index scores, the top-k and the attention (~40 us of little HBM traffic)
        _prefetch_attn_out(row, pid, nprog, H, NH, VD, E, I, PF, PFN)
    if FIRST <= 5 and LAST >= 5:
        if ok:
            ok = _sync(row, 5, epoch, nprog, pid, FUSED and FIRST < 5, R,
                       CLOCK, FAULT, PADKB if PADS == 5 else 0, SY)
        if ok:
            stage_iscore(pid, nprog, _p(row, P.IQ8, f32), _p(row, P.IWT, f32), _p(row, P.IDX_CACHE, u8),
                         _p(row, P.SEQLEN, i32), _p(row, P.REQ, i64), _p(row, P.RTT, i32), _si(row, P.STRIDE_RTT),
                         _p(row, P.SCORES, f32), _si(row, P.MAX_PAGES), _si(row, P.STRIDE_SC), _p(row, P.TKH, i32),
                         W, IH, IHP, ID, PG, TB, INDEXER, FASTCVT, TOPK, TKF, IF16, ISP, PF,
                         _p(row, P.TKFINE, i32) if TKS > 0 else None, _tk_spread_step(row, W, TKS, INDEXER))
    if FUSED and FIRST == 0 and (PFS & PFS_OPROJ_LATE) != 0:
        # the same ~20 MB after this program's index-score tiles instead: not queued while
        # absorb's last programs still load (session 28: absorb 8.4 -> 11.6 us at 1 row with
        # every site on), still ahead of the top-k stages' quiet stretch
        _prefetch_attn_out(row, pid, nprog, H, NH, VD, E, I, PF, PFN)
    # the exact top-k: four radix passes, the chunk counts, the write (TKC keys a tile)
    nck = (_si(row, P.MAX_PAGES) * TB + TKC - 1) // TKC
    if TKR > 0 and INDEXER:
        # every program reads the same lengths, so every program takes the same path
        if _tk_rows_short(_p(row, P.SEQLEN, i32), W, TKR):
            ok = _tk_short_entry(row, ok, epoch, nprog, pid, FIRST, LAST, FUSED, R, CLOCK, FAULT, SY)
            if ok:
                _prefetch_topk_site(row, pid, nprog, PFT, H, NH, VD, E, I, PF, PFN)
            ok = _tkrow_stages(row, ok, epoch, nprog, pid, FIRST, LAST, FUSED, R, CLOCK, FAULT, W, TOPK, TKR, SY)
            if TKA and FIRST <= 7 and LAST >= 7:
                # the programs below the rows' (all of them when there are no more programs
                # than rows: after their rows)
                anp = nprog - W if nprog > W else nprog
                if ok and pid < anp:
                    stage_absorb(pid, anp, _p(row, P.QB, f32), _p(row, P.WKC, bf16), wkc_s0, wkc_s1, wkc_s2,
                                 _p(row, P.QABS, f32), _p(row, P.IQ, f32), _p(row, P.IQ8, f32),
                                 _p(row, P.IWRAW, f32), _p(row, P.IWT, f32), _p(row, P.POS, i64),
                                 _p(row, P.CS, f32), _p(row, P.ROPE, f32), row,
                                 W, BM, NH, NOPE, RD, KVL, IH, ID, KS3, KSQ, INDEXER, IDX_FUSED,
                                 HADAMARD, MLA_NEOX, IDX_NEOX, GS, HWQ, ABG, 2)
            ok = _tkrow_signals(row, ok, pid, FIRST, LAST, FUSED, CLOCK)
        else:
            _prefetch_topk_site(row, pid, nprog, PFT, H, NH, VD, E, I, PF, PFN)
            ok = _topk_stages(row, ok, epoch, nprog, pid, nck, FIRST, LAST, FUSED, R, CLOCK, FAULT, W, TOPK, INDEXER,
                              TKF, TKL, TKW, TKP, PADS, PADKB, SY)
    elif TKS > 0 and INDEXER:
        if _tk_spread_step(row, W, TKS, INDEXER):
            ok = _tk_short_entry(row, ok, epoch, nprog, pid, FIRST, LAST, FUSED, R, CLOCK, FAULT, SY)
            if ok:
                _prefetch_topk_site(row, pid, nprog, PFT, H, NH, VD, E, I, PF, PFN)
            ok = _tkspread_stages(row, ok, epoch, nprog, pid, FIRST, LAST, FUSED, R, CLOCK, FAULT, W, TOPK, TKS, RKS,
                                  SY, TSS)
        else:
            _prefetch_topk_site(row, pid, nprog, PFT, H, NH, VD, E, I, PF, PFN)
            ok = _topk_stages(row, ok, epoch, nprog, pid, nck, FIRST, LAST, FUSED, R, CLOCK, FAULT, W, TOPK, INDEXER,
                              TKF, TKL, TKW, TKP, PADS, PADKB, SY)
    else:
        # a build without TKR or TKS compiles no short-step path: the condition above is a runtime value, and
        # Triton compiles both sides of a runtime branch
        _prefetch_topk_site(row, pid, nprog, PFT, H, NH, VD, E, I, PF, PFN)
        ok = _topk_stages(row, ok, epoch, nprog, pid, nck, FIRST, LAST, FUSED, R, CLOCK, FAULT, W, TOPK, INDEXER,
                          TKF, TKL, TKW, TKP, PADS, PADKB, SY)
    if FIRST <= 12 and LAST >= 12:
        if ok:
            ok = _sync(row, 12, epoch, nprog, pid, FUSED and FIRST < 12, R,
                       CLOCK, FAULT, PADKB if PADS == 12 else 0, SY)
        if NXS == 12 and FUSED and PF:
            if ok:
                _prefetch_next(row, pid, nprog, NQKV, H, ID, IH, INDEXER, IDX_FUSED, PFN)
        if ok:
            # an indexer layer attends over its own top-k, a non-indexer layer over the last
            # indexer layer's (prev_topk)
            if INDEXER:
                sel_ptr = _p(row, P.TOPK, i32)
            else:
                sel_ptr = _p(row, P.PREV_TOPK, i32)
            stage_mla(pid, nprog, _p(row, P.QABS, f32), _p(row, P.KV_CACHE, bf16), sel_ptr,
                      _p(row, P.REQ, i64), _p(row, P.RTT, i32), _si(row, P.STRIDE_RTT), _p(row, P.PART, f32),
                      _p(row, P.ML, f32), _sf(row, P.SM_SCALE), W, NH, KVL, RD, TOPK, CT, HG, HOLD)
    if FIRST <= 13 and LAST >= 13:
        if ok:
            ok = _sync(row, 13, epoch, nprog, pid, FUSED and FIRST < 13, R,
                       CLOCK, FAULT, PADKB if PADS == 13 else 0, SY)
        if ok and not WCB:
            stage_mlacomb(pid, nprog, _p(row, P.PART, f32), _p(row, P.ML, f32), _p(row, P.ATTN, bf16),
                          W, NH, KVL, TOPK, CT, MCV)
    if FIRST <= 14 and LAST >= 14:
        # WCB: the combine runs in this stage's tiles (stage 13 is empty)
        if ok:
            ok = _handoff(row, 14, WCB, epoch, nprog, pid, FUSED and FIRST < 14, R,
                          CLOCK, FAULT, PADKB if PADS == 14 else 0, SY)
        if ok:
            stage_wuv(pid, nprog, _p(row, P.ATTN, bf16), _p(row, P.WVC, bf16), wvc_s0, wvc_s1, wvc_s2,
                      _p(row, P.OV, bf16), W, BM, NH, KVL, VD, VB, _p(row, P.PART, f32) if WCB else None,
                      _p(row, P.ML, f32) if WCB else None, TOPK // CT if WCB else 0)
    if FIRST <= 15 and LAST >= 15:
        if ok:
            ok = _sync(row, 15, epoch, nprog, pid, FUSED and FIRST < 15, R,
                       CLOCK, FAULT, PADKB if PADS == 15 else 0, SY)
        if ok:
            stage_oproj(pid, nprog, _p(row, P.OV, bf16), _p(row, P.WO, u8), _p(row, P.SO, f32),
                        _p(row, P.OP, f32), W, BM, H, NH * VD, BNS, BLK, PER9, DOTF,
                        _p(row, P.CNT, i32) + FIXOP, epoch, KS9 if FIX9 else 0, OHQ)
    if FIRST <= 16 and LAST >= 16:
        if ok:
            ok = _sync(row, 16, epoch, nprog, pid, FUSED and FIRST < 16, R,
                       CLOCK, FAULT, PADKB if PADS == 16 else 0, SY)
        if ok:
            ok = stage_postnorm(pid, nprog, _p(row, P.OP, f32), _p(row, P.RESID1, bf16),
                                _p(row, P.RES_OUT, bf16), _p(row, P.H2, bf16), _p(row, P.W_POST, bf16), _sf(row, P.EPS),
                                _p(row, P.AP, bf16), _p(row, P.AR1, bf16), _p(row, P.CNT, i32), epoch,
                                _p(row, P.AR1_MBOX, i64), _p(row, P.AR1_FLAG, i64), _pu(row, P.ABORT, i32),
                                _p(row, P.ABORT_TAB, i64), _p(row, P.ERR, i64), _si(row, P.RANK), _sl(row, P.DEADLINE),
                                W, BM, H, HB, 1 if FIX9 else KS9, R, RP2, ARB, CLOCK, FAULT, PNC, not NIR, PNL, PNS, FUSED)
    if FIRST <= 17 and LAST >= 17:
        # NIR: the norm runs in this stage's programs (stage 16 is the all-reduce alone)
        if ok:
            ok = _handoff(row, 17, NIR, epoch, nprog, pid, FUSED and FIRST < 17, R,
                          CLOCK, FAULT, PADKB if PADS == 17 else 0, SY)
        if NIR:
            if ok:
                stage_router_normed(pid, nprog, _p(row, P.OP, f32), _p(row, P.AR1, bf16), _p(row, P.RESID1, bf16),
                                    _p(row, P.RES_OUT, bf16), _p(row, P.H2, bf16), _p(row, P.W_POST, bf16),
                                    _sf(row, P.EPS), _p(row, P.WG, bf16), _p(row, P.LG, f32), _p(row, P.H2Q, xmoe),
                                    _p(row, P.H2S, f32), W, BM, H, HB, E, BNR, BLK, KSR, 1 if FIX9 else KS9, R, HWQ)
        else:
            if ok:
                stage_router(pid, nprog, _p(row, P.H2, bf16), _p(row, P.WG, bf16), _p(row, P.LG, f32),
                             _p(row, P.H2Q, xmoe), _p(row, P.H2S, f32), W, BM, H, E, BNR, BLK, KSR, HWQ)
    if FIRST <= 18 and LAST >= 18:
        if ok:
            ok = _sync(row, 18, epoch, nprog, pid, FUSED and FIRST < 18, R,
                       CLOCK, FAULT, PADKB if PADS == 18 else 0, SY)
        if NXS == 18 and FUSED and PF:
            if ok:
                _prefetch_next(row, pid, nprog, NQKV, H, ID, IH, INDEXER, IDX_FUSED, PFN)
        if ok:
            stage_gateup(pid, nprog, _p(row, P.LG, f32), _p(row, P.BIAS, f32), _p(row, P.H2Q, xmoe), _p(row, P.H2S, f32),
                         _p(row, P.W13, u8), _p(row, P.S13, f32), _p(row, P.WSH13, u8),
                         _p(row, P.SSH13, f32), _p(row, P.GU, f32), _p(row, P.SLOT_E, i32),
                         _p(row, P.SLOT_W, f32), _p(row, P.NSLOT, i32), _p(row, P.W2, u8), _p(row, P.LOC, i64),
                         W, BM, H, E, TOPE, KSR, I, BNG if BNG > 0 else BN, BLK, KSG, NSLOT,
                         PF if FUSED and (PFS & PFS_DOWN) != 0 else 0, MCVT,
                         GDOT, _p(row, P.CNT, i32) + SLOTC if SFO else None, _p(row, P.INTER, xmoe),
                         _p(row, P.INTERS, f32), BI, HWQ, PFN, GSP, PERG)
    if FIRST <= 19 and LAST >= 19:
        # SFO: the SiLU ran in gate_up (each slot's last tile), this stage is empty
        if ok:
            ok = _handoff(row, 19, SFO, epoch, nprog, pid, FUSED and FIRST < 19, R,
                          CLOCK, FAULT, PADKB if PADS == 19 else 0, SY)
        if not SFO:
            if ok:
                stage_silu(pid, nprog, _p(row, P.GU, f32), _p(row, P.INTER, xmoe), _p(row, P.INTERS, f32),
                           _p(row, P.NSLOT, i32), W, I, KSG, BI, NSLOT, BLK, HWQ)
    if FIRST <= 20 and LAST >= 20:
        if ok:
            ok = _sync(row, 20, epoch, nprog, pid, FUSED and FIRST < 20, R,
                       CLOCK, FAULT, PADKB if PADS == 20 else 0, SY)
        if NXS == 20 and FUSED and PF:
            if ok:
                _prefetch_next(row, pid, nprog, NQKV, H, ID, IH, INDEXER, IDX_FUSED, PFN)
        if ok:
            ok = stage_down(pid, nprog, _p(row, P.INTER, xmoe), _p(row, P.INTERS, f32), _p(row, P.W2, u8), _p(row, P.S2, f32),
                            _p(row, P.WSH2, u8), _p(row, P.SSH2, f32), _p(row, P.SLOT_E, i32),
                            _p(row, P.SLOT_W, f32), _p(row, P.NSLOT, i32), _p(row, P.OUT, bf16),
                            _sf(row, P.ROUTED_SCALE), _p(row, P.DP, bf16), epoch, _p(row, P.AR2_MBOX, i64),
                            _p(row, P.AR2_FLAG, i64), _pu(row, P.ABORT, i32), _p(row, P.ABORT_TAB, i64),
                            _p(row, P.ERR, i64), _si(row, P.RANK), _sl(row, P.DEADLINE), W, BM, H, I, BND, BLK, NSLOT,
                            R, RP2, CLOCK, FAULT, DSTG, MCVT, DSTEP, DIDV, _p(row, P.MZ, bf16) if DIT else None,
                            _p(row, P.CNT, i32) + DITC if DIT else None, DIT)
            if FUSED and FIRST == 0:
                _stamp(row, STAMP_W - 2, pid, CLOCK)
