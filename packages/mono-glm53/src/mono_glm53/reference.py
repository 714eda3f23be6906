"""One GLM-5.3 MoE decoder layer for a decode step, in plain torch, op for op as SGLang 0.5.23.

GLM-5.3 (`GlmMoeDsaForCausalLM`, models/glm4_moe.py) is served by `DeepseekV2ForCausalLM`
(models/deepseek_v2.py): MLA attention in its absorbed form, made sparse by the DSA indexer,
and a `DeepseekV2MoE` with 1 shared + top-8 of 256 routed FP8 block-128 SwiGLU experts.
Every function names the SGLang function it mirrors (paths are relative to `sglang/` in the
0.5.23 wheel) and every such name is in `SGLANG_READS`. This module imports no sglang.

The decode step, for T rows on one TP rank (`GlmLayerShape` gives the dims; `weights` is the
dict built by `mono_glm53.weights`, keys named like SGLang's parameters):

 1. `input_norm`: residual add + `input_layernorm` (the layer boundary's add+RMSNorm).
 2. `qkv_a_proj`: `fused_qkv_a_proj_with_mqa` (FP8) -> q latent | k_nope | k_pe.
 3. `latent_norms`: `q_a_layernorm(q)`, `kv_a_layernorm(k_nope)`.
 4. `indexer` (on an indexer layer; else the previous layer's top-k is reused):
    index q/k/weights projections, k LayerNorm, RoPE, Hadamard (unfused path only), FP8
    quantisation, index-K cache write at `out_cache_loc`, scores over the whole context,
    exact top-`index_topk` -> logical positions (-1 padded).
 5. `q_b_proj` (FP8) -> q_nope | q_pe; `absorb_q` (bmm with W_UK = `w_kc`).
 6. `mla_rope` on q_pe and k_pe; `mla_cache_write` at `out_cache_loc`.
 7. `topk_to_slots` (logical -> physical through `req_to_token`) and `sparse_mla`.
 8. `attn_output`: bmm with W_UV (`w_vc`) and `o_proj` (FP8) -> this rank's partial sum.
 9. all-reduce point #1 (`all_reduce` callable; identity gives the rank's partial).
10. `post_attention_norm`: residual add + `post_attention_layernorm`.
11. `moe`: fp32 router logits, `biased_topk` (sigmoid + correction bias, top-8, renormalise,
    x2.5), shared expert + routed experts (FP8 block-128 SwiGLU) -> this rank's partial.
12. all-reduce point #2. The layer returns (mlp output, residual): SGLang's layers return the
    un-added MLP output and the next layer's `input_layernorm` adds it.

Numerics. Where SGLang's H200 kernels compute in fp32 and round once to bf16, so does this
module (RoPE, SiLU-and-mul, norms); the `native` variants of RoPE / SiLU reproduce SGLang's
`forward_native` bf16 arithmetic bit for bit and are what the CPU tests compare. On the CPU
every GEMM dequantises to fp32 (`fp8.fp8_block_linear` "exact"); on CUDA the same functions
run with bf16 x bf16 -> fp32 matmuls and, where torch supports it, the block-scaled FP8 GEMM.
Accumulation order inside GEMMs/attention (DeepGEMM, FlashMLA, cuBLAS) is not mirrored.

Things that are exactly SGLang's choice and easy to get wrong (see also config.py):
* MLA rope interleaved, indexer rope neox unless `indexer_rope_interleave` (then fused path).
* Hadamard rotation of index q and k only on the unfused CUDA path (neox indexer rope); the
  fused path omits it. Both rotate q and k alike, so scores differ only by FP8 rounding.
* Index q quantisation: unfused -> `act_quant` (ue8m0 power-of-two scale); fused -> plain
  fp32 scale. Index K on CUDA is always a plain fp32 scale (`fp8.index_k_quant`).
* Index head weights: unfused -> fp32 (`torch.mm(..., out_dtype=float32)`) x 32**-0.5, then
  x q_scale x 128**-0.5; fused -> the bf16 output of the merged `wk_weights_proj` GEMM.
* Index score: logit[t, j] = k_scale[j] * sum_h w[t, h] * relu(q_fp8[t, h] . k_fp8[j])
  (DeepGEMM `fp8_paged_mqa_logits`), over j < seq_len, new token included.
* Top-k ties: SGLang's top-k kernel and `torch.topk` may order or break exact ties
  differently; the selected set is the same unless the 2048th and 2049th scores tie.
* MLA softmax scale `layer.scaling` = (192 + 64) ** -0.5 (no YaRN mscale by default).
* The shared expert is either fused into FusedMoE as expert E (weight 1/2.5 before the x2.5)
  or run as `DeepseekV2MLP`; the sum is the same, here it runs separately.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from mono_common.ref.fp8 import act_quant, fp8_block_linear, index_k_quant
from mono_common.ref.moe import expert_mlp, silu_and_mul
from mono_common.ref.moe import routed_experts as _routed_experts
from mono_common.ref.norm import layer_norm, rms_norm
from mono_common.ref.rope import apply_rope, hadamard_rotate, rope_cos_sin
from mono_common.ref.routing import biased_topk as _biased_topk

from .config import GlmLayerShape

__all__ = [
    "SGLANG_READS",
    "DecodeInputs",
    "LayerCaches",
    "LayerOutput",
    "rms_norm",
    "layer_norm",
    "silu_and_mul",
    "input_norm",
    "qkv_a_proj",
    "latent_norms",
    "indexer_qk",
    "index_k_cache_write",
    "index_k_cache_read",
    "index_logits",
    "indexer_topk",
    "indexer",
    "q_b_proj",
    "absorb_q",
    "mla_rope",
    "mla_cache_write",
    "topk_to_slots",
    "sparse_mla",
    "attn_output",
    "attention",
    "post_attention_norm",
    "gate_logits",
    "biased_topk",
    "shared_expert",
    "routed_experts",
    "moe",
    "decoder_layer",
    "decoder_layer_tp",
    "all_reduce_sum",
]

#: Every SGLang 0.5.23 name this module (and its tests) mirrors or reads.
SGLANG_READS: tuple[str, ...] = (
    "sglang.srt.models.glm4_moe.GlmMoeDsaForCausalLM",
    "sglang.srt.models.deepseek_v2.DeepseekV2DecoderLayer.forward",
    "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA.prepare_qkv_latent",
    "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA.q_b_proj_forward",
    "sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla.DeepseekMLAForwardMixin.forward_absorb_prepare",
    "sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla.DeepseekMLAForwardMixin.forward_absorb_core",
    "sglang.srt.models.deepseek_common.deepseek_weight_loader.DeepseekV2WeightLoaderMixin.post_load_weights",
    "sglang.srt.models.deepseek_v2.DeepseekV2MoE.forward_normal",
    "sglang.srt.models.deepseek_v2.DeepseekV2MLP.forward",
    "sglang.srt.models.deepseek_v2.MoEGate.forward",
    "sglang.srt.layers.layernorm.RMSNorm.forward_native",
    "sglang.srt.layers.layernorm.LayerNorm.forward_native",
    "sglang.srt.layers.activation.SiluAndMul.forward_native",
    "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.forward_native",
    "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding._compute_cos_sin_cache",
    "sglang.srt.layers.rotary_embedding.base._is_cpu",
    "sglang.srt.layers.rotary_embedding.utils.apply_rotary_emb",
    "sglang.srt.layers.moe.topk.biased_topk_impl",
    "sglang.srt.layers.moe.topk.biased_grouped_topk_impl",
    "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe.fused_experts_impl",
    "sglang.srt.layers.quantization.fp8_utils.block_quant_dequant",
    "sglang.srt.layers.quantization.fp8_utils.deepgemm_w8a8_block_fp8_linear_with_fallback",
    "sglang.srt.layers.quantization.fp8_utils.triton_w8a8_block_fp8_linear",
    "sglang.kernels.ops.quantization.fp8_kernel.sglang_per_token_group_quant_fp8",
    "sglang.kernels.ops.quantization.fp8_kernel._per_token_group_quant_8bit",
    "sglang.kernels.ops.quantization.fp8_kernel._per_token_group_quant_8bit_raw",
    "sglang.kernels.ops.quantization.act_quant_triton.act_quant",
    "sglang.kernels.ops.kvcache.dsa_fused_store_index_cache.fused_store_index_k_cache",
    "sglang.kernels.ops.attention.dsa.indexer_k.fused_k_indexer_norm_rope_store",
    "sglang.kernels.ops.attention.dsa.indexer_q.fused_q_indexer_rope_first_quant",
    "sglang.kernels.ops.attention.dsa.transform_index.transform_index_page_table_decode",
    "sglang.srt.layers.attention.dsa.dsa_indexer.rotate_activation",
    "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer.forward_cuda",
    "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._get_q_k_bf16",
    "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._fused_q_prepare_and_store",
    "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._store_index_k_cache",
    "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._get_topk_paged",
    "sglang.srt.layers.attention.dsa.dsa_topk_backend._topk_unfused",
    "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend.forward_decode",
    "sglang.srt.mem_cache.memory_pool.MLATokenToKVPool.set_mla_kv_buffer",
    "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool",
    "sglang.srt.mem_cache.memory_pool.ReqToTokenPool",
    "sglang.srt.mem_cache.index_key_cache.IndexKeyCache",
)

BF16 = torch.bfloat16
_BMM_OUT_DTYPE_OK: bool | None = None


def _bmm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 x bf16 -> fp32 batched matmul: exact products, fp32 accumulation.

    On CUDA this is `torch.bmm(..., out_dtype=float32)` (the cuBLAS bf16->fp32 GEMM SGLang uses
    for router logits and index weights); elsewhere an fp32 bmm of the upcast operands."""
    global _BMM_OUT_DTYPE_OK
    if a.is_cuda and a.dtype == BF16 and b.dtype == BF16:
        if _BMM_OUT_DTYPE_OK is not False:
            try:
                out = torch.bmm(a, b, out_dtype=torch.float32)
                _BMM_OUT_DTYPE_OK = True
                return out
            except (TypeError, RuntimeError):
                _BMM_OUT_DTYPE_OK = False
    return torch.bmm(a.float(), b.float())


