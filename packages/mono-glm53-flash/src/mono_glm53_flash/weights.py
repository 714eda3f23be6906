"""Random GLM-5.3-Flash layer weights and decode state in the layouts SGLang 0.5.23 leaves after
loading, on CUDA and on ROCm, for any TP rank.

Weights. `make_weights(s, kind)` builds one whole layer (TP1) of kind "kda" or "mla", fresh
random (never zeros), keyed by SGLang's parameter names under the decoder layer;
`shard_weights(whole, s.tp_shard(tp, r))` cuts rank r's part the way SGLang's weight loaders
do (column-parallel rows, row-parallel columns, q|k|v and gate|up sections cut one by one,
replicated parameters copied). The checkpoint layout assumed (GLM-5.3-Flash's own is not
available here): FP8 e4m3 block-128 for the MLA/indexer linears, the KDA qkv and o
projections and the shared expert; bf16 for the KDA beta/forget/output-gate projections
(SGLang fuses them when unquantised) and kv_b_proj; MXFP4 routed experts (the mixed
FP8/MXFP4 checkpoint, `quantization_config.routed_experts_quant_method == "mxfp4"`).

| key | dtype | shape (one rank) |
|---|---|---|
| hc_attn_fn, hc_ffn_fn / *_base / *_scale | fp32 | [24, 4H] / [24] / [3] |
| input_layernorm.weight, post_attention_layernorm.weight | bf16 | [H] |
| KDA self_attn.qkv_proj.weight (+ .weight_scale_inv) | e4m3 (fp32) | [3 P_l, H], rows q_l, k_l, v_l |
| KDA self_attn.b_proj.weight | bf16 | [Hk_l, H] |
| KDA self_attn.f_a_proj.weight, g_a_proj.weight (replicated) | bf16 | [D, H] |
| KDA self_attn.f_b_proj.weight, g_b_proj.weight | bf16 | [P_l, D] |
| KDA self_attn.dt_bias / A_log | fp32 | [P_l] / [1, 1, Hk_l, 1] |
| KDA self_attn.qkv_conv1d.weight | fp32 | [3 P_l, 1, 4] |
| KDA self_attn.o_norm.weight | bf16 | [D] |
| KDA self_attn.o_proj.weight (+ scale) | e4m3 | [H, P_l] |
| MLA self_attn.fused_qkv_a_proj_with_mqa.weight (+ scale) | e4m3 | [q_lora + kv_lora, H] |
| MLA self_attn.q_a_layernorm.weight / kv_a_layernorm.weight | bf16 | [q_lora] / [kv_lora] |
| MLA self_attn.q_b_proj.weight (+ scale) | e4m3 | [H_l * 256, q_lora] |
| MLA self_attn.kv_b_proj.weight | bf16 | [H_l * (256 + 256), kv_lora] |
| MLA self_attn.w_kc / w_vc | bf16 | [H_l, 256, kv_lora] / [H_l, kv_lora, 256] (post_load_weights strides) |
| MLA self_attn.o_proj.weight (+ scale) | e4m3 | [H, H_l * 256] |
| MLA self_attn.indexer.wq_b.weight / wk.weight (+ scale) | e4m3 | [ih * D, q_lora] / [D, H] |
| MLA self_attn.indexer.weights_proj.weight | fp32 | [ih, H] |
| MLA self_attn.indexer.k_norm.weight / .bias | fp32 | [D] |
| MLA self_attn.indexer.index_kpool_compress_ape / _gate | fp32 / bf16 | [kpool, D] / [D, H] |
| mlp.gate.weight / e_score_correction_bias | bf16 / fp32 | [E, H] / [E] |
| mlp.experts.w13_weight (+ _scale_inv) | int8 (fp32) | [E, 2 I_l, H/2] ([E, 2 I_l, H/32]) gate rows then up |
| mlp.experts.w2_weight (+ _scale_inv) | int8 (fp32) | [E, H, I_l/2] ([E, H, I_l/32]) |
| mlp.shared_experts.gate_up_proj.weight / down_proj.weight (+ scale) | e4m3 | [2 Is_l, H] / [H, Is_l] |

CUDA (`backend="cuda"`) is the table: row-major e4m3fn with fp32 block scales (sm_90 keeps
the checkpoint layout: the UE8M0 requantisation is for Blackwell DeepGEMM), packed MXFP4 as
int8 (two e2m1 a byte, the even element low) with fp32 power-of-two scales
(`Fp8MoEMethod.create_weights`: fp4 scales are fp32 unless AITER/XPU). `rocm_layout`
gives what SGLang's AITER paths hold on gfx950: every FP8 GEMM weight and the packed
MXFP4 experts in AITER's (16, 16) shuffle (`aiter.ops.shuffle.shuffle_weight`; MXFP4 as
`float4_e2m1fn_x2`), MXFP4 scales as float8_e8m0fnu. SGLang 0.5.23 also passes the MXFP4
scales through aiter's `shuffle_scale`, which the pinned amd-aiter wheel does not ship: the
scales here stay row-major, and the kernel's ROCm reader of them is unverified.

State. `make_kda_state` is one KDA layer's MambaPool slice: conv [slots + 1, 3, 3 P_l] bf16
(the last K-1 conv inputs, oldest first) and temporal [slots + 1, Hk_l, 128, 128] fp32,
indexed by the request's mamba slot (`mamba_cache_indices`; the pool has one spare slot).
`make_mla_state` is one sparse-attention layer's part of the hybrid KV pool: the bf16 MLA
cache [slots + page, 1, 512], the index-K pages uint8 [pages, 64 * 132] (64 pooled fp8 keys
of 128 B, then their 64 fp32 scales; AITER's tile order when `preshuffle_tile`), the
compress tails [reqs + 1, kpool + extra, 128] bf16 (key and score), the `req_to_token`
table (256-token pages, page 0 reserved, each request's pages a random permutation) and the
step's `DecodeInputs`. `FlashModel.pool_index` maps a global layer id to its pool index.
"""

