"""Random GLM-5.3 layer weights and decode caches in the layouts SGLang 0.5.23 leaves after load.

Weights (`make_weights`, fresh random per call unless a seed is given, never zeros): a dict
keyed by SGLang's parameter names under the decoder layer, one TP rank's shard. On CUDA the
FP8 weights are row-major e4m3 with fp32 `weight_scale_inv` [ceil(N/b), ceil(K/b)]: on sm_90
`process_weights_after_loading_block_quant` keeps the checkpoint layout (the UE8M0 scale
requantisation for DeepGEMM is Blackwell-only, `DEEPGEMM_SCALE_UE8M0`).

| key | dtype | shape (per rank) |
|---|---|---|
| input_layernorm.weight, post_attention_layernorm.weight | bf16 | [H] |
| self_attn.fused_qkv_a_proj_with_mqa.weight (+ .weight_scale_inv) | e4m3 (fp32) | [q_lora+kv_lora+rope, H] |
| self_attn.q_a_layernorm.weight | bf16 | [q_lora] |
| self_attn.kv_a_layernorm.weight | bf16 | [kv_lora] |
| self_attn.q_b_proj.weight (+ scale) | e4m3 | [H_l*(nope+rope), q_lora] |
| self_attn.kv_b_proj.weight | bf16 | [H_l*(nope+v), kv_lora] (GLM ships it bf16) |
| self_attn.w_kc | bf16 | [H_l, nope, kv_lora], strides of a [H_l, kv_lora, nope] buffer |
| self_attn.w_vc | bf16 | [H_l, kv_lora, v], strides of a [H_l, v, kv_lora] buffer |
| self_attn.o_proj.weight (+ scale) | e4m3 | [H, H_l*v] |
| self_attn.indexer.wq_b.weight (+ scale) | e4m3 | [ih*D, q_lora] |
| self_attn.indexer.wk.weight (+ scale) | e4m3 | [D, H] (unfused path) |
| self_attn.indexer.weights_proj.weight | bf16 | [ih, H] (unfused path) |
| self_attn.indexer.wk_weights_proj.weight | bf16 | [D+ih, H] (fused path: dequant(wk) over weights_proj) |
| self_attn.indexer.k_norm.weight, .bias | fp32 | [D] |
| mlp.gate.weight | bf16 | [E, H] |
| mlp.gate.e_score_correction_bias | fp32 | [E] |
| mlp.experts.w13_weight (+ _scale_inv) | e4m3 (fp32) | [E, 2*I_l, H] ([E, 2I_l/b, H/b]) gate rows then up rows |
| mlp.experts.w2_weight (+ _scale_inv) | e4m3 (fp32) | [E, H, I_l] ([E, H/b, I_l/b]) |
| mlp.shared_experts.gate_up_proj.weight (+ scale) | e4m3 | [2*Is_l, H] |
| mlp.shared_experts.down_proj.weight (+ scale) | e4m3 | [H, Is_l] |

`w_kc`/`w_vc` are built from `kv_b_proj` as `DeepseekV2WeightLoaderMixin.post_load_weights`
does (unflatten per head, split nope|v, the same transposed-contiguous strides).

On ROCm, SGLang's AITER FP8 paths keep weights in AITER's (16, 16) shuffle
(`aiter.ops.shuffle.shuffle_weight`); `aiter_layout(weights)` returns that view of every FP8
GEMM weight (scales unchanged) and `shuffle_weight_16x16` is the permutation itself.

Caches (`make_caches`): the bf16 MLA cache [slots, 1, 576], the paged FP8 index-K cache
uint8 [pages, 64*(128+4)] (per page: 64 keys of 128 B, then 64 fp32 scales), and the
`req_to_token` page table, for `batch` requests of `context_len` tokens each (the last one
being the token decoded now). Page 0 is the padding page SGLang reserves; each request's
pages are a random permutation of the rest, so logical and physical order differ.
"""

from __future__ import annotations

import os

import torch

from mono_common.ref.fp8 import block_dequant, block_quant, index_k_quant

from .config import GlmLayerShape
from .reference import DecodeInputs, LayerCaches

__all__ = [
    "make_weights",
    "shard_weights",
    "derive_absorbed",
    "make_caches",
    "shuffle_weight_16x16",
    "aiter_layout",
    "weight_bytes",
    "FP8_GEMM_WEIGHTS",
]

BF16 = torch.bfloat16

