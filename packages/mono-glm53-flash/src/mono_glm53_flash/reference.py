"""One GLM-5.3-Flash covered decoder layer for a decode step, in plain torch, as SGLang 0.5.23.

GLM-5.3-Flash (`Glm5NextForConditionalGeneration`, models/glm5_next.py) runs each MoE layer
from 3 to 43 as either a KDA (Kimi delta attention) layer or a sparse-attention layer (MLA
without RoPE, made sparse by the pooled-key `IndexerKPool`), with hyper-connection (mHC)
residual streams. Every function names the SGLang function it mirrors (paths relative to
`sglang/` in the 0.5.23 wheel); every such name is in `SGLANG_READS`. This module imports no
sglang. `weights` is the dict `mono_glm53_flash.weights` builds for one TP rank, keyed by the
parameter names under the SGLang decoder layer.

A decode step of T rows on one TP rank (`FlashShape` gives the dims):

 1. `hc_pre` (attention side): mixes, Sinkhorn, pre/post/comb; the layer input
    x = sum_k pre_k R_k (`MHCState.read_attn_input` -> `hc_pre` -> `_mhc_pre_torch`); then
    `input_layernorm`.
 2a. KDA (`kda_attention`): projections, `causal_conv1d_update` on the request's conv state,
    the gated delta-rule update of its fp32 state (`kda_recurrent_update`), the gated output
    RMSNorm, o_proj -> this rank's partial sum.
 2b. sparse MLA (`mla_attention`): fused q/kv-a projection, latent norms, the pooled-key
    indexer (compression of 4 tokens into one index key through the request's tail buffer,
    index logits, top-512 groups + the tail tokens), q_b, W_UK absorption, KV write, sparse
    attention over the selected tokens, W_UV, o_proj -> this rank's partial sum.
 3. all-reduce point #1 (`all_reduce`), then `hc_post` writes the output into the streams.
 4. `hc_pre` (FFN side) + `post_attention_layernorm`.
 5. `moe`: fp32 router logits, `biased_topk` (sigmoid + bias, top-8, renormalise, x 2.5),
    the FP8 shared expert and the MXFP4 routed experts, both with the SwiGLU clamp -> partial.
 6. all-reduce point #2, then `hc_post` -> the streams the next layer reads.

Numerics. On the CPU every GEMM multiplies dequantised operands in fp32 and rounds once
(GEMM accumulation order is not mirrored). Where SGLang's torch code exists (`_mhc_pre_torch`,
`_mhc_post_torch`, `biased_topk_impl`, `swiglu_clamped`, `RMSNorm.forward_native`) the
functions here are the same op sequence, bit for bit. Where SGLang runs a Triton kernel
(`causal_conv1d_update`, `fused_recurrent_kda_packed_decode`, the gated norm, the key
compression) they follow the kernel's fp32 arithmetic and its one rounding. Two choices that
differ from SGLang's CUDA fast paths by rounding only: the mHC pre and the input norm run
unfused (TileLang's `mhc_pre` fuses the norm and skips the bf16 rounding of the layer input),
and the all-reduce sums the ranks' bf16 partials in fp32 in rank order (as mono_common's
all-reduce does).

Expert activations. The routed experts are MXFP4 (e2m1 + e8m0 per 32). SGLang's CUDA path
multiplies dequantised MXFP4 weights by bf16 activations (W4A16); its ROCm AITER path and
Quark quantise the activations to MXFP4 too (W4A4); the published gfx950 port uses MXFP8
activations. `moe(..., act_format=)` computes any of the three; the kernel will follow
"bf16" (W4A16): a decode step of 1 to 8 rows is bound by the weight stream, so quantising
8 x 4096 activations saves no time; bf16 activations lose nothing; and they are what
SGLang computes on the H200, the one machine where the kernel can be checked against SGLang.
On gfx950 the check-mode bounds then cover SGLang's W4A4 activation rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import FlashShape
from .quant import (
    act_quant,
    bf16_linear,
    fp8_block_linear,
    mxfp4_dequant,
    quant_act,
)

__all__ = [
    "SGLANG_READS",
    "DecodeInputs",
    "KdaState",
    "MlaState",
    "rms_norm",
    "layer_norm",
    "hc_expand",
    "hc_contract",
    "hc_pre",
    "hc_post",
    "linear",
    "causal_conv1d_update",
    "kda_gate",
    "kda_recurrent_update",
    "gated_rms_norm",
    "kda_attention",
    "hadamard",
    "indexer_query",
    "indexer_key",
    "kpool_compress",
    "kpool_compress_update",
    "index_logits",
    "kpool_topk",
    "sparse_mla",
    "mla_attention",
    "swiglu_clamp",
    "gate_logits",
    "biased_topk",
    "shared_expert",
    "routed_experts",
    "moe",
    "all_reduce_sum",
    "decoder_layer",
    "decoder_layer_tp",
]

#: Every SGLang 0.5.23 name this module mirrors.
SGLANG_READS: tuple[str, ...] = (
    "sglang.srt.models.glm5_next.Glm5NextDecoderLayer.forward",
    "sglang.srt.models.glm5_next.Glm5NextDecoderLayer.hc_attn_pre",
    "sglang.srt.models.glm5_next.Glm5NextDecoderLayer.hc_ffn_pre",
    "sglang.srt.models.glm5_next.Glm5NextDecoderLayer.hc_post",
    "sglang.srt.models.glm5_next.Glm5NextLinearAttention.forward",
    "sglang.srt.models.glm5_next.Glm5NextLinearAttention.forward_qkvbfg",
    "sglang.srt.models.glm5_next.swiglu_clamped",
    "sglang.srt.models.glm5_next._MHC_POST_MULT_VALUE",
    "sglang.srt.layers.layer_boundary.residual.mhc.MHCState.read_attn_input",
    "sglang.srt.layers.layer_boundary.residual.mhc.MHCState.update_and_read_ffn_input",
    "sglang.kernels.ops.layernorm.mhc.hc_pre",
    "sglang.kernels.ops.layernorm.mhc.hc_post",
    "sglang.kernels.ops.layernorm.mhc.hc_expand",
    "sglang.kernels.ops.layernorm.mhc.hc_contract",
    "sglang.kernels.ops.layernorm.mhc._mhc_pre_torch",
    "sglang.kernels.ops.layernorm.mhc._mhc_post_torch",
    "sglang.srt.layers.layernorm.RMSNorm.forward_native",
    "sglang.srt.layers.layernorm.LayerNorm.forward_native",
    "sglang.srt.layers.attention.linear.kda_backend.KDAAttnBackend.forward_decode",
    "sglang.srt.layers.attention.linear.kernels.kda_triton.TritonKDAKernel.packed_decode",
    "sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update",
    "sglang.kernels.ops.mamba.causal_conv1d_triton.PAD_SLOT_ID",
    "sglang.kernels.ops.attention.fla.fused_recurrent.fused_recurrent_kda_packed_decode",
    "sglang.kernels.ops.attention.fla.fused_recurrent.fused_recurrent_kda_packed_decode_kernel",
    "sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated",
    "sglang.kernels.ops.attention.fla.fused_norm_gate.layer_norm_gated_fwd",
    "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA",
    "sglang.srt.models.deepseek_v2.DeepseekV2MoE.forward_normal",
    "sglang.srt.models.deepseek_v2.DeepseekV2MLP.forward",
    "sglang.srt.models.deepseek_v2.MoEGate.forward",
    "sglang.srt.layers.attention.dsa.dsa_indexer.rotate_activation",
    "sglang.srt.layers.attention.dsa.dsa_indexer_kpool.IndexerKPool._get_q_k_bf16",
    "sglang.srt.layers.attention.dsa.dsa_indexer_kpool.IndexerKPool._get_logits_head_gate",
    "sglang.srt.layers.attention.dsa.dsa_indexer_kpool.IndexerKPool._compute_gate_score_if_missing",
    "sglang.srt.layers.attention.dsa.dsa_indexer_kpool.IndexerKPool._compress_write_decode",
    "sglang.srt.layers.attention.dsa.dsa_indexer_kpool.IndexerKPool._get_topk_paged",
    "sglang.srt.layers.attention.dsa.dsa_indexer_kpool.IndexerKPool._forward_cuda_impl",
    "sglang.srt.layers.attention.dsa.kpool_fp8_index._kpool_decode_update_and_maybe_write_cache_kernel",
    "sglang.srt.layers.attention.dsa.kpool_fp8_index.topk_from_pooled_history_logits",
    "sglang.srt.layers.attention.dsa.kpool_fp8_index.expand_pooled_groups_to_topk",
    "sglang.srt.layers.attention.dsa.kpool_fp8_index.append_kpool_tail_to_topk",
    "sglang.srt.layers.attention.dsa.kpool_fp8_index.build_pooled_page_table_64",
    "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend.forward_decode",
    "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool.kpool_decode_update_index_cache",
    "sglang.srt.mem_cache.memory_pool.MLATokenToKVPool.set_mla_kv_buffer",
    "sglang.srt.layers.moe.topk.biased_topk_impl",
    "sglang.kernels.ops.quantization.act_quant_triton.act_quant",
    "sglang.kernels.ops.quantization.fp8_kernel._per_token_group_quant_8bit",
    "sglang.srt.layers.quantization.fp8_utils.block_quant_dequant",
    "sglang.srt.layers.quantization.fp8_utils.dequant_mxfp4",
    "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.create_weights",
)

BF16 = torch.bfloat16
W = dict[str, torch.Tensor]


# ---- per-step inputs and per-layer state -----------------------------------------------------
@dataclass
class DecodeInputs:
    """The `ForwardBatch` fields a decode layer reads, one row a request.

    positions [T] int64 (= seq_lens - 1); seq_lens [T] int32 (with the new token);
    req_pool_indices [T] int64 rows of `req_to_token`; out_cache_loc [T] int64 the new token's
    KV slot (0 for a pad row: slot 0 is SGLang's padding slot); req_to_token [reqs, max_ctx]
    int32 (`ReqToTokenPool.req_to_token`); mamba_slots [T] int64 the request's MambaPool slot
    (`forward_metadata.mamba_cache_indices`; -1 = `PAD_SLOT_ID`, a row to skip).
    """

    positions: torch.Tensor
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    req_to_token: torch.Tensor
    mamba_slots: torch.Tensor


@dataclass
class KdaState:
    """One KDA layer's slice of SGLang's MambaPool for this rank (updated in place).

    conv [slots, K-1, 3 * P_l] (bf16 by default, `SGLANG_MAMBA_CONV_DTYPE`): the last K-1
    inputs q|k|v of the conv, oldest first; ssm [slots, H_l, V, K] fp32: the recurrent state.
    """

    conv: torch.Tensor
    ssm: torch.Tensor


@dataclass
class MlaState:
    """One sparse-attention layer's slice of SGLang's hybrid KV pool (updated in place).

    kv [slots + page, 1, kv_lora] bf16 (`MLATokenToKVPool.kv_buffer[layer]`, no rope part);
    index_k [pages, index_page * (D + 4)] uint8: per page `index_page` fp8 pooled keys
    (row-major, or AITER's tile order on ROCm: `preshuffle_tile`) then their fp32 scales;
    tail_k / tail_score [reqs + 1, kpool + extra, D] bf16 (`_compress_tail_k/score[layer]`),
    indexed by the request's req_pool_index.
    """

    kv: torch.Tensor
    index_k: torch.Tensor
    tail_k: torch.Tensor
    tail_score: torch.Tensor
    preshuffle_tile: int = 0


# ---- norms -----------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """`RMSNorm.forward_native` (no residual): fp32 variance, (x * rsqrt * w) rounded once."""
    orig = x.dtype
    xf = x.to(torch.float32)
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    xf = xf * torch.rsqrt(var + eps)
    return (xf * w).to(orig)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """`LayerNorm.forward_native` with fp32 parameters (the indexer's k_norm)."""
    return F.layer_norm(x.to(torch.float32), (x.shape[-1],), weight=w, bias=b, eps=eps).to(x.dtype)


# ---- mHC -------------------------------------------------------------------------------------
def hc_expand(x: torch.Tensor, n: int) -> torch.Tensor:
    """`mhc.hc_expand`: the first layer's streams, n copies of the embedding [T, n*H]."""
    return x.repeat(1, n)


def hc_contract(x: torch.Tensor, n: int) -> torch.Tensor:
    """`mhc.hc_contract`: the last layer's streams averaged back to [T, H]."""
    return x.unflatten(-1, (n, -1)).mean(dim=-2)


def hc_pre(
    streams: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, s: FlashShape
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`mhc.hc_pre` on the torch path (`_mhc_pre_torch`), op for op.

    streams [T, n*H] bf16; fn [mix, n*H], scale [3], base [mix] fp32. Returns the layer input
    [T, H] bf16 (before the layer's norm), comb [T, n, n] and post [T, n] fp32.
    """
    t = streams.shape[0]
    n, h = s.hc_mult, s.hidden
    residual = streams.view(t, n, h)
    x_flat = residual.view(t, n * h).float()
    rsqrt = torch.rsqrt(x_flat.square().mean(-1, keepdim=True) + s.rms_eps)
    mixes = F.linear(x_flat, fn) * rsqrt
    pre = torch.sigmoid(mixes[:, :n] * scale[0] + base[:n]) + s.hc_eps
    post = s.hc_post_mult * torch.sigmoid(mixes[:, n : 2 * n] * scale[1] + base[n : 2 * n])
    comb = mixes[:, 2 * n :].view(t, n, n) * scale[2] + base[2 * n :].view(n, n)
    comb = comb.softmax(-1) + s.hc_eps
    comb = comb / (comb.sum(-2, keepdim=True) + s.hc_eps)
    for _ in range(s.hc_sinkhorn_iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + s.hc_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + s.hc_eps)
    layer_input = (pre.unsqueeze(-1) * residual.float()).sum(dim=1).to(streams.dtype)
    return layer_input, comb, post


def hc_post(x: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """`mhc.hc_post` on the torch path (`_mhc_post_torch`): R'_i = post_i y + sum_j comb[j, i] R_j.

    x [T, H] bf16 (the reduced layer output), streams [T, n*H] bf16 -> [T, n*H] bf16.
    """
    t, h = x.shape
    n = post.shape[-1]
    residual = streams.view(t, n, h)
    out = post.view(t, n, 1) * x.unsqueeze(1) + (comb.unsqueeze(-1) * residual.unsqueeze(2)).sum(dim=1)
    return out.type_as(x).view(t, n * h)


# ---- linears ---------------------------------------------------------------------------------
def linear(x: torch.Tensor, weights: W, name: str, s: FlashShape, out_dtype: torch.dtype = BF16) -> torch.Tensor:
    """`<name>.weight` as SGLang runs it: FP8 block when `<name>.weight_scale_inv` is there
    (W8A8, `fp8_utils.triton_w8a8_block_fp8_linear`), else an unquantised linear."""
    w = weights[f"{name}.weight"]
    scale = weights.get(f"{name}.weight_scale_inv")
    if scale is not None:
        return fp8_block_linear(x, w, scale, s.block).to(out_dtype)
    return bf16_linear(x, w, out_dtype)


# ---- KDA -------------------------------------------------------------------------------------
def causal_conv1d_update(
    x: torch.Tensor, conv: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """`causal_conv1d_update(activation="silu", conv_state_indices=slots)` for one token a row.

    x [T, C] bf16; conv [slots, K-1, C] (KDA keeps the window as [K-1, C], oldest first; the
    backend passes its transpose); weight [C, K] fp32. acc = sum_j w_j * window_j in fp32 over
    the K-1 stored inputs then x, silu(acc) rounded to x's dtype; the window shifts by one and
    keeps x. A row whose slot is -1 (`PAD_SLOT_ID`) is skipped: no state write, output 0.
    """
    k = weight.shape[1]
    out = torch.zeros_like(x)
    for r in range(x.shape[0]):
        slot = int(slots[r])
        if slot < 0:
            continue
        window = torch.cat([conv[slot].float(), x[r : r + 1].float()], dim=0)  # [K, C]
        acc = torch.zeros(x.shape[1], dtype=torch.float32)
        for j in range(k):
            acc = acc + window[j] * weight[:, j]
        out[r] = (acc / (1 + torch.exp(-acc))).to(x.dtype)
        conv[slot] = torch.cat([conv[slot][1:], x[r : r + 1].to(conv.dtype)], dim=0)
    return out


def kda_gate(a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None) -> torch.Tensor:
    """The per-K log decay g of `fused_recurrent_kda_packed_decode_kernel`, fp32 [T, H, K]:
    -exp(A_log) * softplus(a + dt_bias) (softplus linear above 20), or with the safe gate
    lower_bound * sigmoid(exp(A_log) * (a + dt_bias))."""
    t, h = a.shape[0], a_log.numel()
    x = a.float().view(t, h, -1) + dt_bias.float().view(h, -1)
    decay = torch.exp(a_log.float().view(1, h, 1))
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(decay * x)
    soft = torch.where(x <= 20.0, torch.log(1.0 + torch.exp(x)), x)
    return -decay * soft


def kda_recurrent_update(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm: torch.Tensor,
    slots: torch.Tensor,
    scale: float,
    lower_bound: float | None = None,
) -> torch.Tensor:
    """`fused_recurrent_kda_packed_decode` (use_qk_l2norm_in_kernel=True), one token a row.

    qkv [T, 3*H*K] (the conv output, q|k|v), a [T, H*K] (forget-gate input), b [T, H] (beta
    logits), A_log [H], dt_bias [H*K], ssm [slots, H, V, K] fp32 updated in place. Per head:
    q, k l2-normalised (eps 1e-6 under the root), q *= scale; S *= exp(g) along K;
    v -= S k; v *= sigmoid(b); S += v k^T; o = S q (fp32, rounded to qkv's dtype).
    Returns o [T, H, V]; a row whose slot is -1 gives 0 and writes no state.
    """
    t = qkv.shape[0]
    h, v_dim, k_dim = ssm.shape[1:]
    out = torch.zeros(t, h, v_dim, dtype=qkv.dtype)
    g = kda_gate(a, a_log, dt_bias, lower_bound)
    beta = torch.sigmoid(b.float().view(t, h))
    for r in range(t):
        slot = int(slots[r])
        if slot < 0:
            continue
        q = qkv[r, : h * k_dim].float().view(h, k_dim)
        k = qkv[r, h * k_dim : 2 * h * k_dim].float().view(h, k_dim)
        v = qkv[r, 2 * h * k_dim :].float().view(h, v_dim)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q * scale
        state = ssm[slot].float() * torch.exp(g[r])[:, None, :]
        v = (v - (state * k[:, None, :]).sum(-1)) * beta[r][:, None]
        state = state + v[:, :, None] * k[:, None, :]
        out[r] = (state * q[:, None, :]).sum(-1).to(qkv.dtype)
        ssm[slot] = state.to(ssm.dtype)
    return out


def gated_rms_norm(o: torch.Tensor, gate: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """`FusedRMSNormGated(head_dim, activation="sigmoid")` (`layer_norm_gated_fwd`, RMS):
    y = o * rsqrt(mean(o^2) + eps) * w * sigmoid(gate), fp32, rounded once. o, gate [..., D]."""
    x = o.float()
    rstd = 1 / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)
    return (x * rstd * w.float() * torch.sigmoid(gate.float())).to(o.dtype)


def kda_attention(x: torch.Tensor, weights: W, state: KdaState, inp: DecodeInputs, s: FlashShape) -> torch.Tensor:
    """`Glm5NextLinearAttention.forward` for a decode step: this rank's o_proj partial [T, H].

    Projections as `forward_qkvbfg` (qkv_proj; b_proj; f_b(f_a(x)); g_b(g_a(x))), then
    `KDAAttnBackend.forward_decode`'s unfused chain: `causal_conv1d_update` and the packed
    KDA decode on the request's MambaPool slot, then o_norm and o_proj.
    """
    t = x.shape[0]
    hl, d = s.kda_heads_per_rank, s.kda_head_dim
    qkv = linear(x, weights, "self_attn.qkv_proj", s)
    beta = linear(x, weights, "self_attn.b_proj", s)
    forget = linear(linear(x, weights, "self_attn.f_a_proj", s), weights, "self_attn.f_b_proj", s)
    gate = linear(linear(x, weights, "self_attn.g_a_proj", s), weights, "self_attn.g_b_proj", s)
    conv_w = weights["self_attn.qkv_conv1d.weight"].squeeze(1)
    mixed = causal_conv1d_update(qkv, state.conv, conv_w, inp.mamba_slots)
    o = kda_recurrent_update(
        mixed,
        forget,
        beta,
        weights["self_attn.A_log"].reshape(-1),
        weights["self_attn.dt_bias"],
        state.ssm,
        inp.mamba_slots,
        s.kda_scale,
        s.gate_lower_bound,
    )
    o = gated_rms_norm(o, gate.view(t, hl, d), weights["self_attn.o_norm.weight"], s.rms_eps)
    return linear(o.reshape(t, hl * d), weights, "self_attn.o_proj", s)


# ---- sparse MLA and the pooled-key indexer ---------------------------------------------------
def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform of the last dim (a power of two) in fp32:
    `rotate_activation` (scale D ** -0.5) and the key compression's `_hadamard128`. In
    butterflies, as both kernels sum (mono_common.ref.rope.hadamard_rotate multiplies by the
    matrix, another fp32 order), fp32 out."""
    d = x.shape[-1]
    y = x.float().reshape(-1, d)
    step = 1
    while step < d:
        y = y.view(-1, d // (2 * step), 2, step)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, d)
        step *= 2
    return (y * d**-0.5).view(x.shape)


def indexer_query(q_lat: torch.Tensor, x: torch.Tensor, weights: W, s: FlashShape) -> tuple[torch.Tensor, torch.Tensor]:
    """`IndexerKPool._get_q_k_bf16` (query half, no RoPE) + `act_quant` + `_get_logits_head_gate`.

    query = rotate(wq_b(q_lat)) [T, ih, D] bf16, quantised to fp8 with a power-of-two scale a
    head (scale_fmt "ue8m0"); head weights = weights_proj(x.float()) * ih^-0.5 * q_scale *
    D^-0.5 (fp32). Returns (q_fp8 dequantised as fp32 values [T, ih, D], weights [T, ih])."""
    t = q_lat.shape[0]
    query = linear(q_lat, weights, "self_attn.indexer.wq_b", s).view(t, s.index_heads, s.index_head_dim)
    query = hadamard(query).to(BF16)
    q_fp8, q_scale = act_quant(query, s.index_head_dim, "ue8m0")
    head = bf16_linear(x.float(), weights["self_attn.indexer.weights_proj.weight"], torch.float32)
    head = head * s.index_heads**-0.5
    head = head * q_scale[..., 0] * s.index_softmax_scale
    return q_fp8.float(), head


def indexer_key(x: torch.Tensor, weights: W, s: FlashShape) -> tuple[torch.Tensor, torch.Tensor]:
    """The new token's index key and its compression gate score, both [T, D] bf16:
    k_norm(wk(x)) (LayerNorm, fp32 parameters) and `_compute_gate_score_if_missing`
    (F.linear with the bf16 `index_kpool_compress_gate`)."""
    key = linear(x, weights, "self_attn.indexer.wk", s)
    key = layer_norm(key, weights["self_attn.indexer.k_norm.weight"], weights["self_attn.indexer.k_norm.bias"], s.index_k_norm_eps)
    score = bf16_linear(x, weights["self_attn.indexer.index_kpool_compress_gate"])
    return key, score


def _index_k_offsets(row: int, d: int, tile: int) -> torch.Tensor:
    """Byte offsets of pooled key `row`'s D values inside its page (`_kpool_cache_k_offsets`)."""
    cols = torch.arange(d)
    if not tile:
        return row * d + cols
    return (row // tile) * (tile * d) + (cols // tile) * (tile * tile) + (row % tile) * tile + cols % tile


def _index_page_row(inp: DecodeInputs, r: int, token: int, s: FlashShape) -> tuple[int, int]:
    """(index page, row in it) of the pooled key holding logical token `token` of row r's
    request: the KV page of the group's first token, row (token // kpool) % index_page."""
    req = int(inp.req_pool_indices[r])
    first = (token // s.index_kpool) * s.index_kpool
    page = int(inp.req_to_token[req, first]) // s.page
    return page, (token // s.index_kpool) % s.index_page


def read_index_key(state: MlaState, page: int, row: int, s: FlashShape) -> tuple[torch.Tensor, torch.Tensor]:
    """One pooled key from the index-K cache: (fp8 values as fp32 [D], fp32 scale)."""
    d = s.index_head_dim
    buf = state.index_k[page]
    k = buf[_index_k_offsets(row, d, state.preshuffle_tile)].view(torch.float8_e4m3fn).float()
    sc = buf[s.index_page * d + 4 * row : s.index_page * d + 4 * row + 4].view(torch.float32)[0]
    return k, sc


def write_index_key(state: MlaState, page: int, row: int, k_fp8: torch.Tensor, scale: torch.Tensor, s: FlashShape) -> None:
    d = s.index_head_dim
    buf = state.index_k[page]
    buf[_index_k_offsets(row, d, state.preshuffle_tile)] = k_fp8.view(torch.uint8)
    buf[s.index_page * d + 4 * row : s.index_page * d + 4 * row + 4] = scale.reshape(1).float().view(torch.uint8)


def _to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(BF16)


def kpool_compress(
    keys: torch.Tensor, scores: torch.Tensor, ape: torch.Tensor, to_bf16: Callable[[torch.Tensor], torch.Tensor] = _to_bf16
) -> torch.Tensor:
    """One pooled index key before its fp8 quantisation, as the key compression kernels form
    it: keys, scores [kpool, D] (bf16) and ape [kpool, D] fp32 -> softmax over the kpool slots
    of (score + ape) per dim (fp32, max-subtracted), the weighted mean of the keys rounded to
    bf16, Hadamard-rotated and rounded to bf16 again. [D] bf16. (`to_bf16` is the rounding;
    tests pass the Triton interpreter's, which truncates.)"""
    sc = scores.float() + ape.float()
    prob = torch.exp(sc - sc.max(0).values)
    pooled = to_bf16((keys.float() * prob).sum(0) / prob.sum(0))
    return to_bf16(hadamard(pooled))


def kpool_compress_update(
    key: torch.Tensor, score: torch.Tensor, weights: W, state: MlaState, inp: DecodeInputs, s: FlashShape
) -> None:
    """`_kpool_decode_update_and_maybe_write_cache_kernel` (via
    `DSATokenToKVPool.kpool_decode_update_index_cache`), a row at a time.

    When the new token closes its group of kpool (pos % kpool == kpool - 1), the group's keys
    (the tail buffer's, the new one for its own slot) are averaged with softmax(score + ape)
    weights per dim (fp32), rounded to bf16, Hadamard-rotated, rounded to bf16 and quantised
    to fp8 with a power-of-two scale (amax clamped to 1e-4), and written to the index-K page.
    Then the new key and score go to tail slot pos % (kpool + extra). A pad row (out_cache_loc
    0, a request index out of range or a position past seq_len) writes nothing.
    """
    ape = weights["self_attn.indexer.index_kpool_compress_ape"]
    kp, tail = s.index_kpool, state.tail_k.shape[1]
    for r in range(key.shape[0]):
        req, pos = int(inp.req_pool_indices[r]), int(inp.positions[r])
        valid = 0 <= req < state.tail_k.shape[0] and int(inp.out_cache_loc[r]) != 0 and 0 <= pos < int(inp.seq_lens[r])
        if not valid:
            continue
        slot = pos % kp
        if slot == kp - 1:
            phys = [(pos - slot + j) % tail for j in range(kp)]
            keys = torch.stack([key[r] if j == slot else state.tail_k[req, p] for j, p in enumerate(phys)])
            scores = torch.stack([score[r] if j == slot else state.tail_score[req, p] for j, p in enumerate(phys)])
            k_fp8, k_scale = act_quant(kpool_compress(keys, scores, ape)[None], s.index_head_dim, "ue8m0")
            page, row = _index_page_row(inp, r, pos, s)
            write_index_key(state, page, row, k_fp8[0], k_scale[0], s)
        state.tail_k[req, pos % tail] = key[r]
        state.tail_score[req, pos % tail] = score[r].to(state.tail_score.dtype)


def index_logits(q: torch.Tensor, head: torch.Tensor, state: MlaState, inp: DecodeInputs, s: FlashShape) -> list[torch.Tensor]:
    """DeepGEMM `fp8_paged_mqa_logits` over the pooled keys (`_get_topk_paged`): for each row,
    logit[j] = k_scale[j] * sum_h head[h] * relu(q_fp8[h] . k_fp8[j]) over its
    pool_len = seq_len // kpool closed groups. Returns one fp32 [pool_len] tensor a row."""
    out = []
    for r in range(q.shape[0]):
        pool_len = int(inp.seq_lens[r]) // s.index_kpool
        logits = torch.empty(pool_len)
        for j in range(pool_len):
            page, row = _index_page_row(inp, r, j * s.index_kpool, s)
            k, sc = read_index_key(state, page, row, s)
            logits[j] = (torch.relu(q[r] @ k) * head[r]).sum() * sc
        out.append(logits)
    return out


def kpool_topk(logits: Sequence[torch.Tensor], inp: DecodeInputs, s: FlashShape) -> torch.Tensor:
    """`topk_from_pooled_history_logits` + `append_kpool_tail_to_topk`: the top
    min(pool_len, index_topk / kpool) groups, each expanded to its kpool tokens, then the
    seq_len % kpool tail tokens; logical positions [T, index_topk + kpool - 1], -1 padded.
    Which of two equal logits wins is SGLang's top-k kernel's choice, not mirrored."""
    kp = s.index_kpool
    out = torch.full((len(logits), s.topk_width), -1, dtype=torch.int32)
    for r, lg in enumerate(logits):
        pool_len = lg.numel()
        n = min(pool_len, s.group_topk)
        groups = torch.topk(lg, n).indices if n else torch.empty(0, dtype=torch.long)
        tokens = (groups[:, None] * kp + torch.arange(kp)).reshape(-1)
        tail = torch.arange(pool_len * kp, int(inp.seq_lens[r]))
        sel = torch.cat([tokens, tail]).to(torch.int32)
        out[r, : sel.numel()] = sel
    return out


def sparse_mla(q_abs: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, scale: float) -> torch.Tensor:
    """Sparse MLA decode over the selected KV slots (`DeepseekSparseAttnBackend.forward_decode`,
    k = v = the 512-wide latent, no rope part): q_abs [T, H_l, kv_lora] bf16, slots [T, W]
    (-1 = none) -> [T, H_l, kv_lora] bf16, softmax in fp32 (accumulation order not mirrored)."""
    out = torch.zeros_like(q_abs)
    for r in range(q_abs.shape[0]):
        sel = slots[r][slots[r] >= 0].long()
        if sel.numel() == 0:
            continue
        k = kv[sel, 0].float()  # [S, kv_lora]
        p = torch.softmax((q_abs[r].float() @ k.t()) * scale, dim=-1)
        out[r] = (p @ k).to(q_abs.dtype)
    return out


def mla_attention(x: torch.Tensor, weights: W, state: MlaState, inp: DecodeInputs, s: FlashShape) -> tuple[torch.Tensor, torch.Tensor]:
    """`DeepseekV2AttentionMLA(skip_rope=True)` decode (absorbed path) with `IndexerKPool`:
    this rank's o_proj partial [T, H] and the indexer's top-k (logical positions)."""
    t = x.shape[0]
    hl = s.heads_per_rank
    qkv_a = linear(x, weights, "self_attn.fused_qkv_a_proj_with_mqa", s)
    q_lat = rms_norm(qkv_a[:, : s.q_lora], weights["self_attn.q_a_layernorm.weight"], s.rms_eps)
    kv_lat = rms_norm(qkv_a[:, s.q_lora : s.q_lora + s.kv_lora], weights["self_attn.kv_a_layernorm.weight"], s.rms_eps)
    # indexer: compress-write first, then score the closed groups (`_forward_cuda_impl`)
    qi, head = indexer_query(q_lat, x, weights, s)
    key, score = indexer_key(x, weights, s)
    kpool_compress_update(key, score, weights, state, inp, s)
    topk = kpool_topk(index_logits(qi, head, state, inp, s), inp, s)
    # MLA
    q = linear(q_lat, weights, "self_attn.q_b_proj", s).view(t, hl, s.qk_head)
    q_abs = torch.bmm(q.float().transpose(0, 1), weights["self_attn.w_kc"].float()).transpose(0, 1).to(BF16)
    for r in range(t):
        if int(inp.out_cache_loc[r]) != 0:
            state.kv[int(inp.out_cache_loc[r]), 0] = kv_lat[r]
    pt = inp.req_to_token[inp.req_pool_indices.long()]
    slots = torch.where(topk >= 0, pt.gather(1, topk.clamp_min(0).long()), -1)
    attn = sparse_mla(q_abs, state.kv, slots, s.softmax_scale)
    o = torch.bmm(attn.float().transpose(0, 1), weights["self_attn.w_vc"].float()).transpose(0, 1).to(BF16)
    return linear(o.reshape(t, hl * s.v_head), weights, "self_attn.o_proj", s), topk


# ---- MoE -------------------------------------------------------------------------------------
def swiglu_clamp(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """`glm5_next.swiglu_clamped` / the `silu_and_mul_clamp` kernel: silu(min(gate, L)) *
    clamp(up, -L, L) on the [gate | up] halves, in the input's dtype."""
    gate, up = torch.chunk(gate_up, 2, dim=-1)
    gate = torch.clamp(gate, max=limit)
    up = torch.clamp(up, min=-limit, max=limit)
    return F.silu(gate) * up


def _swiglu_clamp_f32(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """The fused kernels' arithmetic: fp32 in, one rounding to bf16."""
    return swiglu_clamp(gate_up.float(), limit).to(BF16)


def gate_logits(x: torch.Tensor, weights: W) -> torch.Tensor:
    """`MoEGate.forward`: router logits in fp32 (bf16 x bf16 products, fp32 accumulation)."""
    return bf16_linear(x, weights["mlp.gate.weight"], torch.float32)


def biased_topk(logits: torch.Tensor, bias: torch.Tensor, s: FlashShape) -> tuple[torch.Tensor, torch.Tensor]:
    """`biased_topk_impl` (sigmoid, no fused shared expert): pick by sigmoid(logit) + bias,
    weight by the unbiased sigmoid, renormalise in fp32 (+1e-20), x routed_scaling."""
    scores = logits.sigmoid()
    _, ids = torch.topk(scores + bias.view(1, -1), k=s.top_k, dim=-1, sorted=False)
    w = scores.gather(1, ids)
    if s.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True, dtype=torch.float32) + 1e-20)
    return (w * s.routed_scaling).to(torch.float32), ids.to(torch.int32)


def shared_expert(x: torch.Tensor, weights: W, s: FlashShape) -> torch.Tensor:
    """`DeepseekV2MLP.forward` (FP8 gate_up, clamped SwiGLU, FP8 down): this rank's partial."""
    h = linear(x, weights, "mlp.shared_experts.gate_up_proj", s)
    return linear(_swiglu_clamp_f32(h, s.swiglu_limit), weights, "mlp.shared_experts.down_proj", s)


def routed_experts(
    x: torch.Tensor, topk_w: torch.Tensor, topk_ids: torch.Tensor, weights: W, s: FlashShape, act_format: str = "bf16"
) -> torch.Tensor:
    """The MXFP4 routed experts of this rank's intermediate slice, fp32 [T, H] (unrounded).

    w13 [E, 2*I_l, H/2] packed (gate rows then up rows), w2 [E, H, I_l/2], scales a 32-group.
    Per chosen expert: h = bf16(act(x) @ W13^T), a = bf16(clamped SwiGLU(h)),
    y += w_e * (act(a) @ W2^T) in fp32, act = `quant_act(., act_format)`.
    """
    w13, s13 = weights["mlp.experts.w13_weight"], weights["mlp.experts.w13_weight_scale_inv"]
    w2, s2 = weights["mlp.experts.w2_weight"], weights["mlp.experts.w2_weight_scale_inv"]
    out = torch.zeros(x.shape[0], s.hidden, dtype=torch.float32)
    xa = quant_act(x, act_format, s.mx_group)
    for r in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[r, j])
            h = (xa[r] @ mxfp4_dequant(w13[e], s13[e], s.mx_group).t()).to(BF16)
            a = quant_act(_swiglu_clamp_f32(h, s.swiglu_limit)[None], act_format, s.mx_group)[0]
            out[r] += topk_w[r, j] * (a @ mxfp4_dequant(w2[e], s2[e], s.mx_group).t())
    return out


def moe(x: torch.Tensor, weights: W, s: FlashShape, act_format: str = "bf16") -> torch.Tensor:
    """`DeepseekV2MoE.forward_normal` (reduce deferred to the boundary): routed + shared,
    this rank's partial [T, H] bf16. The router is replicated: every rank routes alike."""
    w, ids = biased_topk(gate_logits(x, weights), weights["mlp.gate.e_score_correction_bias"], s)
    routed = routed_experts(x, w, ids, weights, s, act_format)
    return (routed + shared_expert(x, weights, s).float()).to(BF16)


# ---- the layer -------------------------------------------------------------------------------
def all_reduce_sum(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """The TP all-reduce point: the ranks' bf16 partials summed in fp32 in rank order."""
    acc = torch.zeros_like(partials[0], dtype=torch.float32)
    for p in partials:
        acc += p.float()
    return acc.to(partials[0].dtype)


def _attention(x: torch.Tensor, weights: W, state: KdaState | MlaState, inp: DecodeInputs, s: FlashShape) -> torch.Tensor:
    if isinstance(state, KdaState):
        return kda_attention(x, weights, state, inp, s)
    return mla_attention(x, weights, state, inp, s)[0]


def decoder_layer(
    streams: torch.Tensor,
    weights: W,
    state: KdaState | MlaState,
    inp: DecodeInputs,
    s: FlashShape,
    all_reduce: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    act_format: str = "bf16",
) -> torch.Tensor:
    """`Glm5NextDecoderLayer.forward` for one rank: streams [T, n*H] bf16 -> the next streams.

    `all_reduce(partial, point)` is called at point 1 (attention) and 2 (MoE) and returns the
    reduced sum; None means TP1. A KDA layer takes a `KdaState`, a sparse-attention layer an
    `MlaState` (updated in place).
    """
    reduce = all_reduce or (lambda p, point: p)
    x, comb, post = hc_pre(streams, weights["hc_attn_fn"], weights["hc_attn_scale"], weights["hc_attn_base"], s)
    x = rms_norm(x, weights["input_layernorm.weight"], s.rms_eps)
    streams = hc_post(reduce(_attention(x, weights, state, inp, s), 1), streams, post, comb)
    x, comb, post = hc_pre(streams, weights["hc_ffn_fn"], weights["hc_ffn_scale"], weights["hc_ffn_base"], s)
    x = rms_norm(x, weights["post_attention_layernorm.weight"], s.rms_eps)
    return hc_post(reduce(moe(x, weights, s, act_format), 2), streams, post, comb)


def decoder_layer_tp(
    streams: torch.Tensor,
    rank_weights: Sequence[W],
    rank_states: Sequence[KdaState | MlaState],
    inp: DecodeInputs,
    shapes: Sequence[FlashShape],
    act_format: str = "bf16",
) -> torch.Tensor:
    """Every rank of a TP group, stage by stage, joined at the two all-reduce points
    (`all_reduce_sum` of the ranks' partials). The mHC parameters, norms, router and indexer
    are replicated, so what runs outside the sharded stages is rank 0's and equals every
    rank's; each rank's sharded stages read its own weights and state."""
    w0, s0 = rank_weights[0], shapes[0]
    ranks = list(zip(rank_weights, rank_states, shapes, strict=True))
    x, comb, post = hc_pre(streams, w0["hc_attn_fn"], w0["hc_attn_scale"], w0["hc_attn_base"], s0)
    x = rms_norm(x, w0["input_layernorm.weight"], s0.rms_eps)
    attn = all_reduce_sum([_attention(x, w, st, inp, s) for w, st, s in ranks])
    streams = hc_post(attn, streams, post, comb)
    x, comb, post = hc_pre(streams, w0["hc_ffn_fn"], w0["hc_ffn_scale"], w0["hc_ffn_base"], s0)
    x = rms_norm(x, w0["post_attention_layernorm.weight"], s0.rms_eps)
    ffn = all_reduce_sum([moe(x, w, s, act_format) for w, _, s in ranks])
    return hc_post(ffn, streams, post, comb)