from __future__ import annotations

import copy

import torch

from .config import FlashShape
from .quant import FP8, block_quant, e8m0_encode, mxfp4_dequant, mxfp4_quant
from .reference import DecodeInputs, KdaState, MlaState, write_index_key

__all__ = [
    "SGLANG_READS",
    "make_weights",
    "shard_weights",
    "rocm_layout",
    "shuffle_weight_16x16",
    "make_kda_state",
    "shard_kda_state",
    "make_mla_state",
    "make_mamba_pool",
    "FP8_GEMM_WEIGHTS",
    "MXFP4_WEIGHTS",
]

BF16 = torch.bfloat16

#: The SGLang 0.5.23 names whose layouts this module reproduces.
SGLANG_READS: tuple[str, ...] = (
    "sglang.srt.models.glm5_next.Glm5NextForConditionalGeneration.load_weights",
    "sglang.srt.models.glm5_next.Glm5NextLinearAttention",
    "sglang.srt.models.deepseek_common.deepseek_weight_loader.DeepseekV2WeightLoaderMixin.post_load_weights",
    "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.create_weights",
    "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.process_weights_after_loading_block_quant",
    "sglang.srt.layers.linear.QKVParallelLinear",
    "sglang.srt.layers.linear.MergedColumnParallelLinear",
    "sglang.srt.layers.linear.RowParallelLinear",
    "sglang.srt.mem_cache.memory_pool.MambaPool",
    "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.mamba2_layer_cache",
    "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool.get_compress_tail_buffers",
    "sglang.srt.mem_cache.memory_pool.MLATokenToKVPool",
    "sglang.srt.layers.attention.dsa.kpool_fp8_index._kpool_cache_k_offsets",
    "sglang.srt.layers.attention.dsa.utils.INDEXER_K_CACHE_PRESHUFFLE_TILE",
)

#: FP8 GEMM weights (each with a `.weight_scale_inv` twin) of the two layer kinds.
FP8_GEMM_WEIGHTS = (
    "self_attn.qkv_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.fused_qkv_a_proj_with_mqa.weight",
    "self_attn.q_b_proj.weight",
    "self_attn.indexer.wq_b.weight",
    "self_attn.indexer.wk.weight",
    "mlp.shared_experts.gate_up_proj.weight",
    "mlp.shared_experts.down_proj.weight",
)
MXFP4_WEIGHTS = ("mlp.experts.w13_weight", "mlp.experts.w2_weight")


def _gen(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(torch.randint(0, 2**31, (1,))) if seed is None else seed)
    return g