#: Keys of the FP8 GEMM weights (each has a `<key>_scale_inv` or `.weight_scale_inv` twin).
FP8_GEMM_WEIGHTS = (
    "self_attn.fused_qkv_a_proj_with_mqa.weight",
    "self_attn.q_b_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.indexer.wq_b.weight",
    "self_attn.indexer.wk.weight",
    "mlp.experts.w13_weight",
    "mlp.experts.w2_weight",
    "mlp.shared_experts.gate_up_proj.weight",
    "mlp.shared_experts.down_proj.weight",
)


def scale_key(key: str) -> str:
    return key + "_scale_inv" if key.startswith("mlp.experts.") else key + "_scale_inv"


def _gen(seed: int | None, device) -> torch.Generator | None:
    if torch.device(device).type == "meta":  # shapes only (byte counts)
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1) if seed is None else seed)
    return g


def _randn(shape, g, device, std=1.0, dtype=torch.float32):
    return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * std).to(dtype)


def _fp8_weight(shape, g, device, block, chunk=8):
    """Random [..., N, K] weight ~ N(0, 1/K), block-quantised (experts quantised in chunks to
    bound the fp32 temporary)."""
    *lead, n, k = shape
    std = k**-0.5
    if not lead:
        return block_quant(_randn((n, k), g, device, std), block)
    e = lead[0]
    qs, ss = [], []
    for i in range(0, e, chunk):
        q, sc = block_quant(_randn((min(chunk, e - i), n, k), g, device, std), block)
        qs.append(q)
        ss.append(sc)
    return torch.cat(qs), torch.cat(ss)


def derive_absorbed(kv_b: torch.Tensor, s: GlmLayerShape) -> tuple[torch.Tensor, torch.Tensor]:
    """`post_load_weights`: kv_b_proj [H_l*(nope+v), kv_lora] -> (w_kc, w_vc) with SGLang's strides."""
    wk, wv = kv_b.unflatten(0, (-1, s.qk_nope + s.v_head)).split([s.qk_nope, s.v_head], dim=1)
    w_kc = wk.transpose(1, 2).contiguous().transpose(1, 2)
    w_vc = wv.contiguous().transpose(1, 2)
    return w_kc, w_vc


def make_weights(s: GlmLayerShape, device="cpu", seed: int | None = None) -> dict[str, torch.Tensor]:
    """Random weights of one MoE layer for rank `s.tp_rank` of `s.tp_size`, generated on
        `device` (generate the real TP1 layer on the GPU: ~10 GB of experts). Every tensor is
        random (norm weights around 1), so no path can pass by multiplying zeros. `device="meta"`
    gives the shapes only (byte counts)."""
    g = _gen(seed, device)
    b, h = s.block, s.hidden
    hl, il, isl = s.heads_per_rank, s.moe_inter_per_rank, s.shared_inter_per_rank
    w: dict[str, torch.Tensor] = {}

    def norm(n):
        return (1.0 + _randn((n,), g, device, 0.1)).to(BF16)

    def fp8(key, shape):
        q, sc = _fp8_weight(shape, g, device, b)
        w[key] = q
        w[scale_key(key)] = sc

    w["input_layernorm.weight"] = norm(h)
    w["post_attention_layernorm.weight"] = norm(h)
    fp8("self_attn.fused_qkv_a_proj_with_mqa.weight", (s.qkv_a_out, h))
    w["self_attn.q_a_layernorm.weight"] = norm(s.q_lora)
    w["self_attn.kv_a_layernorm.weight"] = norm(s.kv_lora)
    fp8("self_attn.q_b_proj.weight", (hl * s.qk_head, s.q_lora))
    kv_b = _randn((hl * (s.qk_nope + s.v_head), s.kv_lora), g, device, s.kv_lora**-0.5, BF16)
    w["self_attn.kv_b_proj.weight"] = kv_b
    w["self_attn.w_kc"], w["self_attn.w_vc"] = derive_absorbed(kv_b, s)
    fp8("self_attn.o_proj.weight", (h, hl * s.v_head))
    fp8("self_attn.indexer.wq_b.weight", (s.index_heads * s.index_head_dim, s.q_lora))
    fp8("self_attn.indexer.wk.weight", (s.index_head_dim, h))
    w["self_attn.indexer.weights_proj.weight"] = _randn((s.index_heads, h), g, device, h**-0.5, BF16)
    w["self_attn.indexer.wk_weights_proj.weight"] = _fused_wk(w, s)
    w["self_attn.indexer.k_norm.weight"] = 1.0 + _randn((s.index_head_dim,), g, device, 0.1)
    w["self_attn.indexer.k_norm.bias"] = _randn((s.index_head_dim,), g, device, 0.1)
    w["mlp.gate.weight"] = _randn((s.n_experts, h), g, device, h**-0.5, BF16)
    w["mlp.gate.e_score_correction_bias"] = _randn((s.n_experts,), g, device, 0.05)
    fp8("mlp.experts.w13_weight", (s.n_experts, 2 * il, h))
    fp8("mlp.experts.w2_weight", (s.n_experts, h, il))
    if s.n_shared:
        fp8("mlp.shared_experts.gate_up_proj.weight", (2 * isl, h))
        fp8("mlp.shared_experts.down_proj.weight", (h, isl))
    return w