def _mm_f32(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b_t [N, K]^T with fp32 accumulation and output."""
    return _bmm_f32(a[None], b_t.t()[None])[0]


def _bf16_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """An unquantised bf16 linear (`ReplicatedLinear` with bf16 params): fp32 accumulate, bf16 out."""
    return _mm_f32(x, w).to(BF16)


# ---- state passed between the stages ---------------------------------------------------------
@dataclass
class DecodeInputs:
    """Per-step inputs, the fields of SGLang's `ForwardBatch` a decode layer reads.

    positions: [T] int64, the new token's position (= seq_lens - 1).
    seq_lens: [T] int32, context length including the new token.
    req_pool_indices: [T] int64 rows of `req_to_token`.
    out_cache_loc: [T] int64 physical slot of the new token (MLA and index-K caches alike).
    req_to_token: [reqs, max_ctx] int32 (`ReqToTokenPool.req_to_token`), logical -> slot.
    max_seq_len: host int >= max(seq_lens), a multiple of `page` (graph-static score width).
    """

    positions: torch.Tensor
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    req_to_token: torch.Tensor
    max_seq_len: int


@dataclass
class LayerCaches:
    """This layer's caches, in SGLang's `DSATokenToKVPool` layouts.

    kv: [slots, 1, kv_lora + rope] bf16 (`MLATokenToKVPool.kv_buffer[layer]`): per token the
        kv_a-normed latent (512) then the roped k_pe (64). Slot 0..page-1 is the padding page.
    index_k: [pages, page * (index_head_dim + 4)] uint8 (`IndexKeyCache.buffer[layer]`): per
        page all `page` fp8 keys (128 B each), then all `page` fp32 scales (4 B each).
        None on a layer without an indexer (SGLang gives those a 0-row buffer).
    """

    kv: torch.Tensor
    index_k: torch.Tensor | None


@dataclass
class LayerOutput:
    hidden: torch.Tensor  # [T, H] bf16, the MoE output after all-reduce #2 (not yet added)
    residual: torch.Tensor  # [T, H] bf16, the residual after the post-attention add
    topk: torch.Tensor  # [T, index_topk] int32 logical positions (-1 pad), for the next layer
    aux: dict[str, torch.Tensor] = field(default_factory=dict)


# ---- attention: projections -----------------------------------------------------------------
def input_norm(
    hidden: torch.Tensor, residual: torch.Tensor | None, w: dict[str, torch.Tensor], s: GlmLayerShape
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add + `input_layernorm` (`DeepseekV2DecoderLayer.forward` -> attn_boundary.prepare).
    The first layer passes residual=None (residual := hidden). Returns (normed x, residual)."""
    if residual is None:
        return rms_norm(hidden, w["input_layernorm.weight"], s.rms_eps), hidden
    return rms_norm(hidden, w["input_layernorm.weight"], s.rms_eps, residual)


def qkv_a_proj(x: torch.Tensor, w: dict[str, torch.Tensor], s: GlmLayerShape) -> torch.Tensor:
    """`DeepseekV2AttentionMLA.prepare_qkv_latent`: the FP8 `fused_qkv_a_proj_with_mqa`
    (rows = q_a_proj | kv_a_proj_with_mqa, concatenated by the weight loader), replicated on
    every rank. Returns [T, q_lora + kv_lora + rope] bf16."""
    return fp8_block_linear(
        x,
        w["self_attn.fused_qkv_a_proj_with_mqa.weight"],
        w["self_attn.fused_qkv_a_proj_with_mqa.weight_scale_inv"],
        s.block,
    )


def latent_norms(
    latent: torch.Tensor, w: dict[str, torch.Tensor], s: GlmLayerShape
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`forward_absorb_prepare`: split the latent, `q_a_layernorm(q)`, `kv_a_layernorm(k_nope)`.
    Returns (q_lora normed [T, q_lora], k_nope normed [T, kv_lora], k_pe raw [T, rope])."""
    q, k_nope, k_pe = latent.split([s.q_lora, s.kv_lora, s.qk_rope], dim=-1)
    q = rms_norm(q.contiguous(), w["self_attn.q_a_layernorm.weight"], s.rms_eps)
    k_nope = rms_norm(k_nope.contiguous(), w["self_attn.kv_a_layernorm.weight"], s.rms_eps)
    return q, k_nope, k_pe.contiguous()


def q_b_proj(q_lora: torch.Tensor, w: dict[str, torch.Tensor], s: GlmLayerShape) -> torch.Tensor:
    """`DeepseekV2AttentionMLA.q_b_proj_forward`: FP8 column-parallel q_b_proj for this rank's
    heads. Returns [T, heads_per_rank, nope + rope] bf16."""
    q = fp8_block_linear(q_lora, w["self_attn.q_b_proj.weight"], w["self_attn.q_b_proj.weight_scale_inv"], s.block)
    return q.view(-1, s.heads_per_rank, s.qk_head)


def absorb_q(q_nope: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """W_UK absorption: `torch.bmm(q_nope.transpose(0, 1), w_kc)` in `forward_absorb_prepare`
    (bf16 `w_kc` [H_l, nope, kv_lora]; GLM ships kv_b_proj in bf16). Returns [T, H_l, kv_lora]."""
    return _bmm_f32(q_nope.transpose(0, 1), w["self_attn.w_kc"]).to(BF16).transpose(0, 1)


def mla_rope(
    q_pe: torch.Tensor, k_pe: torch.Tensor, positions: torch.Tensor, s: GlmLayerShape
) -> tuple[torch.Tensor, torch.Tensor]:
    """`self.rotary_emb(positions, q_pe, k_pe)` of the MLA (interleaved unless
    `rope_interleave=False`), CUDA arithmetic. q_pe [T, H_l, rope], k_pe [T, rope]."""
    cos, sin = rope_cos_sin(positions, s.qk_rope, s.rope_theta)
    return (
        apply_rope(q_pe, cos, sin, s.rope_interleave),
        apply_rope(k_pe, cos, sin, s.rope_interleave),
    )


def mla_cache_write(kv: torch.Tensor, loc: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor) -> None:
    """`MLATokenToKVPool.set_mla_kv_buffer`: kv[loc, 0] = cat(k_nope, k_pe) (bf16, in place)."""
    kv[loc, 0] = torch.cat((k_nope, k_pe), dim=-1).to(kv.dtype)


# ---- the DSA indexer --------------------------------------------------------------------------
def indexer_qk(
    x: torch.Tensor,
    q_lora: torch.Tensor,
    positions: torch.Tensor,
    w: dict[str, torch.Tensor],
    s: GlmLayerShape,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index q (FP8), head weights and the index key before its FP8 store.

    Mirrors `Indexer.forward_cuda` up to the logits: on the unfused path (neox indexer rope)
    `Indexer._get_q_k_bf16` + `act_quant` + `_get_logits_head_gate`; on the fused path
    (interleaved) `Indexer._fused_q_prepare_and_store` (`fused_q_indexer_rope_first_quant`
    for q, `fused_k_indexer_norm_rope_store` for k). x: the input-normed hidden [T, H];
    q_lora: the q_a-normed latent [T, q_lora].
    Returns (q_fp8 [T, ih, D] e4m3; weights [T, ih] fp32 with the q scale, ih**-0.5 and
    D**-0.5 folded in; key [T, D] bf16, normed, roped (and rotated on the unfused path), as
    handed to the FP8 store: the fused kernel rounds its fp32 key through bf16 first too).
    """
    ih, d, r = s.index_heads, s.index_head_dim, s.qk_rope
    cos, sin = rope_cos_sin(positions, r, s.rope_theta)
    inter = s.indexer_rope_interleave
    query = fp8_block_linear(
        q_lora, w["self_attn.indexer.wq_b.weight"], w["self_attn.indexer.wq_b.weight_scale_inv"], s.block
    ).view(-1, ih, d)
    kn_w, kn_b = w["self_attn.indexer.k_norm.weight"], w["self_attn.indexer.k_norm.bias"]
    if s.indexer_fused:
        kw = _bf16_linear(x, w["self_attn.indexer.wk_weights_proj.weight"])
        key_raw, weights_raw = kw.split([d, ih], dim=-1)
        # fused_k_indexer_norm_rope_store: fp32 LayerNorm + rope, rounded through bf16.
        kf = F.layer_norm(key_raw.float(), (d,), kn_w, kn_b, s.index_k_norm_eps)
        kf = torch.cat((apply_rope(kf[:, :r], cos, sin, True), kf[:, r:]), dim=-1)
        key = kf.to(BF16)
        # fused_q_indexer_rope_first_quant: fp32 rope on the leading dims, no bf16 rounding
        # before the (plain fp32 scale) quantisation.
        qf = query.float()
        qf = torch.cat((apply_rope(qf[..., :r], cos, sin, True), qf[..., r:]), dim=-1)
        q_fp8, q_scale = index_k_quant(qf)
        # The kernel takes the gate as a float32 scalar: round it once on the host.
        gate = torch.tensor(s.index_softmax_scale * ih**-0.5, dtype=torch.float32).item()
        weights = weights_raw.float() * gate * q_scale
        return q_fp8, weights, key
    key = fp8_block_linear(x, w["self_attn.indexer.wk.weight"], w["self_attn.indexer.wk.weight_scale_inv"], s.block)
    key = layer_norm(key, kn_w, kn_b, s.index_k_norm_eps)
    q_rope = apply_rope(query[..., :r], cos, sin, inter)
    k_rope = apply_rope(key[:, :r], cos, sin, inter)
    query = torch.cat((q_rope, query[..., r:]), dim=-1)
    key = torch.cat((k_rope, key[:, r:]), dim=-1)
    if s.indexer_hadamard:
        query = hadamard_rotate(query)
        key = hadamard_rotate(key)
    # act_quant with block 128 = one group per index head, scale_fmt "ue8m0".
    q_fp8, q_scale = act_quant(query.contiguous(), d, "ue8m0")
    weights = _mm_f32(x, w["self_attn.indexer.weights_proj.weight"]) * ih**-0.5
    weights = (weights.unsqueeze(-1) * q_scale * s.index_softmax_scale).squeeze(-1)
    return q_fp8, weights, key


def index_k_cache_write(cache: torch.Tensor, loc: torch.Tensor, key: torch.Tensor, s: GlmLayerShape) -> None:
    """`Indexer._store_index_k_cache` on CUDA (`fused_store_index_k_cache`; the fused path's
    `fused_k_indexer_norm_rope_store` writes the same bytes): quantise each key with one plain
    fp32 scale and write key bytes at page*P*(D+4) + off*D and the scale at
    page*P*(D+4) + P*D + off*4 (P = page size, D = index_head_dim). In place."""
    d, p = s.index_head_dim, s.page
    q, sc = index_k_quant(key)
    page, off = loc // p, loc % p
    rows = cache.view(-1, p * (d + 4))
    kbytes = rows[:, : p * d].view(-1, p, d)
    sbytes = rows[:, p * d :].view(-1, p, 4)
    kbytes[page, off] = q.view(torch.uint8)
    sbytes[page, off] = sc.view(-1, 1).view(torch.uint8).view(-1, 4)


def _page_table(inputs: DecodeInputs, page: int) -> torch.Tensor:
    """`real_page_table` ("page_table_64"): req_to_token[req, ::page] // page, to max_seq_len."""
    cols = inputs.req_to_token[inputs.req_pool_indices, : inputs.max_seq_len : page]
    return (cols // page).long()


def index_k_cache_read(
    cache: torch.Tensor, inputs: DecodeInputs, s: GlmLayerShape
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather every row's context from the paged index-K cache through the page table.
    Returns (k e4m3 [T, max_seq_len, D], k_scale fp32 [T, max_seq_len])."""
    d, p = s.index_head_dim, s.page
    pages = _page_table(inputs, p)  # [T, P]
    t, np_ = pages.shape
    rows = cache.view(-1, p * (d + 4)).index_select(0, pages.reshape(-1)).view(t, np_, p * (d + 4))
    k = rows[..., : p * d].contiguous().view(torch.float8_e4m3fn).view(t, np_ * p, d)
    sc = rows[..., p * d :].contiguous().view(torch.float32).view(t, np_ * p)
    return k, sc


def index_logits(q_fp8: torch.Tensor, weights: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor) -> torch.Tensor:
    """DeepGEMM `fp8_paged_mqa_logits` (called from `Indexer._get_topk_paged`):
    logits[t, j] = k_scale[t, j] * sum_h weights[t, h] * relu(q_fp8[t, h] . k_fp8[t, j]).
    The fp8 -> bf16 casts are exact. Returns [T, L] fp32 (entries past seq_len are garbage)."""
    qk = _bmm_f32(q_fp8.to(BF16), k.to(BF16).transpose(1, 2))  # [T, ih, L]
    return (qk.relu() * weights.unsqueeze(-1)).sum(dim=1) * k_scale


def indexer_topk(logits: torch.Tensor, seq_lens: torch.Tensor, topk: int) -> torch.Tensor:
    """Mirrors `sglang.srt.layers.attention.dsa.dsa_topk_backend._topk_unfused` (the torch top-k
    backend; the default sgl-kernel/fused kernels select the same set): mask j >= seq_len to
    -inf, take the top-`topk`, mark -inf picks as -1. Returns [T, topk] int32 logical positions
    (order unspecified; exact ties may resolve differently from SGLang's kernels)."""
    t, l = logits.shape
    out = torch.full((t, topk), -1, dtype=torch.int32, device=logits.device)
    cols = torch.arange(l, device=logits.device)[None, :]
    masked = logits.masked_fill(cols >= seq_lens[:, None].to(cols.dtype), float("-inf"))
    k = min(topk, l)
    vals, idx = torch.topk(masked, k, dim=-1)
    out[:, :k] = idx.to(torch.int32).masked_fill(vals == float("-inf"), -1)
    return out


def indexer(
    x: torch.Tensor,
    q_lora: torch.Tensor,
    inputs: DecodeInputs,
    caches: LayerCaches,
    w: dict[str, torch.Tensor],
    s: GlmLayerShape,
) -> torch.Tensor:
    """`Indexer.forward_cuda` for a decode step: q/k/weights, index-K write at out_cache_loc
    (before scoring, so the new token scores itself), scores, exact top-k.
    Returns [T, index_topk] int32 logical positions, -1 padded."""
    q_fp8, weights, key = indexer_qk(x, q_lora, inputs.positions, w, s)
    index_k_cache_write(caches.index_k, inputs.out_cache_loc, key, s)
    k, k_scale = index_k_cache_read(caches.index_k, inputs, s)
    logits = index_logits(q_fp8, weights, k, k_scale)
    return indexer_topk(logits, inputs.seq_lens, s.index_topk)


# ---- sparse MLA -------------------------------------------------------------------------------
def topk_to_slots(topk: torch.Tensor, inputs: DecodeInputs) -> torch.Tensor:
    """`transform_index_page_table_decode` (or the fused top-k transform): logical positions to
    physical slots through `req_to_token`; -1 stays -1. Returns [T, topk] int32."""
    rows = inputs.req_to_token[inputs.req_pool_indices]  # [T, max_ctx]
    slots = torch.gather(rows, 1, topk.clamp_min(0).long())
    return torch.where(topk >= 0, slots, torch.full_like(slots, -1)).to(torch.int32)


def sparse_mla(
    q_nope_out: torch.Tensor,
    q_pe: torch.Tensor,
    kv: torch.Tensor,
    slots: torch.Tensor,
    s: GlmLayerShape,
) -> torch.Tensor:
    """`DeepseekSparseAttnBackend.forward_decode` (flashmla_sparse and the other sparse impls):
    softmax(q_all . kv[slot] * layer.scaling) @ kv[slot, :kv_lora] over the selected slots,
    q_all = cat(q_nope_out, q_pe) [T, H_l, 576], one kv head. fp32 scores and softmax, bf16 out.
    Returns [T, H_l, kv_lora] bf16."""
    t = q_nope_out.shape[0]
    q_all = torch.cat((q_nope_out, q_pe), dim=-1)  # [T, H_l, 576]
    valid = slots >= 0
    kvs = kv.view(-1, s.kv_cache_dim).index_select(0, slots.clamp_min(0).reshape(-1).long())
    kvs = kvs.view(t, -1, s.kv_cache_dim)  # [T, K, 576]
    scores = _bmm_f32(q_all, kvs.transpose(1, 2)) * s.softmax_scale  # [T, H_l, K]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    if q_all.is_cuda:
        out = _bmm_f32(p.to(BF16), kvs[..., : s.kv_lora].contiguous())
    else:
        out = torch.bmm(p, kvs[..., : s.kv_lora].float())
    return out.to(BF16)


def attn_output(attn: torch.Tensor, w: dict[str, torch.Tensor], s: GlmLayerShape) -> torch.Tensor:
    """`forward_absorb_core` after attention: bmm with W_UV (`w_vc` [H_l, kv_lora, v]) then the
    FP8 row-parallel `o_proj` without reduction. Returns this rank's partial [T, H] bf16."""
    t = attn.shape[0]
    o = _bmm_f32(attn.transpose(0, 1), w["self_attn.w_vc"]).to(BF16)  # [H_l, T, v]
    o = o.transpose(0, 1).reshape(t, s.heads_per_rank * s.v_head)
    return fp8_block_linear(o, w["self_attn.o_proj.weight"], w["self_attn.o_proj.weight_scale_inv"], s.block)


def attention(
    x: torch.Tensor,
    inputs: DecodeInputs,
    caches: LayerCaches,
    w: dict[str, torch.Tensor],
    s: GlmLayerShape,
    prev_topk: torch.Tensor | None = None,
    run_indexer: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`DeepseekV2AttentionMLA.forward` (absorbed MLA, decode) on the normed input x.
    A layer whose indexer is skipped (`indexer_types[i] == "shared"`) passes
    run_indexer=False and the previous layer's top-k. Writes both caches at out_cache_loc.
    Returns (this rank's o_proj partial [T, H] bf16, top-k logical positions)."""
    latent = qkv_a_proj(x, w, s)
    q_lora, k_nope, k_pe = latent_norms(latent, w, s)
    if run_indexer:
        topk = indexer(x, q_lora, inputs, caches, w, s)
    else:
        if prev_topk is None:
            raise ValueError("a layer without an indexer needs the previous layer's top-k")
        topk = prev_topk
    q = q_b_proj(q_lora, w, s)
    q_nope, q_pe = q.split([s.qk_nope, s.qk_rope], dim=-1)
    q_nope_out = absorb_q(q_nope, w)
    q_pe, k_pe = mla_rope(q_pe, k_pe, inputs.positions, s)
    mla_cache_write(caches.kv, inputs.out_cache_loc, k_nope, k_pe)
    slots = topk_to_slots(topk, inputs)
    attn = sparse_mla(q_nope_out, q_pe, caches.kv, slots, s)
    return attn_output(attn, w, s), topk


def post_attention_norm(
    attn_out: torch.Tensor, residual: torch.Tensor, w: dict[str, torch.Tensor], s: GlmLayerShape
) -> tuple[torch.Tensor, torch.Tensor]:
    """attn_boundary.finish + ffn_boundary.prepare after the all-reduce: residual add and
    `post_attention_layernorm`. Returns (normed x, new residual)."""
    return rms_norm(attn_out, w["post_attention_layernorm.weight"], s.rms_eps, residual)


# ---- MoE -------------------------------------------------------------------------------------
def gate_logits(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """`MoEGate.forward`: bf16 router weight [E, H], fp32 logits (tiny_gemm_bf16 /
    linear_bf16_fp32: bf16 products, fp32 accumulation). Returns [T, E] fp32."""
    return _mm_f32(x, w["mlp.gate.weight"])


def biased_topk(
    logits: torch.Tensor,
    correction_bias: torch.Tensor,
    s: GlmLayerShape,
    apply_routed_scaling: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GLM-5.3's routing: `mono_common.ref.routing.biased_topk` (SGLang's `biased_topk_impl`)
    with the shape's top-k, renormalisation and, if `apply_routed_scaling`, its scaling factor."""
    return _biased_topk(logits, correction_bias, s.top_k, renormalize=s.norm_topk_prob,
                        routed_scaling=s.routed_scaling if apply_routed_scaling else None)


def shared_expert(x: torch.Tensor, w: dict[str, torch.Tensor], s: GlmLayerShape) -> torch.Tensor:
    """`DeepseekV2MLP.forward` (the shared expert, TP-sharded, no reduce): FP8 gate_up_proj,
    SiLU-and-mul, FP8 down_proj (`mono_common.ref.moe.expert_mlp`). Returns this rank's
    partial [T, H] bf16."""
    return expert_mlp(
        x,
        w["mlp.shared_experts.gate_up_proj.weight"],
        w["mlp.shared_experts.gate_up_proj.weight_scale_inv"],
        w["mlp.shared_experts.down_proj.weight"],
        w["mlp.shared_experts.down_proj.weight_scale_inv"],
        s.block,
    )


def routed_experts(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w: dict[str, torch.Tensor],
    s: GlmLayerShape,
) -> torch.Tensor:
    """`FusedMoE` with the FP8 block-128 Triton runner (`fused_experts_impl`), as
    `mono_common.ref.moe.routed_experts` computes it, with GLM-5.3's routed scaling.
    Returns this rank's routed partial [T, H] bf16."""
    return _routed_experts(
        x,
        topk_ids,
        topk_weights,
        w["mlp.experts.w13_weight"],
        w["mlp.experts.w13_weight_scale_inv"],
        w["mlp.experts.w2_weight"],
        w["mlp.experts.w2_weight_scale_inv"],
        routed_scale=s.routed_scaling,
        blk=s.block,
    )


def moe(x: torch.Tensor, w: dict[str, torch.Tensor], s: GlmLayerShape) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`DeepseekV2MoE.forward_normal` with reduce deferred to the boundary: shared expert,
    router, biased top-k, routed experts, `routed += shared` in bf16.
    Returns (this rank's partial [T, H] bf16, {"topk_ids", "topk_weights", "router_logits"})."""
    shared = shared_expert(x, w, s) if s.n_shared else None
    logits = gate_logits(x, w)
    wts, ids = biased_topk(logits, w["mlp.gate.e_score_correction_bias"], s)
    out = routed_experts(x, wts, ids, w, s)
    if shared is not None:
        out = (out.float() + shared.float()).to(BF16)
    return out, {"topk_ids": ids, "topk_weights": wts, "router_logits": logits}


# ---- the layer --------------------------------------------------------------------------------
AllReduce = Callable[[torch.Tensor], torch.Tensor]


def decoder_layer(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    inputs: DecodeInputs,
    caches: LayerCaches,
    w: dict[str, torch.Tensor],
    s: GlmLayerShape,
    all_reduce: AllReduce | None = None,
    prev_topk: torch.Tensor | None = None,
    run_indexer: bool = True,
) -> LayerOutput:
    """`DeepseekV2DecoderLayer.forward` for one MoE layer, one rank, one decode step.

    hidden: the previous layer's MLP output [T, H] bf16 (or the embeddings on layer 0 with
    residual=None); all_reduce: called at both all-reduce points with this rank's partial
    (None = identity: right at TP1, or to read one rank's partials). Caches are written in
    place. Returns LayerOutput(hidden=MoE output, residual, topk, aux)."""
    ar = all_reduce or (lambda t: t)
    x, residual = input_norm(hidden, residual, w, s)
    attn_partial, topk = attention(x, inputs, caches, w, s, prev_topk, run_indexer)
    x2, residual = post_attention_norm(ar(attn_partial), residual, w, s)
    moe_partial, aux = moe(x2, w, s)
    aux = dict(aux, attn_partial=attn_partial, moe_partial=moe_partial)
    return LayerOutput(hidden=ar(moe_partial), residual=residual, topk=topk, aux=aux)


def all_reduce_sum(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """The TP all-reduce as mono's one-shot all-reduce does it: fp32 sum in rank order, one
    rounding to bf16, identical on every rank. (NCCL / SGLang's custom all-reduce may sum in a
    different order or precision; that is not mirrored.)"""
    acc = partials[0].float()
    for p in partials[1:]:
        acc = acc + p.float()
    return acc.to(partials[0].dtype)


def decoder_layer_tp(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    inputs: DecodeInputs,
    caches: Sequence[LayerCaches],
    weights: Sequence[dict[str, torch.Tensor]],
    shapes: Sequence[GlmLayerShape],
    prev_topk: torch.Tensor | None = None,
    run_indexer: bool = True,
) -> LayerOutput:
    """All TP ranks of one layer in one process (each rank with its own weight shard and its
    own copy of the replicated caches), the two all-reduces done by `all_reduce_sum`."""
    n = len(shapes)
    xs, res = [], []
    for r in range(n):
        x, rr = input_norm(hidden, residual, weights[r], shapes[r])
        xs.append(x)
        res.append(rr)
    parts, topks = [], []
    for r in range(n):
        p, t = attention(xs[r], inputs, caches[r], weights[r], shapes[r], prev_topk, run_indexer)
        parts.append(p)
        topks.append(t)
    reduced = all_reduce_sum(parts)
    parts2, aux0 = [], {}
    for r in range(n):
        x2, res[r] = post_attention_norm(reduced, res[r], weights[r], shapes[r])
        p2, aux = moe(x2, weights[r], shapes[r])
        parts2.append(p2)
        if r == 0:
            aux0 = aux
    return LayerOutput(hidden=all_reduce_sum(parts2), residual=res[0], topk=topks[0], aux=aux0)