def _randn(g: torch.Generator, *shape: int, std: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * std


def _fp8(out: dict, name: str, w: torch.Tensor, block: int) -> None:
    q, s = block_quant(w, block)
    out[f"{name}.weight"], out[f"{name}.weight_scale_inv"] = q, s


# ---- whole-layer weights ---------------------------------------------------------------------
def _common(g: torch.Generator, s: FlashShape) -> dict[str, torch.Tensor]:
    w: dict[str, torch.Tensor] = {}
    for side in ("attn", "ffn"):
        # mixes of unit-RMS streams ~ N(0, 1): Sinkhorn and the sigmoids stay unsaturated
        w[f"hc_{side}_fn"] = _randn(g, s.mix_hc, s.hc_dim, std=s.hc_dim**-0.5)
        w[f"hc_{side}_base"] = _randn(g, s.mix_hc, std=0.5)
        w[f"hc_{side}_scale"] = 0.5 + torch.rand(3, generator=g)
    w["input_layernorm.weight"] = (1 + _randn(g, s.hidden, std=0.1)).to(BF16)
    w["post_attention_layernorm.weight"] = (1 + _randn(g, s.hidden, std=0.1)).to(BF16)
    # MoE: router, MXFP4 routed experts, FP8 shared expert
    e, i, h = s.n_experts, s.moe_inter, s.hidden
    w["mlp.gate.weight"] = _randn(g, e, h, std=h**-0.5).to(BF16)
    w["mlp.gate.e_score_correction_bias"] = _randn(g, e, std=0.1)
    w13, s13 = mxfp4_quant(_randn(g, e, 2 * i, h, std=h**-0.5), s.mx_group)
    w2, s2 = mxfp4_quant(_randn(g, e, h, i, std=i**-0.5), s.mx_group)
    w["mlp.experts.w13_weight"], w["mlp.experts.w13_weight_scale_inv"] = w13.view(torch.int8), s13
    w["mlp.experts.w2_weight"], w["mlp.experts.w2_weight_scale_inv"] = w2.view(torch.int8), s2
    _fp8(w, "mlp.shared_experts.gate_up_proj", _randn(g, 2 * s.shared_inter, h, std=h**-0.5), s.block)
    _fp8(w, "mlp.shared_experts.down_proj", _randn(g, h, s.shared_inter, std=s.shared_inter**-0.5), s.block)
    return w


def _kda(g: torch.Generator, s: FlashShape) -> dict[str, torch.Tensor]:
    w: dict[str, torch.Tensor] = {}
    h, p, d, nh = s.hidden, s.kda_proj, s.kda_head_dim, s.kda_heads
    _fp8(w, "self_attn.qkv_proj", _randn(g, 3 * p, h, std=h**-0.5), s.block)
    w["self_attn.b_proj.weight"] = _randn(g, nh, h, std=h**-0.5).to(BF16)
    w["self_attn.f_a_proj.weight"] = _randn(g, d, h, std=h**-0.5).to(BF16)
    w["self_attn.f_b_proj.weight"] = _randn(g, p, d, std=d**-0.5).to(BF16)
    w["self_attn.g_a_proj.weight"] = _randn(g, d, h, std=h**-0.5).to(BF16)
    w["self_attn.g_b_proj.weight"] = _randn(g, p, d, std=d**-0.5).to(BF16)
    w["self_attn.dt_bias"] = _randn(g, p, std=0.5)
    # A = exp(A_log) in [1, 16], as Mamba/KDA initialise it
    w["self_attn.A_log"] = torch.log(1 + 15 * torch.rand(1, 1, nh, 1, generator=g))
    w["self_attn.qkv_conv1d.weight"] = _randn(g, 3 * p, 1, s.conv_kernel, std=0.5)
    w["self_attn.o_norm.weight"] = (1 + _randn(g, d, std=0.1)).to(BF16)
    _fp8(w, "self_attn.o_proj", _randn(g, h, p, std=p**-0.5), s.block)
    return w


def derive_absorbed(kv_b: torch.Tensor, s: FlashShape) -> tuple[torch.Tensor, torch.Tensor]:
    """w_kc, w_vc from kv_b_proj as `DeepseekV2WeightLoaderMixin.post_load_weights` leaves them
    (values [H_l, nope, kv_lora] / [H_l, kv_lora, v], strides of the transposed buffers)."""
    w_kc, w_vc = kv_b.unflatten(0, (-1, s.qk_nope + s.v_head)).split([s.qk_nope, s.v_head], dim=1)
    return w_kc.transpose(1, 2).contiguous().transpose(1, 2), w_vc.contiguous().transpose(1, 2)


def _mla(g: torch.Generator, s: FlashShape) -> dict[str, torch.Tensor]:
    w: dict[str, torch.Tensor] = {}
    h, ih, d = s.hidden, s.index_heads, s.index_head_dim
    _fp8(w, "self_attn.fused_qkv_a_proj_with_mqa", _randn(g, s.qkv_a_out, h, std=h**-0.5), s.block)
    w["self_attn.q_a_layernorm.weight"] = (1 + _randn(g, s.q_lora, std=0.1)).to(BF16)
    w["self_attn.kv_a_layernorm.weight"] = (1 + _randn(g, s.kv_lora, std=0.1)).to(BF16)
    _fp8(w, "self_attn.q_b_proj", _randn(g, s.heads * s.qk_head, s.q_lora, std=s.q_lora**-0.5), s.block)
    kv_b = _randn(g, s.heads * (s.qk_nope + s.v_head), s.kv_lora, std=s.kv_lora**-0.5).to(BF16)
    w["self_attn.kv_b_proj.weight"] = kv_b
    w["self_attn.w_kc"], w["self_attn.w_vc"] = derive_absorbed(kv_b, s)
    _fp8(w, "self_attn.o_proj", _randn(g, h, s.heads * s.v_head, std=(s.heads * s.v_head) ** -0.5), s.block)
    _fp8(w, "self_attn.indexer.wq_b", _randn(g, ih * d, s.q_lora, std=s.q_lora**-0.5), s.block)
    _fp8(w, "self_attn.indexer.wk", _randn(g, d, h, std=h**-0.5), s.block)
    w["self_attn.indexer.weights_proj.weight"] = _randn(g, ih, h, std=h**-0.5)
    w["self_attn.indexer.k_norm.weight"] = 1 + _randn(g, d, std=0.1)
    w["self_attn.indexer.k_norm.bias"] = _randn(g, d, std=0.1)
    w["self_attn.indexer.index_kpool_compress_ape"] = _randn(g, s.index_kpool, d, std=0.5)
    w["self_attn.indexer.index_kpool_compress_gate"] = _randn(g, d, h, std=h**-0.5).to(BF16)
    return w


def make_weights(s: FlashShape, kind: str, seed: int | None = None) -> dict[str, torch.Tensor]:
    """One whole layer (s must be TP1) of kind "kda" or "mla", CUDA layout."""
    if s.tp_size != 1:
        raise ValueError("make_weights builds the whole layer: pass s.whole, then shard_weights")
    g = _gen(seed)
    layer = {"kda": _kda, "mla": _mla}[kind](g, s)
    return {**layer, **_common(g, s)}


# ---- TP sharding -----------------------------------------------------------------------------
def _cut(t: torch.Tensor, dim: int, sections: list[int], tp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s piece of each section of `t` along `dim`, concatenated."""
    parts, start = [], 0
    for size in sections:
        piece = size // tp
        parts.append(t.narrow(dim, start + rank * piece, piece))
        start += size
    return torch.cat(parts, dim=dim).contiguous()


def shard_weights(whole: dict[str, torch.Tensor], s: FlashShape) -> dict[str, torch.Tensor]:
    """Rank s.tp_rank of s.tp_size's weights, as SGLang's loaders cut them (see module doc)."""
    tp, r, b, grp = s.tp_size, s.tp_rank, s.block, s.mx_group
    w = s.whole
    out: dict[str, torch.Tensor] = {}

    def rows(name: str, sections: list[int], fp8: bool = False) -> None:
        out[name] = _cut(whole[name], 0, sections, tp, r)
        if fp8:
            sc = name.replace(".weight", ".weight_scale_inv")
            out[sc] = _cut(whole[sc], 0, [x // b for x in sections], tp, r)

    def cols(name: str, size: int, fp8: bool = False) -> None:
        out[name] = _cut(whole[name], 1, [size], tp, r)
        if fp8:
            sc = name.replace(".weight", ".weight_scale_inv")
            out[sc] = _cut(whole[sc], 1, [size // b], tp, r)

    for name, t in whole.items():
        out[name] = t  # replicated unless cut below
    if "self_attn.qkv_proj.weight" in whole:  # KDA
        p = w.kda_proj
        rows("self_attn.qkv_proj.weight", [p, p, p], fp8=True)
        rows("self_attn.b_proj.weight", [w.kda_heads])
        rows("self_attn.f_b_proj.weight", [p])
        rows("self_attn.g_b_proj.weight", [p])
        rows("self_attn.dt_bias", [p])
        out["self_attn.A_log"] = _cut(whole["self_attn.A_log"], 2, [w.kda_heads], tp, r)
        rows("self_attn.qkv_conv1d.weight", [p, p, p])
        cols("self_attn.o_proj.weight", p, fp8=True)
    else:  # sparse MLA; the indexer is replicated
        rows("self_attn.q_b_proj.weight", [w.heads * w.qk_head], fp8=True)
        rows("self_attn.kv_b_proj.weight", [w.heads * (w.qk_nope + w.v_head)])
        out["self_attn.w_kc"], out["self_attn.w_vc"] = derive_absorbed(out["self_attn.kv_b_proj.weight"], s)
        cols("self_attn.o_proj.weight", w.heads * w.v_head, fp8=True)
    i = w.moe_inter
    out["mlp.experts.w13_weight"] = _cut(whole["mlp.experts.w13_weight"], 1, [i, i], tp, r)
    out["mlp.experts.w13_weight_scale_inv"] = _cut(whole["mlp.experts.w13_weight_scale_inv"], 1, [i, i], tp, r)
    out["mlp.experts.w2_weight"] = _cut(whole["mlp.experts.w2_weight"], 2, [i // 2], tp, r)
    out["mlp.experts.w2_weight_scale_inv"] = _cut(whole["mlp.experts.w2_weight_scale_inv"], 2, [i // grp], tp, r)
    si = w.shared_inter
    rows("mlp.shared_experts.gate_up_proj.weight", [si, si], fp8=True)
    cols("mlp.shared_experts.down_proj.weight", si, fp8=True)
    return out


# ---- ROCm ------------------------------------------------------------------------------------
def shuffle_weight_16x16(x: torch.Tensor) -> torch.Tensor:
    """AITER's (16, 16) weight shuffle of 1-byte elements (e4m3, or two packed e2m1): view
    [..., N, K] as [..., N/16, 16, K/32, 2, 16] and store it in (N/16, K/32, 2, 16(n), 16(k))
    order, what `aiter.ops.shuffle.shuffle_weight(x, layout=(16, 16))` returns. Same shape
    and dtype; needs N % 16 == 0 and K % 32 == 0 (bytes)."""
    *_, n, k = x.shape
    if n % 16 or k % 32:
        raise ValueError(f"(16, 16) shuffle needs N % 16 == 0 and K % 32 == 0 bytes, got {n}x{k}")
    u = x.view(torch.uint8).reshape(-1, n // 16, 16, k // 32, 2, 16)
    return u.permute(0, 1, 3, 4, 2, 5).contiguous().view(x.shape).view(x.dtype)


def rocm_layout(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weight dict as SGLang's gfx950 AITER paths hold it (see the module doc)."""
    out = dict(weights)
    for k in FP8_GEMM_WEIGHTS:
        if k in out:
            out[k] = shuffle_weight_16x16(out[k])
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    for k in MXFP4_WEIGHTS:
        packed = shuffle_weight_16x16(out[k].view(torch.uint8))
        out[k] = packed.view(fp4) if fp4 is not None else packed
        scale = out[k + "_scale_inv"]
        out[k + "_scale_inv"] = e8m0_encode(scale).view(torch.float8_e8m0fnu)
    return out


def cuda_experts_dequant(weights: dict[str, torch.Tensor], name: str, group: int = 32) -> torch.Tensor:
    """The fp32 values of a routed-expert weight in the CUDA layout (for tests and bounds)."""
    return mxfp4_dequant(weights[name], weights[name + "_scale_inv"], group)


# ---- decode state ----------------------------------------------------------------------------
def make_kda_state(s: FlashShape, n_slots: int, seed: int | None = None) -> KdaState:
    """One KDA layer's MambaPool slice for this rank, `n_slots` + 1 slots of random state."""
    g = _gen(seed)
    conv = _randn(g, n_slots + 1, s.conv_kernel - 1, s.conv_dim_per_rank).to(BF16)
    d = s.kda_head_dim
    ssm = _randn(g, n_slots + 1, s.kda_heads_per_rank, d, d, std=0.1)
    return KdaState(conv=conv, ssm=ssm)


def shard_kda_state(whole: KdaState, s: FlashShape) -> KdaState:
    """Rank s.tp_rank's part of a TP1 KdaState: the q|k|v conv channels and the heads it owns."""
    p = s.kda_proj
    conv = _cut(whole.conv, 2, [p, p, p], s.tp_size, s.tp_rank)
    ssm = _cut(whole.ssm, 1, [s.kda_heads], s.tp_size, s.tp_rank)
    return KdaState(conv=conv, ssm=ssm)


def make_mamba_pool(s: FlashShape, n_kda_layers: int, n_slots: int, seed: int | None = None) -> KdaState:
    """The whole MambaPool cache of this rank: conv [layers, slots + 1, K-1, 3 P_l] bf16 and
    temporal [layers, slots + 1, Hk_l, V, K] fp32; layer i is `FlashModel.pool_index`'s i."""
    states = [make_kda_state(s, n_slots, None if seed is None else seed + i) for i in range(n_kda_layers)]
    return KdaState(conv=torch.stack([x.conv for x in states]), ssm=torch.stack([x.ssm for x in states]))


def make_mla_state(
    s: FlashShape,
    seq_lens: list[int],
    seed: int | None = None,
    tail_extra: int = 0,
    preshuffle_tile: int = 0,
    mamba_slots: list[int] | None = None,
) -> tuple[DecodeInputs, MlaState]:
    """A decode step of len(seq_lens) requests, request r holding seq_lens[r] tokens of which the
    last is decoded now, with one sparse-attention layer's state: random MLA cache rows for
    every earlier token, random fp8 pooled keys (power-of-two scales) for every group the
    earlier tokens closed, random tail keys and scores. Request r uses req_pool_index r."""
    g = _gen(seed)
    p, kp, d = s.page, s.index_kpool, s.index_head_dim
    batch = len(seq_lens)
    ppr = max(-(-n // p) for n in seq_lens)  # pages a request
    n_pages = 1 + batch * ppr  # page 0: SGLang's padding page
    pages = (torch.randperm(n_pages - 1, generator=g) + 1).view(batch, ppr)
    req_to_token = (pages[:, :, None] * p + torch.arange(p)).reshape(batch, ppr * p).to(torch.int32)
    kv = _randn(g, n_pages * p + p, 1, s.kv_lora).to(BF16)
    index_k = torch.zeros(n_pages, s.index_page * s.index_k_token_bytes, dtype=torch.uint8)
    state = MlaState(
        kv=kv,
        index_k=index_k,
        tail_k=_randn(g, batch + 1, kp + tail_extra, d).to(BF16),
        tail_score=_randn(g, batch + 1, kp + tail_extra, d).to(BF16),
        preshuffle_tile=preshuffle_tile,
    )
    for r, n in enumerate(seq_lens):
        for grp in range((n - 1) // kp):  # groups the context before the new token closed
            token = grp * kp
            page = int(req_to_token[r, token]) // p
            k = _randn(g, d).clamp(-448, 448).to(FP8)
            scale = torch.exp2(torch.randint(-8, -3, (1,), generator=g).float())
            write_index_key(state, page, grp % s.index_page, k, scale, s)
    inp = DecodeInputs(
        positions=torch.tensor([n - 1 for n in seq_lens], dtype=torch.long),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        req_pool_indices=torch.arange(batch, dtype=torch.long),
        out_cache_loc=torch.tensor([int(req_to_token[r, n - 1]) for r, n in enumerate(seq_lens)], dtype=torch.long),
        req_to_token=req_to_token,
        mamba_slots=torch.tensor(mamba_slots if mamba_slots is not None else list(range(batch)), dtype=torch.long),
    )
    return inp, state


def clone_state(state: KdaState | MlaState) -> KdaState | MlaState:
    """A deep copy (states are updated in place by a step)."""
    return copy.deepcopy(state)