def _fused_wk(w, s):
    """`_load_fused_indexer_wk`: bf16 [dequant(wk); weights_proj] (CUDA fused indexer path)."""
    wk = block_dequant(w["self_attn.indexer.wk.weight"], w["self_attn.indexer.wk.weight_scale_inv"], s.block, BF16)
    return torch.cat((wk, w["self_attn.indexer.weights_proj.weight"]), 0).contiguous()


def shard_weights(
    full: dict[str, torch.Tensor], s_full: GlmLayerShape, tp_size: int, tp_rank: int
) -> tuple[GlmLayerShape, dict[str, torch.Tensor]]:
    """Cut a TP1 weight dict into rank `tp_rank`'s shard as SGLang's loaders do: column-parallel
    q_b/kv_b/gate_up (whole heads / intermediate rows), row-parallel o_proj/down (columns),
    everything else replicated. Block scales are cut along whole blocks."""
    s = s_full.tp_shard(tp_size, tp_rank)
    b = s.block
    out = dict(full)

    def rows(t, lo, n):
        return t[..., lo : lo + n, :].contiguous()

    def cols(t, lo, n):
        return t[..., lo : lo + n].contiguous()

    hl = s.heads_per_rank
    qk = hl * s.qk_head
    k = "self_attn.q_b_proj.weight"
    out[k] = rows(full[k], tp_rank * qk, qk)
    out[k + "_scale_inv"] = rows(full[k + "_scale_inv"], tp_rank * qk // b, qk // b)
    kvr = hl * (s.qk_nope + s.v_head)
    kv_b = rows(full["self_attn.kv_b_proj.weight"], tp_rank * kvr, kvr)
    out["self_attn.kv_b_proj.weight"] = kv_b
    out["self_attn.w_kc"], out["self_attn.w_vc"] = derive_absorbed(kv_b, s)
    oc = hl * s.v_head
    k = "self_attn.o_proj.weight"
    out[k] = cols(full[k], tp_rank * oc, oc)
    out[k + "_scale_inv"] = cols(full[k + "_scale_inv"], tp_rank * oc // b, oc // b)

    def gate_up(key, inter, inter_l):
        t, sc = full[key], full[scale_key(key)]
        lo = tp_rank * inter_l
        out[key] = torch.cat((rows(t, lo, inter_l), rows(t, inter + lo, inter_l)), dim=-2)
        out[scale_key(key)] = torch.cat(
            (rows(sc, lo // b, inter_l // b), rows(sc, (inter + lo) // b, inter_l // b)), dim=-2
        )

    def down(key, inter_l):
        lo = tp_rank * inter_l
        out[key] = cols(full[key], lo, inter_l)
        out[scale_key(key)] = cols(full[scale_key(key)], lo // b, inter_l // b)

    gate_up("mlp.experts.w13_weight", s.moe_inter, s.moe_inter_per_rank)
    down("mlp.experts.w2_weight", s.moe_inter_per_rank)
    if s.n_shared:
        gate_up("mlp.shared_experts.gate_up_proj.weight", s.shared_inter, s.shared_inter_per_rank)
        down("mlp.shared_experts.down_proj.weight", s.shared_inter_per_rank)
    return s, out


# ---- ROCm / AITER layout ------------------------------------------------------------------
def shuffle_weight_16x16(x: torch.Tensor) -> torch.Tensor:
    """AITER's (16, 16) weight shuffle for 1-byte elements (e4m3): view [..., N, K] as
    [..., N/16, 16, K/32, 2, 16] and store it in (N/16, K/32, 2, 16(n), 16(k)) order, the
    layout `aiter.ops.shuffle.shuffle_weight(x, layout=(16, 16))` returns. Same shape and
    dtype as x; requires N % 16 == 0 and K % 32 == 0."""
    *lead, n, k = x.shape
    if n % 16 or k % 32:
        raise ValueError(f"(16, 16) shuffle needs N % 16 == 0 and K % 32 == 0, got {n}x{k}")
    elem = x.element_size()
    kk = 16 // elem
    u = x.reshape(-1, n // 16, 16, k // 32, 32 // kk, kk)
    return u.permute(0, 1, 3, 4, 2, 5).contiguous().view(*x.shape)


def aiter_layout(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weight dict as SGLang's ROCm AITER FP8 paths hold it: every FP8 GEMM weight in the
    (16, 16) shuffle (fused MoE w13/w2 and the B-preshuffled block linears), the rest as is."""
    out = dict(weights)
    for k in FP8_GEMM_WEIGHTS:
        if k in out:
            out[k] = shuffle_weight_16x16(out[k])
    return out


# ---- caches ---------------------------------------------------------------------------------
def make_caches(
    s: GlmLayerShape,
    batch: int,
    context_len: int,
    device="cpu",
    seed: int | None = None,
    index_k: bool = True,
) -> tuple[DecodeInputs, LayerCaches]:
    """Caches and page table for `batch` requests that each hold `context_len` tokens, the
    last of which is decoded now (position context_len - 1, its slot = `out_cache_loc`).
    Earlier tokens' cache entries are random (kv ~ N(0, 1) bf16; index keys ~ N(0, 1)
    quantised as SGLang stores them)."""
    g = _gen(seed, device)
    p = s.page
    ppr = -(-context_len // p)  # pages per request
    n_pages = 1 + batch * ppr  # page 0: SGLang's padding page
    perm = torch.randperm(n_pages - 1, generator=g, device=device) + 1
    pages = perm.view(batch, ppr).long()
    offs = torch.arange(p, device=device)
    req_to_token = (pages[:, :, None] * p + offs).reshape(batch, ppr * p).to(torch.int32)
    pos = torch.full((batch,), context_len - 1, dtype=torch.int64, device=device)
    inputs = DecodeInputs(
        positions=pos,
        seq_lens=torch.full((batch,), context_len, dtype=torch.int32, device=device),
        req_pool_indices=torch.arange(batch, dtype=torch.int64, device=device),
        out_cache_loc=req_to_token[:, context_len - 1].long(),
        req_to_token=req_to_token,
        max_seq_len=ppr * p,
    )
    slots = n_pages * p
    kv = _randn((slots, 1, s.kv_cache_dim), g, device, 1.0, BF16)
    ik = None
    if index_k:
        d = s.index_head_dim
        ik = torch.empty((n_pages, p * (d + 4)), dtype=torch.uint8, device=device)
        chunk = max(1, (1 << 24) // (p * d))  # pages per fill step (bounded fp32 temporary)
        for lo in range(0, n_pages, chunk):
            hi = min(n_pages, lo + chunk)
            q, sc = index_k_quant(_randn(((hi - lo) * p, d), g, device))
            ik[lo:hi, : p * d] = q.view(torch.uint8).view(hi - lo, p * d)
            ik[lo:hi, p * d :] = sc.view(torch.uint8).view(hi - lo, p * 4)
    return inputs, LayerCaches(kv=kv, index_k=ik)


def weight_bytes(w: dict[str, torch.Tensor], s: GlmLayerShape, experts_read: int) -> int:
    """Bytes one decode step must read from this rank's weights: every non-expert tensor the
    path uses once (the indexer's wk/weights_proj or their fused bf16 copy, not both; w_kc/w_vc
    and not kv_b_proj, which the decode never reads), plus `experts_read` routed experts."""
    skip = {"self_attn.kv_b_proj.weight"}
    if s.indexer_fused:
        skip |= {
            "self_attn.indexer.wk.weight",
            "self_attn.indexer.wk.weight_scale_inv",
            "self_attn.indexer.weights_proj.weight",
        }
    else:
        skip.add("self_attn.indexer.wk_weights_proj.weight")
    total = 0
    for k, t in w.items():
        if k in skip:
            continue
        nbytes = t.numel() * t.element_size()
        if k.startswith("mlp.experts."):
            nbytes = nbytes // s.n_experts * experts_read
        total += nbytes
    return total
