"""One DeepSeek-V4.1 decoder layer for one step, in plain torch, op for op as SGLang 0.5.23.

DeepSeek-V4.1-Flash (`DeepseekV41ForCausalLM`, served as `DeepseekV4ForCausalLM` by
models/deepseek_v4.py) carries its residual as mHC streams R [T, hc_mult, H]. With
`hc_pre_from_prev_sublayer` (V4.1's default) each sublayer, attention then MoE, runs four
steps, and the `pre` mix of a sublayer is used by the NEXT sublayer's combine (the lag):

    x  = norm(sum_k pre_prev[k] * R[k])         (pre_prev None: norm(R[:, 0]))   hc_combine
    y  = all_reduce(sublayer(x))                                                 attention / moe
    (pre, post, comb) = mix_stats(R)                                             hc_mix_stats
    R' = post[i] * y + sum_j comb[j][i] * R[j];  state = (R', pre)               hc_post

Every function names the SGLang 0.5.23 function it mirrors (paths relative to `sglang/`); each
name is in `SGLANG_READS`. This module imports no sglang.

The step: `StepInputs` carries T rows (batch x tokens_per_request; a verify step has several
consecutive positions per request), the page tables and the slots SGLang's metadata gives.
`LayerCaches` holds the layer's state in SGLang's byte layouts (`layouts.py`); the reference
writes them as SGLang's stores do and reads them as its kernels do, in place.

Attention kinds (`DsV41Shape.layer_kind`): 0 = sliding window (SWA) only; 4 = C4 compressor +
C4 indexer (top-k of the compressed positions); 128 = C128 compressor (every compressed block);
1 / 2 = the V4.1 low-ratio compressors and indexer (`forward_low_ratio_sources`): a kv_source
layer writes latents, an index_source layer publishes a top-k, the others read the nearest
preceding source's latents and the top-k last published in this step for their ratio.

Numerics follow the CUDA (sm_90) path: fp32 math inside every fused kernel with one rounding
where SGLang stores; FP8 block linears dequantize both operands (`quant.fp8_block_linear`);
the KV and compressed caches hold the V4 layout's values (`quant.kv_quant_v4`). Accumulation
order inside GEMMs and attention (DeepGEMM, FlashMLA, cuBLAS) is not mirrored.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import layouts as L
from .config import DsV41Shape
from .quant import (
    act_quant_groups,
    fake_quant_compressed_kv,
    fake_quant_fp4,
    fp8_block_linear,
    hadamard,
    index_k_quant_fp8,
    kv_quant_v4,
    mxfp4_dequant,
)

__all__ = [
    "SGLANG_READS",
    "HcState",
    "LayerCaches",
    "StepContext",
    "StepInputs",
    "all_reduce_sum",
    "apply_rope",
    "attention_partial",
    "biased_sqrtsoftplus_topk",
    "c4_indexer_topk",
    "compress_group",
    "decoder_layer",
    "freqs_cis",
    "gate_logits",
    "hash_topk",
    "index_logits_fp8",
    "hc_combine",
    "hc_expand",
    "hc_final",
    "hc_layer",
    "hc_mix_stats",
    "hc_post",
    "hc_split",
    "hc_sum",
    "low_ratio_compress",
    "moe_partial",
    "rms_norm",
    "routed_experts",
    "shared_expert",
    "sparse_attention",
    "swiglu_clamp",
    "v41_indexer_topk",
]

#: Every SGLang 0.5.23 name this module mirrors or reads.
SGLANG_READS: tuple[str, ...] = (
    "sglang.srt.configs.deepseek_v41.DeepseekV41Config",
    "sglang.srt.configs.deepseek_v4.DeepSeekV4Config",
    "sglang.srt.models.deepseek_v4.DeepseekV4ForCausalLM",
    "sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayerBase",
    "sglang.srt.models.deepseek_v4.DeepseekV4CudaDecoderLayer.forward",
    "sglang.srt.models.deepseek_v4.DeepseekV4Model._forward_layers_hc_pre_from_prev",
    "sglang.srt.models.deepseek_v4.MQALayer.forward",
    "sglang.srt.models.deepseek_v4.MQALayer._forward_prepare",
    "sglang.srt.models.deepseek_v4.MQALayer._compute_q_b",
    "sglang.srt.models.deepseek_v4.MQALayer._compute_kv_to_cache",
    "sglang.srt.models.deepseek_v4.MQALayer._project_wo_b",
    "sglang.srt.models.deepseek_v4._apply_wo_a_bf16_matmul",
    "sglang.srt.models.deepseek_v4.MqaAttentionBase._local_attn_sink",
    "sglang.srt.models.deepseek_v4.hc_head_torch",
    "sglang.srt.models.deepseek_v4_platform_stage.NonCudaDecoderMixin.forward_hc_pre_from_prev",
    "sglang.srt.models.deepseek_v4_mhc.mix_stats",
    "sglang.srt.models.deepseek_v4_mhc._mix_stats_impl",
    "sglang.srt.models.deepseek_v4_mhc.combine",
    "sglang.srt.models.deepseek_v4_mhc.post",
    "sglang.srt.models.deepseek_v4_mhc.run_attn_post",
    "sglang.srt.models.deepseek_v4_mhc.run_moe_post",
    "sglang.srt.models.deepseek_v4_mhc.HcState",
    "sglang.srt.models.deepseek_v4_mhc.MHC_POST_MULT_VALUE",
    "sglang.kernels.ops.layernorm.mhc._mhc_pre_torch",
    "sglang.kernels.ops.layernorm.mhc._mhc_post_torch",
    "sglang.kernels.ops.layernorm.mhc.hc_split_sinkhorn",
    "sglang.kernels.ops.layernorm.mhc.mhc_combine",
    "sglang.kernels.ops.layernorm.mhc.hc_broadcast",
    "sglang.kernels.ops.attention.dsv4.rope.precompute_freqs_cis",
    "sglang.kernels.ops.attention.dsv4.rope.apply_rotary_emb_triton",
    "sglang.kernels.ops.attention.dsv4.norm_rope.fused_rope_inplace",
    "sglang.kernels.ops.attention.dsv4.norm_rope.fused_k_norm_rope_flashmla",
    "sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_indexer_rope_hadamard_quant",
    "sglang.kernels.ops.attention.dsv4.compress.compress_forward",
    "sglang.kernels.ops.attention.dsv4.compress.compress_norm_rope_store",
    "sglang.srt.layers.attention.dsv4.compressor.Compressor",
    "sglang.srt.layers.attention.dsv4.compressor.Compressor._apply_ape_hotfix",
    "sglang.srt.layers.attention.dsv4.compressor_v2.CompressorBackendMixin.forward_unified",
    "sglang.srt.layers.attention.dsv4.compressor_v2.CompressorBackendMixin._forward_unified_hip",
    "sglang.srt.layers.attention.dsv4.indexer.C4Indexer",
    "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch",
    "sglang.srt.layers.attention.dsv4.indexer.topk_transform_pytorch_vectorized",
    "sglang.srt.layers.attention.dsv4.dsv41_sparse.DeepseekV41Compressor",
    "sglang.srt.layers.attention.dsv4.dsv41_sparse.DeepseekV41Indexer",
    "sglang.srt.layers.attention.dsv4.dsv41_sparse.RMSNorm",
    "sglang.srt.layers.attention.dsv4.dsv41_sparse.rope_tail",
    "sglang.srt.layers.attention.dsv4.v41_indexer.scoring.decode_scores",
    "sglang.srt.layers.attention.dsv4.v41_indexer.scoring.select_decode",
    "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend.forward_low_ratio_sources",
    "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend._low_ratio_compress_torch",
    "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend._low_ratio_pair_partners",
    "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend._low_ratio_write_group",
    "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend._forward_attention",
    "sglang.srt.layers.attention.deepseek_v4_backend.SWA_WINDOW",
    "sglang.srt.layers.attention.deepseek_v4_backend._low_ratio_compression_metadata",
    "sglang.srt.layers.attention.deepseek_v4_backend.DSV4AttnMetadata.sparse_page_indices",
    "sglang.srt.layers.layernorm.RMSNorm.forward_native",
    "sglang.srt.models.deepseek_v2.DeepseekV2MoE.forward_normal",
    "sglang.srt.models.deepseek_v2.DeepseekV2MLP.forward",
    "sglang.srt.models.deepseek_v2.MoEGate.forward",
    "sglang.srt.layers.moe.topk.biased_topk_impl",
    "sglang.srt.layers.moe.topk._RENORMALIZE_SUM_EPSILON",
    "sglang.kernels.ops.moe.moe_fused_gate.moe_fused_gate",
    "sglang.srt.layers.moe.hash_topk.HashTopK._forward_torch",
    "sglang.srt.multimodal.dsv41.vl_routing.vision_topk",
    "sglang.kernels.ops.activation.silu_and_mul_clamp.silu_and_mul_clamp",
    "sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe.Mxfp4FlashinferCutlassMoEMethod",
    "sglang.test.kits.attention_unittest.attention_methods.dsv4_attention._pure_torch_dsv4_combined_reference",
)

BF16 = torch.bfloat16
F32 = torch.float32
#: `deepseek_v4_mhc.MHC_POST_MULT_VALUE`: post = 2 * sigmoid(...).
MHC_POST_MULT = 2.0
#: `layers/moe/topk._RENORMALIZE_SUM_EPSILON`.
RENORMALIZE_EPS = 1e-20


# ---- step inputs and state ---------------------------------------------------------------------
@dataclass
class StepInputs:
    """The `ForwardBatch` fields a decode or target-verify layer reads, for T rows.

    input_ids: [T] int64 (hash routing and the image-token bias read them).
    positions: [T] int64; a request's rows are consecutive positions (verify: its drafts).
    req_rows: [T] int64 row of `req_to_token` each token belongs to.
    out_cache_loc: [T] int64 full-pool slot of each token (`forward_batch.out_cache_loc`).
    req_to_token: [reqs, max_ctx] int64 (`ReqToTokenPool.req_to_token`), logical -> full slot.
    full_to_swa: [full slots] int64 (`full_to_swa_index_mapping`), full slot -> SWA slot.
    page_size: tokens a page (256 in SGLang for this model; compressed slot = full slot // R).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    req_rows: torch.Tensor
    out_cache_loc: torch.Tensor
    req_to_token: torch.Tensor
    full_to_swa: torch.Tensor
    page_size: int

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    def full_slot(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.req_to_token[rows, positions].long()

    def swa_slot(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.full_to_swa[self.full_slot(rows, positions)]


@dataclass
class LayerCaches:
    """One layer's state in SGLang's layouts (`layouts.py`; all updated in place).

    swa: uint8 [pages, page_bytes], the layer's SWA pool, V4 layout, pages of `page_size`.
    ckv: uint8 V4 pages of page_size / ratio: this layer's compressed KV (ratios 4/128 and the
        ratio-1/2 kv_source layers; slot = full slot // ratio). None otherwise.
    index_k: uint8 index-K pages: C4 fp8 (page_size / 4 a page), or the fp4 pool of a ratio-1/2
        kv_source layer that owns index keys (index_page_size a page). None otherwise.
    state: fp32 compress-state rows (`CompressStatePool.kv_score_buffer`): C4 [rows, 4*hd]
        (| kv overlap | kv | score overlap | score |), C128 [rows, 2*hd], ratio 2 [rows, 2*hd]
        (kv | score). The last row is the empty row a -1 state loc reads.
    index_state: the C4 indexer's own compressor state [rows, 4*index_head_dim], C4 only.
    """

    swa: torch.Tensor
    ckv: torch.Tensor | None = None
    index_k: torch.Tensor | None = None
    state: torch.Tensor | None = None
    index_state: torch.Tensor | None = None


@dataclass
class StepContext:
    """What one step's layers hand each other besides the residual: the ratio-1/2 top-k last
    published (`DSV4AttnMetadata.c1/c2_sparse_page_indices`, shared by later layers)."""

    low_ratio_topk: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class HcState:
    """`deepseek_v4_mhc.HcState` without its transport fields: streams R [T, mult, H] bf16
    and the pre mix [T, mult] fp32 the next combine uses (None before the first sublayer)."""

    streams: torch.Tensor
    pre: torch.Tensor | None = None


# ---- norms, rope ---------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`RMSNorm.forward_native` arithmetic (fp32 statistics and weight multiply, one rounding
    to x's dtype), which the CUDA kernels and `dsv41_sparse.RMSNorm` also compute."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(out_dtype or x.dtype)


@functools.lru_cache(maxsize=16)
def freqs_cis(dim: int, seqlen: int, original_seq_len: int, base: float, factor: float,
              beta_fast: float, beta_slow: float) -> torch.Tensor:
    """`kernels/ops/attention/dsv4/rope.precompute_freqs_cis`: complex64 [seqlen, dim/2], with
    YaRN frequency ramps when original_seq_len > 0 (the compressing layers)."""

    def correction_dim(rot):
        return dim * math.log(original_seq_len / (rot * 2 * math.pi)) / (2 * math.log(base))

    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=F32) / dim))
    if original_seq_len > 0:
        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=F32) - low) / (high - low), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    angles = torch.outer(torch.arange(seqlen), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def layer_freqs(s: DsV41Shape, layer_id: int) -> torch.Tensor:
    """The layer's table (`MqaAttentionBase.__init__`: compress_rope_theta and YaRN on compressing
    layers, rope_theta without YaRN on SWA layers)."""
    original, factor = s.rope_yarn(layer_id)
    return freqs_cis(s.rope_dim, s.max_position, original, s.rope_base(layer_id), factor,
                     s.rope_beta_fast, s.rope_beta_slow)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor, rope_dim: int, inverse: bool = False,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Rotate the last `rope_dim` features of x [T, ..., D] by freqs [T, rope_dim/2] (complex),
    interleaved pairs (2i, 2i+1), fp32 arithmetic, one rounding: `fused_rope_inplace` (CUDA)
    and `dsv41_sparse.rope_tail`; inverse uses the conjugate (the output's inverse RoPE)."""
    head, tail = x[..., :-rope_dim], x[..., -rope_dim:].float()
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (rope_dim // 2,)
    fr, fi = freqs.real.float().view(shape), freqs.imag.float().view(shape)
    xr, xi = tail[..., 0::2], tail[..., 1::2]
    if inverse:
        yr, yi = xr * fr + xi * fi, xi * fr - xr * fi
    else:
        yr, yi = xr * fr - xi * fi, xr * fi + xi * fr
    rot = torch.stack([yr, yi], dim=-1).flatten(-2)
    dtype = out_dtype or x.dtype
    return torch.cat([head.to(dtype), rot.to(dtype)], dim=-1)


def _mm_f32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ w [N, K]^T with exact bf16 products and fp32 accumulation
    (`linear_bf16_fp32`, `tiny_gemm_bf16(out_dtype=fp32)`)."""
    return x.float() @ w.float().t()


# ---- mHC -------------------------------------------------------------------------------------------
def hc_expand(x: torch.Tensor, mult: int) -> torch.Tensor:
    """`mhc.hc_broadcast`: the embedding [T, H] as mult equal streams [T, mult, H]."""
    return x.unsqueeze(1).repeat(1, mult, 1)


def hc_mix_stats(streams: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                 s: DsV41Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`deepseek_v4_mhc._mix_stats_impl` (its non-CUDA branch) + `hc_split_sinkhorn`: the
    triplet (pre [T, m], post [T, m], comb [T, m, m], fp32) from the sublayer's input streams.

    mixes = (R_flat @ fn^T) * rsqrt(mean(R_flat^2) + rms_eps); pre = sigmoid(mixes * s0 + b) + eps;
    post = 2 sigmoid(mixes * s1 + b); comb = softmax_rows(mixes * s2 + b) + eps, then one column
    normalisation and (iters - 1) row/column Sinkhorn rounds (each dividing by sum + eps)."""
    x = streams.flatten(1).float()
    mixes = (x @ fn.float().t()) * torch.rsqrt(x.square().mean(-1, keepdim=True) + s.rms_eps)
    return hc_split(mixes, scale, base, s)


def hc_split(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
             s: DsV41Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`mhc.hc_split_sinkhorn` (TileLang; `_hc_split_sinkhorn_triton` is its port): mixes
    [T, (2+m)m] fp32 -> (pre, post, comb)."""
    m, eps = s.hc_mult, s.hc_eps
    pre = torch.sigmoid(mixes[:, :m] * scale[0] + base[:m]) + eps
    post = MHC_POST_MULT * torch.sigmoid(mixes[:, m : 2 * m] * scale[1] + base[m : 2 * m])
    comb = (mixes[:, 2 * m :] * scale[2] + base[2 * m :]).view(-1, m, m)
    comb = comb.softmax(-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(s.hc_sinkhorn_iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def hc_combine(streams: torch.Tensor, pre: torch.Tensor | None, norm_weight: torch.Tensor,
               eps: float) -> torch.Tensor:
    """`deepseek_v4_mhc.combine` / `_combine`: the sublayer's input norm(sum_k pre[k] R[k])
    (`mhc_combine`: fp32 multiply-adds in stream order, one rounding), or norm(R[:, 0]) before
    the first sublayer. Returns [T, H] bf16."""
    if pre is None:
        return rms_norm(streams[:, 0], norm_weight, eps)
    return rms_norm(hc_sum(streams, pre), norm_weight, eps)


def hc_sum(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """`mhc.mhc_combine`: y = sum_k pre[k] * R[k], fp32 multiply-adds in stream order, rounded
    once to the streams' dtype. [T, m, H] x [T, m] -> [T, H]."""
    acc = torch.zeros(streams.shape[0], streams.shape[2], dtype=F32, device=streams.device)
    for k in range(streams.shape[1]):
        acc = acc + pre[:, k : k + 1].float() * streams[:, k].float()
    return acc.to(streams.dtype)


def hc_post(y: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """`deepseek_v4_mhc.post` (its torch form, = `mhc._mhc_post_torch`):
    R'[i] = post[i] * y + sum_j comb[j][i] * R[j], fp32, rounded to y's dtype."""
    out = post.unsqueeze(-1) * y.unsqueeze(1) + (comb.unsqueeze(-1) * streams.unsqueeze(2)).sum(dim=1)
    return out.to(y.dtype)


def hc_final(state: HcState, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`DeepseekV4Model._forward_impl` after the last layer with pre_from_prev:
    norm(mhc_combine(R, last_pre)) -> [T, H] bf16."""
    return hc_combine(state.streams, state.pre, norm_weight, eps)


# ---- attention: projections ---------------------------------------------------------------------
def _q_and_kv(x: torch.Tensor, w: dict, s: DsV41Shape, freqs: torch.Tensor, pos: torch.Tensor):
    """`MQALayer._forward_prepare` (fused wqkv_a, sm_90): returns (q_lora normed bf16 [T, q_lora],
    q roped bf16 [T, H_l, D], kv normed+roped fp32 [T, D]).

    wqkv_a (FP8 32x32, rows = wq_a | wkv) -> q_norm -> wq_b (FP8, this rank's heads) -> RoPE on
    the last rope_dim of every head (V4.1: `q_head_norm` False, no per-head norm;
    `_compute_q_b` -> `fused_rope_inplace`). kv: `kv_norm` + RoPE in fp32 inside
    `set_swa_key_buffer_radix_fused_norm_rope` (`fused_k_norm_rope_flashmla`)."""
    qkv = fp8_block_linear(x, w["self_attn.wqkv_a.weight"], w["self_attn.wqkv_a.weight_scale_inv"], s.fp8_block)
    q_lora = rms_norm(qkv[:, : s.q_lora], w["self_attn.q_norm.weight"], s.rms_eps)
    q = fp8_block_linear(q_lora, w["self_attn.wq_b.weight"], w["self_attn.wq_b.weight_scale_inv"], s.fp8_block)
    q = apply_rope(q.view(-1, s.heads_per_rank, s.head_dim), freqs[pos], s.rope_dim)
    kv = rms_norm(qkv[:, s.q_lora :], w["self_attn.kv_norm.weight"], s.rms_eps, out_dtype=F32)
    kv = apply_rope(kv, freqs[pos], s.rope_dim, out_dtype=F32)
    return q_lora, q, kv


def _store_v4(buf: torch.Tensor, loc: torch.Tensor, rows: torch.Tensor, s: DsV41Shape, page: int) -> None:
    """Quantize rows (fp32 or bf16) into a V4 pool at slots `loc` (`kv_quant_v4` + `v4_write`)."""
    L.v4_write(buf, loc, *kv_quant_v4(rows.float(), s.nope_dim), page)


def _read_v4(buf: torch.Tensor, loc: torch.Tensor, s: DsV41Shape, page: int) -> torch.Tensor:
    return L.v4_read(buf, loc, page, s.nope_dim, s.rope_dim)


# ---- compressors ---------------------------------------------------------------------------------
def _state_loc(step: StepInputs, rows: torch.Tensor, pos: torch.Tensor, ratio: int, ring: int, page: int,
               state_rows: int) -> torch.Tensor:
    """The compress planner's state row (deepseek_v4/c_plan.cuh): C4 follows the token's SWA
    page (`translate_from_swa_loc_to_state_loc`), C128 a per-request ring
    (`translate_from_req_position_to_state_loc`)."""
    if ratio == 4:
        return L.swa_ring_loc(step.swa_slot(rows, pos), ring, page)
    return L.req_ring_loc(rows, pos, ring, state_rows)


def compress_group(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """The C4/C128 pooling of `compress_forward` (deepseek_v4/c4_v2.cuh, c128_v2.cuh) for one
    compressed block: kv, score [n, hd] fp32 (n = 8 for C4, 128 for C128), ape [n, hd] fp32;
    per channel softmax over the n rows of score + ape, weighted sum of kv -> [hd] fp32.
    Rows with score -inf (C4's missing previous block) drop out."""
    logits = score + ape
    wts = torch.softmax(logits, dim=0)
    return (wts * kv).sum(0)


def _compress_rows(step: StepInputs, kv_score: torch.Tensor, state: torch.Tensor, ape: torch.Tensor,
                   ratio: int, hd: int, ring: int, page: int) -> list[tuple[int, int, torch.Tensor]]:
    """Run one C4/C128 compressor over the step's tokens in order (`compress_forward`'s decode
    and prefill plans agree with this): each token's kv_score row goes to its state row; a token
    completing a block ((pos + 1) % ratio == 0) pools the block. Returns
    [(token index, block start position, pooled fp32 [hd])]. kv_score [T, 2*coff*hd] fp32."""
    overlap = ratio == 4
    out = []
    rows, pos = step.req_rows, step.positions
    nrows = state.shape[0]
    locs = _state_loc(step, rows, pos, ratio, ring, page, nrows)
    for t in range(step.num_tokens):
        state[locs[t]] = kv_score[t].float()
        p = int(pos[t])
        if (p + 1) % ratio:
            continue
        start = p + 1 - ratio
        cur = torch.arange(start, p + 1)
        cur_rows = state[_state_loc(step, rows[t].expand(ratio), cur, ratio, ring, page, nrows)]
        if overlap:
            # |kv ovl|kv|score ovl|score|: the previous block's overlap halves, this block's
            # main halves; ape rows 0..3 pair the overlap, 4..7 the main (after the hotfix).
            kv_cur, sc_cur = cur_rows[:, hd : 2 * hd], cur_rows[:, 3 * hd : 4 * hd]
            if start > 0:
                prev = torch.arange(start - ratio, start)
                prev_rows = state[_state_loc(step, rows[t].expand(ratio), prev, ratio, ring, page, nrows)]
                kv_prev, sc_prev = prev_rows[:, :hd], prev_rows[:, 2 * hd : 3 * hd]
            else:
                kv_prev = torch.zeros_like(kv_cur)
                sc_prev = torch.full_like(sc_cur, float("-inf"))
            kv_all, sc_all = torch.cat([kv_prev, kv_cur]), torch.cat([sc_prev, sc_cur])
        else:
            kv_all, sc_all = cur_rows[:, :hd], cur_rows[:, hd:]
        out.append((t, start, compress_group(kv_all, sc_all, ape.reshape(-1, hd))))
    return out


def _core_compressor(x: torch.Tensor, w: dict, prefix: str, s: DsV41Shape, step: StepInputs,
                     state: torch.Tensor, freqs: torch.Tensor, ratio: int, hd: int,
                     rotate: bool) -> list[tuple[int, int, torch.Tensor]]:
    """`Compressor` + `CompressorBackendMixin.forward_unified` (C4 / C128, and the C4 indexer's):
    kv_score = wkv_gate(x) (bf16 weight, fp32 out, `linear_bf16_fp32`); pool each completed
    block; then `compress_norm_rope_store`: RMSNorm (fp32 weight) + RoPE at the block's first
    position, and for the indexer (`rotate`) the 128-point Hadamard. Returns
    [(token, block start, normed+roped fp32 row [hd])]; the caller quantizes and stores."""
    kv_score = _mm_f32(x, w[prefix + "wkv_gate.weight"])
    ring = s.ring_size(ratio)
    pooled = _compress_rows(step, kv_score, state, w[prefix + "ape"], ratio, hd, ring, s.page_size)
    out = []
    for t, start, row in pooled:
        y = rms_norm(row[None], w[prefix + "norm.weight"], s.rms_eps, out_dtype=F32)
        y = apply_rope(y, freqs[start : start + 1], s.rope_dim, out_dtype=F32)
        if rotate:
            y = hadamard(y)
        out.append((t, start, y[0]))
    return out


def low_ratio_compress(x: torch.Tensor, w: dict, s: DsV41Shape, step: StepInputs, caches: LayerCaches,
                       freqs: torch.Tensor, ratio: int) -> None:
    """A ratio-1/2 kv_source layer's compressor (`DeepseekV41Compressor` through
    `_low_ratio_compress_torch`, the sm_90 path: separate wkv and wgate GEMMs, fp32 out).

    Ratio 1: every token is a group. Ratio 2: a token pools with the previous position
    (`_low_ratio_pair_partners`: from this step or the request-scoped ring, softmax over the two
    scores per channel); only a token completing a pair (odd position) is stored, at slot
    full // 2 with RoPE at the pair's first position. The latent `finish` = RMSNorm(bf16(kv));
    index keys (if the layer owns them) = fake_fp4(rope(k_norm(wk(latent)))) (`index_keys`);
    the cache row = V4 quant of fake_fp4_kv(rope(latent)) (`_low_ratio_write_group`)."""
    pre = "self_attn.compressor."
    kv = _mm_f32(x, w[pre + "wkv.weight"])
    if ratio == 2:
        score = _mm_f32(x, w[pre + "wgate.weight"])
        ring = s.ring_size(2)
        hd = s.head_dim
    if ratio == 1:
        done = torch.arange(step.num_tokens)
        pooled, starts = kv, step.positions
    else:
        nrows = caches.state.shape[0]
        pooled_rows, done_rows = [], []
        for t in range(step.num_tokens):
            p, r = int(step.positions[t]), step.req_rows[t]
            partner = caches.state[L.req_ring_loc(r, torch.tensor(p - 1), ring, nrows)]
            caches.state[L.req_ring_loc(r, torch.tensor(p), ring, nrows)] = torch.cat([kv[t], score[t]])
            if p % 2 == 0:
                continue
            two_kv = torch.stack([partner[:hd], kv[t]])
            two_sc = torch.stack([partner[hd:], score[t]])
            pooled_rows.append((two_kv * two_sc.softmax(dim=0)).sum(0))
            done_rows.append(t)
        if not done_rows:
            return
        done = torch.tensor(done_rows)
        pooled, starts = torch.stack(pooled_rows), step.positions[done] - 1
    latent = rms_norm(pooled.to(BF16), w[pre + "norm.weight"], s.rms_eps)  # `finish`: bf16 [n, hd]
    fr = freqs[starts]
    slots = step.full_slot(step.req_rows[done], step.positions[done]) // ratio
    if "self_attn.indexer.wk.weight" in w:
        k = latent.float() @ w["self_attn.indexer.wk.weight"].float().t()
        k = rms_norm(k.to(BF16), w["self_attn.indexer.k_norm.weight"], s.rms_eps)
        L.index_fp4_write(caches.index_k, slots, fake_quant_fp4(apply_rope(k, fr, s.rope_dim)), s.index_page_size)
    rows = fake_quant_compressed_kv(apply_rope(latent, fr, s.rope_dim))
    _store_v4(caches.ckv, slots, rows, s, s.page_size // ratio)


# ---- indexers -----------------------------------------------------------------------------------
def _topk_positions(scores: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """`topk_transform_pytorch_vectorized` for one row: every position when n <= k (in order),
    else the k largest scores (order within the selection does not matter to attention)."""
    if n <= k:
        return torch.arange(n)
    return torch.topk(scores[:n], k).indices.sort().values


def c4_indexer_topk(x: torch.Tensor, q_lora: torch.Tensor, w: dict, s: DsV41Shape, step: StepInputs,
                    caches: LayerCaches, freqs: torch.Tensor) -> list[torch.Tensor]:
    """`C4Indexer.forward` -> `forward_c4_indexer` (fp8 indexer, the default): its compressor
    (head 128, Hadamard) writes index keys (`index_k_quant_fp8`); the query
    `fused_q_indexer_rope_hadamard_quant`: wq_b (FP8) -> RoPE tail -> Hadamard -> e4m3 with a
    per-(token, head) scale folded into the head weight (weights_proj(x) * D^-0.5 * H^-0.5 *
    q_scale); logits (`fp8_paged_mqa_logits_torch`) = k_scale * sum_h w_h relu(q_h . k).
    Returns per token the selected compressed positions (request-local, ascending)."""
    d = s.index_head_dim
    pre = "self_attn.indexer."
    keys = _core_compressor(x, w, pre + "compressor.", s, step, caches.index_state, freqs, 4, d, rotate=True)
    ipage = s.page_size // 4
    if keys:
        ts = torch.tensor([k[0] for k in keys])
        slots = step.full_slot(step.req_rows[ts], torch.tensor([k[1] for k in keys])) // 4
        L.index_fp8_write(caches.index_k, slots, *index_k_quant_fp8(torch.stack([k[2] for k in keys])), ipage)
    q = fp8_block_linear(q_lora, w[pre + "wq_b.weight"], w[pre + "wq_b.weight_scale_inv"], s.fp8_block)
    q = apply_rope(q.view(-1, s.index_heads, d), freqs[step.positions], s.rope_dim, out_dtype=F32)
    q = hadamard(q)
    q_scale = q.abs().amax(-1).clamp_min(1e-4) / 448.0
    q8 = (q / q_scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    head_w = (x.float() @ w[pre + "weights_proj.weight"].float().t()).to(BF16).float()
    head_w = head_w * (d**-0.5 * s.index_heads**-0.5) * q_scale
    lens, slots = _visible(step, 4)
    k8, ks = L.index_fp8_read(caches.index_k, torch.cat(slots), ipage, d)
    picks, off = [], 0
    for t, n in enumerate(lens):
        logits = index_logits_fp8(q8[t], head_w[t], k8[off : off + n], ks[off : off + n])
        picks.append(_topk_positions(logits, n, s.index_topk))
        off += n
    return picks


def index_logits_fp8(q8: torch.Tensor, head_w: torch.Tensor, k8: torch.Tensor, k_scale: torch.Tensor) -> torch.Tensor:
    """The C4 indexer's logits of one row (`fp8_paged_mqa_logits_torch`; DeepGEMM's
    `fp8_paged_mqa_logits` on the GPU): k_scale[j] * sum_h w[h] relu(q8[h] . k8[j]), fp32.
    q8 [H, D] and k8 [n, D] e4m3 values as fp32, head_w [H] (q scale folded in), k_scale [n]."""
    return (torch.relu(k8 @ q8.t()) * head_w).sum(-1) * k_scale


def v41_indexer_topk(x: torch.Tensor, q_lora: torch.Tensor, w: dict, s: DsV41Shape, step: StepInputs,
                     index_k: torch.Tensor, freqs: torch.Tensor, ratio: int) -> list[torch.Tensor]:
    """`DeepseekV41Indexer` through `FullTopKIndexer._torch_decode` (`decode_scores` +
    `select_decode`; sm_90 takes the torch indexer): queries = fake_fp4(rope(wq_b(q_lora)))
    (`queries`), head weights = weights_proj(x) * D^-0.5 * H^-0.5 (`head_weights`, bf16),
    scores = sum_h w_h relu(q_h . k) over the visible compressed positions j < (pos + 1) // R
    of the kv_source layer's fp4 keys, top index_topk. Candidate blocks are not mirrored."""
    d = s.index_head_dim
    pre = "self_attn.indexer."
    q = fp8_block_linear(q_lora, w[pre + "wq_b.weight"], w[pre + "wq_b.weight_scale_inv"], s.fp8_block)
    q = fake_quant_fp4(apply_rope(q.view(-1, s.index_heads, d), freqs[step.positions], s.rope_dim)).float()
    head_w = (x.float() @ w[pre + "weights_proj.weight"].float().t()).to(BF16)
    head_w = (head_w * (d**-0.5 * s.index_heads**-0.5)).float()
    lens, slots = _visible(step, ratio)
    keys = L.index_fp4_read(index_k, torch.cat(slots), s.index_page_size, d)
    picks, off = [], 0
    for t, n in enumerate(lens):
        scores = (torch.relu(keys[off : off + n] @ q[t].t()) * head_w[t]).sum(-1)
        picks.append(_topk_positions(scores, n, s.index_topk))
        off += n
    return picks


def _visible(step: StepInputs, ratio: int) -> tuple[list[int], list[torch.Tensor]]:
    """Per row: how many compressed positions it may see, (pos + 1) // ratio, and their slots."""
    lens = [(int(p) + 1) // ratio for p in step.positions]
    return lens, [_compressed_slots(step, r, n, ratio) for r, n in zip(step.req_rows, lens)]


def _compressed_slots(step: StepInputs, row: torch.Tensor, n: int, ratio: int) -> torch.Tensor:
    """Slots of a request's first n compressed positions: req_to_token[row, j * R] // R
    (`prefill_k_slots`, `decode_scores`)."""
    j = torch.arange(n)
    return step.req_to_token[row, j * ratio].long() // ratio


# ---- sparse attention ------------------------------------------------------------------------------
def sparse_attention(q: torch.Tensor, keys: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    """One query row of FlashMLA's sparse decode with the sink (`_forward_attention`; as the
    pure-torch `_pure_torch_dsv4_combined_reference`): q [H_l, D], keys [n, D] (k = v),
    sink [H_l] fp32 -> softmax over [scale * q.k, sink] without the sink's column, times keys.
    Returns fp32 [H_l, D]."""
    scores = (q.float() @ keys.float().t()) * scale
    probs = torch.softmax(torch.cat([scores, sink.float()[:, None]], dim=-1), dim=-1)[:, :-1]
    return probs @ keys.float()


def attention_partial(x: torch.Tensor, w: dict, s: DsV41Shape, step: StepInputs, caches: LayerCaches,
                      shared: dict[int, LayerCaches], ctx: StepContext, layer_id: int) -> torch.Tensor:
    """`MQALayer.forward` on this rank: returns wo_b's partial sum [T, H] bf16 (all-reduce #1 is
    the caller's: `_project_wo_b` defers it to the mHC post).

    1. q / kv projections and norms, RoPE; the kv row stored into the SWA pool (V4 layout).
    2. the layer's compressors and indexers (by ratio), writing their caches in place.
    3. per row: keys = SWA window [max(0, p - window + 1), p] + the compressed rows it may see
       (C128 all j < (p+1)//128; C4 / ratio 1/2 the indexer's top-k); sparse attention with the
       rank's attn_sink slice (`_local_attn_sink`), scale head_dim^-0.5.
    4. inverse RoPE on the output's tail, grouped wo_a (bf16 einsum per group), wo_b (FP8)."""
    kind = s.layer_kind(layer_id)
    freqs = layer_freqs(s, layer_id)
    pos, rows = step.positions, step.req_rows
    q_lora, q, kv = _q_and_kv(x, w, s, freqs, pos)
    _store_v4(caches.swa, step.full_to_swa[step.out_cache_loc], kv, s, s.page_size)

    picks: list[torch.Tensor] | None = None
    extra: torch.Tensor | None = None
    r = kind.ratio
    if r in (4, 128):
        rows_out = _core_compressor(x, w, "self_attn.compressor.", s, step, caches.state, freqs, r, s.head_dim,
                                    rotate=False)
        for t, start, row in rows_out:
            _store_v4(caches.ckv, step.full_slot(rows[t][None], torch.tensor([start])) // r, row[None], s,
                      s.page_size // r)
        if r == 4:
            picks = c4_indexer_topk(x, q_lora, w, s, step, caches, freqs)
        extra = caches.ckv
    elif r in (1, 2):
        source = shared[kind.kv_source_layer]
        if kind.kv_source:
            low_ratio_compress(x, w, s, step, caches, freqs, r)
        if kind.index_source:
            ctx.low_ratio_topk[r] = v41_indexer_topk(x, q_lora, w, s, step, source.index_k, freqs, r)
        if r not in ctx.low_ratio_topk:
            raise ValueError(f"layer {layer_id} (ratio {r}) reads a top-k no earlier layer of this step published")
        picks = ctx.low_ratio_topk[r]
        extra = source.ckv

    sink = w["self_attn.attn_sink"][s.tp_rank * s.heads_per_rank : (s.tp_rank + 1) * s.heads_per_rank]
    # every row's SWA window and compressed picks, read from the pools in one pass each
    win_slots, ext_slots = [], []
    for t in range(step.num_tokens):
        p = int(pos[t])
        win = torch.arange(max(0, p - s.window + 1), p + 1)
        win_slots.append(step.swa_slot(rows[t].expand(win.numel()), win))
        if r:
            sel = torch.arange((p + 1) // r) if r == 128 else picks[t]
            ext_slots.append(_compressed_slots(step, rows[t], (p + 1) // r, r)[sel])
    swa_keys = _read_v4(caches.swa, torch.cat(win_slots), s, s.page_size).split([len(x) for x in win_slots])
    ext_keys = None
    if r:
        ext_keys = _read_v4(extra, torch.cat(ext_slots), s, s.page_size // r).split([len(x) for x in ext_slots])
    out = torch.empty(step.num_tokens, s.heads_per_rank, s.head_dim, dtype=F32)
    for t in range(step.num_tokens):
        keys = swa_keys[t] if ext_keys is None else torch.cat([swa_keys[t], ext_keys[t]])
        out[t] = sparse_attention(q[t], keys, sink, s.softmax_scale)
    o = apply_rope(out.to(BF16), freqs[pos], s.rope_dim, inverse=True)
    o = o.view(step.num_tokens, s.groups_per_rank, s.group_in_dim)
    wo_a = w["self_attn.wo_a.weight"].view(s.groups_per_rank, s.o_lora, s.group_in_dim)
    o = torch.einsum("tgd,grd->tgr", o.float(), wo_a.float()).to(BF16)
    return fp8_block_linear(o.flatten(1), w["self_attn.wo_b.weight"], w["self_attn.wo_b.weight_scale_inv"],
                            s.fp8_block)


# ---- MoE ---------------------------------------------------------------------------------------------
def gate_logits(x: torch.Tensor, gate_w: torch.Tensor) -> torch.Tensor:
    """`MoEGate.forward` on CUDA (`tiny_gemm_bf16` / `linear_bf16_fp32`): bf16 x bf16 -> fp32."""
    return _mm_f32(x, gate_w)


def _sqrtsoftplus(logits: torch.Tensor) -> torch.Tensor:
    """sqrt(softplus(x)), softplus = x above 20 else log1p(exp(x)): `moe_fused_gate`'s
    SQRTSOFTPLUS_LOG1P arm (V4.1) and the torch forms (`biased_topk_impl`,
    `HashTopK._forward_torch`: F.softplus, same threshold), written as the latter."""
    return F.softplus(logits.float()).sqrt()


def biased_sqrtsoftplus_topk(logits: torch.Tensor, bias: torch.Tensor, top_k: int, routed_scaling: float,
                             input_ids: torch.Tensor | None = None, bias_vl: torch.Tensor | None = None,
                             image_token_id: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ungrouped sqrtsoftplus + bias routing (`moe_fused_gate`, V4.1 flags; `biased_topk_impl` is
    its torch form): rank by score + bias (the image-token rows by score + bias_vl, `vision_topk`),
    lowest expert id first on ties, weights = unbiased scores renormalised (sum + 1e-20) times
    routed_scaling. Returns (weights fp32 [T, k], ids int32 [T, k]) in descending rank order."""
    scores = _sqrtsoftplus(logits)
    row_bias = bias.float().expand_as(scores)
    if bias_vl is not None and input_ids is not None:
        is_img = (input_ids == image_token_id)[:, None]
        row_bias = torch.where(is_img, bias_vl.float().expand_as(scores), row_bias)
    biased = scores + row_bias
    # stable sort on -biased puts the lowest id first among equal scores, as the kernel does
    order = torch.sort(-biased, dim=-1, stable=True).indices[:, :top_k]
    wts = scores.gather(1, order)
    wts = wts / (wts.sum(-1, keepdim=True) + RENORMALIZE_EPS)
    return wts * routed_scaling, order.to(torch.int32)


def hash_topk(logits: torch.Tensor, input_ids: torch.Tensor, tid2eid: torch.Tensor,
              routed_scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`HashTopK._forward_torch` (no fused shared slot) then the routed scale: ids =
    tid2eid[input_ids], weights = sqrtsoftplus(logits) at those ids, renormalised."""
    ids = tid2eid[input_ids.long()].long()
    wts = _sqrtsoftplus(logits).gather(1, ids)
    wts = wts / (wts.sum(-1, keepdim=True) + RENORMALIZE_EPS)
    return wts * routed_scaling, ids.to(torch.int32)


def swiglu_clamp(gate_up: torch.Tensor, limit: float | None) -> torch.Tensor:
    """`silu_and_mul_clamp` (deepseek_v4/silu_and_mul_masked_post_quant.cuh): gate clamped to
    <= limit BEFORE the SiLU, up to [-limit, limit]; fp32 math. gate_up [..., 2I] = gate | up.
    Returns fp32 [..., I] (the callers round)."""
    g, u = gate_up.float().chunk(2, dim=-1)
    if limit is not None:
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
    return F.silu(g) * u


def shared_expert(x: torch.Tensor, w: dict, s: DsV41Shape) -> torch.Tensor:
    """`DeepseekV2MLP.forward` of the TP-sharded shared expert (FP8 32x32 gate_up_proj and
    down_proj, the clamped SwiGLU): this rank's partial [T, H] bf16."""
    p = "mlp.shared_experts."
    gu = fp8_block_linear(x, w[p + "gate_up_proj.weight"], w[p + "gate_up_proj.weight_scale_inv"], s.fp8_block)
    act = swiglu_clamp(gu, s.swiglu_limit).to(BF16)
    return fp8_block_linear(act, w[p + "down_proj.weight"], w[p + "down_proj.weight_scale_inv"], s.fp8_block)


def routed_experts(x: torch.Tensor, wts: torch.Tensor, ids: torch.Tensor, w: dict, s: DsV41Shape,
                   act_mxfp8: bool = False) -> torch.Tensor:
    """The MXFP4 routed experts on this rank's slice of every expert's intermediate dim
    (`Mxfp4FlashinferCutlassMoEMethod` on sm_90: W4A16, bf16 activations; with `act_mxfp8`
    the ROCm AITER path, which quantizes activations to MXFP8 first). w13 [E, 2*I_l, H/2]
    packed, rows gate | up (`weights.py` gives each runner's order), w2 [E, H, I_l/2].
    Returns fp32 [T, H]: sum_k weight_k * down_k(swiglu_clamp(gate_up_k(x)))."""
    out = torch.zeros(x.shape[0], s.hidden, dtype=F32)
    w13, s13 = w["mlp.experts.w13_weight"], w["mlp.experts.w13_weight_scale_inv"]
    w2, s2 = w["mlp.experts.w2_weight"], w["mlp.experts.w2_weight_scale_inv"]
    xin = x
    if act_mxfp8:
        q, sc = act_quant_groups(x, 32, ue8m0=True)
        xin = (q.float().unflatten(-1, (-1, 32)) * sc[..., None]).flatten(-2).to(BF16)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        gu = (xin[tok].float() @ mxfp4_dequant(w13[e], s13[e]).t()).to(BF16)
        act = swiglu_clamp(gu, s.swiglu_limit).to(BF16)
        if act_mxfp8:
            q, sc = act_quant_groups(act, 32, ue8m0=True)
            act = (q.float().unflatten(-1, (-1, 32)) * sc[..., None]).flatten(-2).to(BF16)
        down = act.float() @ mxfp4_dequant(w2[e], s2[e]).t()
        out.index_add_(0, tok, down.to(BF16).float() * wts[tok, slot].float()[:, None])
    return out


def moe_partial(x: torch.Tensor, w: dict, s: DsV41Shape, input_ids: torch.Tensor, layer_id: int,
                act_mxfp8: bool = False) -> torch.Tensor:
    """`DeepseekV2MoE.forward_normal` (is_deepseek_v4) on this rank: gate logits, hash routing
    (`HashTopK`, first num_hash_layers layers) or biased sqrtsoftplus top-k, routed experts
    (scaled by routed_scaling through the top-k weights) + the shared expert. Returns the
    rank's partial [T, H] bf16; all-reduce #2 is the caller's."""
    logits = gate_logits(x, w["mlp.gate.weight"])
    if s.layer_kind(layer_id).hash_routed:
        wts, ids = hash_topk(logits, input_ids, w["mlp.topk.tid2eid"], s.routed_scaling)
    else:
        wts, ids = biased_sqrtsoftplus_topk(
            logits, w["mlp.gate.e_score_correction_bias"], s.top_k, s.routed_scaling,
            input_ids=input_ids, bias_vl=w.get("mlp.gate.e_score_correction_bias_vl"),
            image_token_id=s.image_token_id)
    routed = routed_experts(x, wts, ids, w, s, act_mxfp8=act_mxfp8)
    return (routed + shared_expert(x, w, s).float()).to(BF16)


def all_reduce_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The TP all-reduce: fp32 sum in rank order, rounded once (a single rank returns its own)."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc.to(parts[0].dtype)


# ---- the layer ----------------------------------------------------------------------------------------
def decoder_layer(
    shapes: Sequence[DsV41Shape],
    weights: Sequence[dict],
    state: HcState,
    step: StepInputs,
    caches: dict[int, LayerCaches],
    ctx: StepContext,
    layer_id: int,
    all_reduce: Callable[[Sequence[torch.Tensor]], torch.Tensor] = all_reduce_sum,
    act_mxfp8: bool = False,
) -> HcState:
    """One layer of `NonCudaDecoderMixin.forward_hc_pre_from_prev` (the CUDA layer,
    `DeepseekV4CudaDecoderLayer.forward` through deepseek_v4_boundary, computes the same) for
    the TP ranks in `shapes`/`weights` (one entry per simulated rank, all of one TP size; a
    single entry with all_reduce=lambda p: p[0] gives one rank's view).

    The replicated work (mHC, norms, the kv path, compressors, indexers, caches) runs once with
    rank 0's weights; the head-, group- and intermediate-sharded work runs per rank and meets
    at the two all-reduce points. `caches` maps layer id -> LayerCaches (this layer's and the
    ratio-1/2 kv_source layers it reads)."""

    def attn(x):
        parts = []
        for i, (s, w) in enumerate(zip(shapes, weights)):
            # every rank writes identical replicated caches; later ranks recompute them on a copy
            own, own_ctx = (caches, ctx) if i == 0 else (_scratch(caches), StepContext(dict(ctx.low_ratio_topk)))
            parts.append(attention_partial(x, w, s, step, own[layer_id], own, own_ctx, layer_id))
        return all_reduce(parts)

    def moe(x):
        return all_reduce([moe_partial(x, w, s, step.input_ids, layer_id, act_mxfp8) for s, w in zip(shapes, weights)])

    return hc_layer(state, shapes[0], weights[0], attn, moe)


def hc_layer(state: HcState, s: DsV41Shape, w: dict, attn: Callable[[torch.Tensor], torch.Tensor],
             moe: Callable[[torch.Tensor], torch.Tensor]) -> HcState:
    """The layer's two hyper-connections with the lag (`forward_hc_pre_from_prev`'s run_attn_hc
    then run_ffn_hc): each sublayer reads norm(combine(R, previous pre)) and its own mix
    stats, computed from its input streams, give the post and the pre the next one uses.
    `attn` / `moe` take the normed input [T, H] and return the all-reduced output [T, H]."""
    streams = state.streams
    y = attn(hc_combine(streams, state.pre, w["input_layernorm.weight"], s.rms_eps))
    pre_a, post_a, comb_a = hc_mix_stats(streams, w["hc_attn_fn"], w["hc_attn_scale"], w["hc_attn_base"], s)
    streams = hc_post(y, streams, post_a, comb_a)
    y = moe(hc_combine(streams, pre_a, w["post_attention_layernorm.weight"], s.rms_eps))
    pre_f, post_f, comb_f = hc_mix_stats(streams, w["hc_ffn_fn"], w["hc_ffn_scale"], w["hc_ffn_base"], s)
    return HcState(hc_post(y, streams, post_f, comb_f), pre_f)


def _scratch(caches: dict[int, LayerCaches]) -> dict[int, LayerCaches]:
    """A deep copy of the caches for a simulated rank after the first: each rank's pools are its
    own in SGLang; here rank 0's are the ones kept."""

    def cp(v):
        return None if v is None else v.clone()

    return {k: LayerCaches(*(cp(getattr(c, f)) for f in ("swa", "ckv", "index_k", "state", "index_state")))
            for k, c in caches.items()}
