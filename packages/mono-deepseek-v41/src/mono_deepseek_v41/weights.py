"""Random DeepSeek-V4.1 layer weights, caches and steps, in the layouts SGLang 0.5.23 loads.

`make_layer_weights(shape, layer_id)` gives one layer's parameters (TP1, fresh random unless
seeded, never zeros), keyed by SGLang's parameter names under `model.layers.{i}.` as
`remap_weight_name_to_dpsk_hf_format` produces them from the checkpoint's names
(`checkpoint_names`); `shard(weights, shape)` cuts rank `shape.tp_rank`'s copy as SGLang's
parallel linears load it.

| key | dtype | shape (TP1) |
|---|---|---|
| input_layernorm.weight, post_attention_layernorm.weight | bf16 | [H] |
| hc_attn_fn / hc_ffn_fn, _base, _scale | fp32 | [(2+m)m, mH], [(2+m)m], [3] |
| self_attn.wqkv_a.weight (+ .weight_scale_inv) | e4m3 (fp32) | [q_lora + D, H] (rows wq_a \\| wkv, fused at load) |
| self_attn.q_norm.weight / kv_norm.weight | bf16 | [q_lora] / [D] |
| self_attn.wq_b.weight (+ scale) | e4m3 | [heads * D, q_lora] (column parallel) |
| self_attn.wo_a.weight | bf16 | [groups * o_lora, heads * D / groups] (dequantized at load: 32x32 blocks) |
| self_attn.wo_b.weight (+ scale) | e4m3 | [H, groups * o_lora] (row parallel) |
| self_attn.attn_sink | fp32 | [heads] (not sharded: `_local_attn_sink` slices it) |
| self_attn.compressor.{wkv_gate.weight, ape, norm.weight} (C4/C128) | bf16, fp32, fp32 | [2c*D, H], [R, c*D] (hotfixed), [D] |
| self_attn.indexer.{wq_b, weights_proj, compressor.*} (C4) | e4m3, bf16, ... | [IH*ID, q_lora], [IH, H], head ID |
| self_attn.compressor.{wkv, wgate, norm}.weight (ratio 1/2 kv_source, sm_90) | bf16 | [D, H], [D, H], [D] |
| self_attn.indexer.{wq_b, weights_proj, wk, k_norm} (ratio 1/2 index source) | e4m3, bf16, bf16, bf16 | ..., [ID, D], [ID] |
| mlp.gate.weight, .e_score_correction_bias | bf16, fp32 | [E, H], [E] (hash layers: no bias) |
| mlp.topk.tid2eid (hash layers) | int32 | [vocab, top_k] |
| mlp.shared_experts.gate_up_proj.weight (+ scale), down_proj | e4m3 | [2*Is, H] (gate \\| up), [H, Is] |
| mlp.experts.w13_weight, w13_weight_scale_inv | int8, uint8 (e8m0) | [E, 2I, H/2] (gate \\| up), [E, 2I, H/32] |
| mlp.experts.w2_weight, w2_weight_scale_inv | int8, uint8 (e8m0) | [E, H, I/2], [E, H, I/32] |

This canonical form is what `reference.py` reads. What each runtime then does to it:
* CUDA sm_90 (`Mxfp4FlashinferCutlassMoEMethod`): w13 loaded [up | gate]
  (`load_up_proj_weight_first`), e8m0 scales kept native, then FlashInfer's
  `interleave_moe_weights_for_sm90_mixed_gemm` / `..._scales_...` permute both. `cuda_layout`
  gives the loaded form before FlashInfer's interleave, which is not reproduced here (a CUDA op
  of FlashInfer, absent on this machine). FP8 linears: e4m3 [N, K] + fp32 [N/32, K/32].
* ROCm gfx950 (AITER, `SGLANG_USE_AITER=1`): w13 [gate | up] with the intermediate padded to
  128 (`intermediate_pad`), fp4x2 / e8m0 dtypes, then AITER's `shuffle_weight` /
  `shuffle_scale`; `rocm_layout` gives the padded form before AITER's shuffle (the shuffle's
  gate_up / is_guinterleave arguments need a newer amd-aiter than the 0.1.7 wheel here). Its
  32-wide ue8m0 FP8 linears run as MXFP8 with per-row e8m0 scales (`mxfp8_row_scales`).

`make_tables`, `make_caches` and `make_step` build the page tables, empty pools
(`layouts.py`) and a step's inputs: each request's full-pool pages are a random permutation
(page 0 is SGLang's reserved padding page) and each maps to a random SWA page (`full_to_swa`).
"""

from __future__ import annotations

import os

import torch

from . import layouts as L
from .config import DsV41Shape
from .quant import fp8_block_quant, mxfp4_quant
from .reference import LayerCaches, StepInputs

__all__ = [
    "SGLANG_READS",
    "FP8_LINEARS",
    "checkpoint_names",
    "cuda_layout",
    "make_caches",
    "make_layer_weights",
    "make_step",
    "make_tables",
    "mxfp8_row_scales",
    "remap_checkpoint_name",
    "rocm_layout",
    "shard",
]

SGLANG_READS: tuple[str, ...] = (
    "sglang.srt.models.deepseek_v4.DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format",
    "sglang.srt.models.deepseek_v4.DeepseekV4ForCausalLM.load_weights",
    "sglang.srt.models.deepseek_v4._dequant_fp8_wo_a_streaming",
    "sglang.srt.models.deepseek_v4._fuse_deepseek_v4_wqkv_a_pair",
    "sglang.srt.models.deepseek_v4.wo_a_fp8_gemm_enabled",
    "sglang.srt.models.deepseek_v4.make_hc_mixing_params",
    "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.create_fp8_moe_weight_",
    "sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe.Mxfp4FlashinferCutlassMoEMethod.load_up_proj_weight_first",
    "sglang.srt.layers.quantization.fp8_utils.block_fp8_scale_to_mxfp8_e8m0",
    "sglang.srt.layers.moe.hash_topk.HashTopK",
    "sglang.srt.environ.Envs.SGLANG_OPT_FUSE_WQA_WKV",
)

BF16 = torch.bfloat16
F32 = torch.float32

#: Keys of the FP8 block linears (each with a `.weight_scale_inv` twin).
FP8_LINEARS = (
    "self_attn.wqkv_a.weight",
    "self_attn.wq_b.weight",
    "self_attn.wo_b.weight",
    "self_attn.indexer.wq_b.weight",
    "mlp.shared_experts.gate_up_proj.weight",
    "mlp.shared_experts.down_proj.weight",
)


def _gen(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1) if seed is None else seed)
    return g


def _randn(shape, g, std=1.0) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=F32) * std


def make_layer_weights(s: DsV41Shape, layer_id: int, seed: int | None = None) -> dict[str, torch.Tensor]:
    """Random TP1 weights of layer `layer_id` (use `shard` for a rank). Linear weights ~ N(0, 1/K),
    norms around 1, mHC mixes small, the attention sink and router bias spread enough to matter."""
    assert s.tp_size == 1, "make the whole layer, then shard it"
    g = _gen(seed)
    kind = s.layer_kind(layer_id)
    w: dict[str, torch.Tensor] = {}
    d, h = s.head_dim, s.hidden

    def norm(n, dtype=BF16):
        return (1.0 + _randn((n,), g, 0.1)).to(dtype)

    def lin(n, k):
        return _randn((n, k), g, k**-0.5)

    def fp8(key, n, k):
        w[key], w[key + "_scale_inv"] = fp8_block_quant(lin(n, k), s.fp8_block)

    w["input_layernorm.weight"] = norm(h)
    w["post_attention_layernorm.weight"] = norm(h)
    for sub in ("attn", "ffn"):
        w[f"hc_{sub}_fn"] = _randn((s.mix_hc, s.hc_dim), g, s.hc_dim**-0.5)
        w[f"hc_{sub}_base"] = _randn((s.mix_hc,), g, 0.5)
        w[f"hc_{sub}_scale"] = 1.0 + _randn((3,), g, 0.2)

    a = "self_attn."
    fp8(a + "wqkv_a.weight", s.q_lora + d, h)
    w[a + "q_norm.weight"] = norm(s.q_lora)
    w[a + "kv_norm.weight"] = norm(d)
    fp8(a + "wq_b.weight", s.heads * d, s.q_lora)
    w[a + "wo_a.weight"] = lin(s.o_groups * s.o_lora, s.group_in_dim).to(BF16)
    fp8(a + "wo_b.weight", h, s.o_groups * s.o_lora)
    w[a + "attn_sink"] = _randn((s.heads,), g, 1.0)

    def core_compressor(prefix, ratio, hd):
        coff = 2 if ratio == 4 else 1
        w[prefix + "wkv_gate.weight"] = lin(2 * coff * hd, h).to(BF16)
        w[prefix + "ape"] = L.ape_hotfix(_randn((ratio, coff * hd), g, 0.5), ratio)
        w[prefix + "norm.weight"] = norm(hd, F32)

    if kind.ratio in (4, 128):
        core_compressor(a + "compressor.", kind.ratio, d)
        if kind.ratio == 4:
            fp8(a + "indexer.wq_b.weight", s.index_heads * s.index_head_dim, s.q_lora)
            w[a + "indexer.weights_proj.weight"] = lin(s.index_heads, h).to(BF16)
            core_compressor(a + "indexer.compressor.", 4, s.index_head_dim)
    elif kind.ratio in (1, 2):
        if kind.kv_source:
            w[a + "compressor.wkv.weight"] = lin(d, h).to(BF16)
            if kind.ratio == 2:
                w[a + "compressor.wgate.weight"] = lin(d, h).to(BF16)
            w[a + "compressor.norm.weight"] = norm(d)
        if kind.index_source:
            fp8(a + "indexer.wq_b.weight", s.index_heads * s.index_head_dim, s.q_lora)
            w[a + "indexer.weights_proj.weight"] = lin(s.index_heads, h).to(BF16)
            if kind.kv_source:  # `DeepseekV41Indexer.owns_k`
                w[a + "indexer.wk.weight"] = lin(s.index_head_dim, d).to(BF16)
                w[a + "indexer.k_norm.weight"] = norm(s.index_head_dim)

    m = "mlp."
    w[m + "gate.weight"] = lin(s.n_experts, h).to(BF16)
    if kind.hash_routed:
        w[m + "topk.tid2eid"] = torch.stack(
            [torch.randperm(s.n_experts, generator=g)[: s.top_k] for _ in range(s.vocab)]).to(torch.int32)
    else:
        w[m + "gate.e_score_correction_bias"] = _randn((s.n_experts,), g, 0.5)
    fp8(m + "shared_experts.gate_up_proj.weight", 2 * s.shared_inter, h)
    fp8(m + "shared_experts.down_proj.weight", h, s.shared_inter)
    w13, s13 = mxfp4_quant(_randn((s.n_experts, 2 * s.moe_inter, h), g, h**-0.5), s.mxfp4_group)
    w2, s2 = mxfp4_quant(_randn((s.n_experts, h, s.moe_inter), g, s.moe_inter**-0.5), s.mxfp4_group)
    w[m + "experts.w13_weight"], w[m + "experts.w13_weight_scale_inv"] = w13, s13
    w[m + "experts.w2_weight"], w[m + "experts.w2_weight_scale_inv"] = w2, s2
    return w


def shard(w: dict[str, torch.Tensor], s: DsV41Shape) -> dict[str, torch.Tensor]:
    """Rank `s.tp_rank`'s copy of TP1 weights, as SGLang's loaders cut them: wq_b and wo_a
    column parallel (this rank's heads / groups), wo_b row parallel, the shared expert's
    gate | up rows and down columns, each routed expert's intermediate slice; the rest
    (wqkv_a, norms, mHC, compressors, indexers, router, attn_sink) replicated."""
    if s.tp_size == 1:
        return dict(w)
    r, b = s.tp_rank, s.fp8_block
    out = dict(w)

    def rows(t, n):
        return t[r * n : (r + 1) * n].contiguous()

    def cols(t, n):
        return t[..., r * n : (r + 1) * n].contiguous()

    a = "self_attn."
    qn = s.heads_per_rank * s.head_dim
    out[a + "wq_b.weight"] = rows(w[a + "wq_b.weight"], qn)
    out[a + "wq_b.weight_scale_inv"] = rows(w[a + "wq_b.weight_scale_inv"], qn // b)
    out[a + "wo_a.weight"] = rows(w[a + "wo_a.weight"], s.groups_per_rank * s.o_lora)
    on = s.groups_per_rank * s.o_lora
    out[a + "wo_b.weight"] = cols(w[a + "wo_b.weight"], on)
    out[a + "wo_b.weight_scale_inv"] = cols(w[a + "wo_b.weight_scale_inv"], on // b)
    m = "mlp.shared_experts."
    isl = s.shared_inter_per_rank
    gu, gus = w[m + "gate_up_proj.weight"], w[m + "gate_up_proj.weight_scale_inv"]
    half, shalf = gu.shape[0] // 2, gus.shape[0] // 2
    out[m + "gate_up_proj.weight"] = torch.cat([rows(gu[:half], isl), rows(gu[half:], isl)])
    out[m + "gate_up_proj.weight_scale_inv"] = torch.cat([rows(gus[:shalf], isl // b), rows(gus[shalf:], isl // b)])
    out[m + "down_proj.weight"] = cols(w[m + "down_proj.weight"], isl)
    out[m + "down_proj.weight_scale_inv"] = cols(w[m + "down_proj.weight_scale_inv"], isl // b)
    e = "mlp.experts."
    il, gq = s.moe_inter_per_rank, s.mxfp4_group
    for key in ("w13_weight", "w13_weight_scale_inv"):
        t = w[e + key]
        half = t.shape[1] // 2
        out[e + key] = torch.cat([t[:, r * il : (r + 1) * il], t[:, half + r * il : half + (r + 1) * il]], 1).contiguous()
    out[e + "w2_weight"] = cols(w[e + "w2_weight"], il // 2)
    out[e + "w2_weight_scale_inv"] = cols(w[e + "w2_weight_scale_inv"], il // gq)
    return out


# ---- the runtimes' forms --------------------------------------------------------------------------------
def cuda_layout(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The routed experts as `Mxfp4FlashinferCutlassMoEMethod` loads them on sm_90, before
    FlashInfer's SM90 interleave: w13 rows [up | gate] (`load_up_proj_weight_first`), e8m0 scales
    as torch.float8_e8m0fnu. Everything else as canonical."""
    out = dict(w)
    for key in ("mlp.experts.w13_weight", "mlp.experts.w13_weight_scale_inv"):
        gate, up = w[key].chunk(2, dim=1)
        out[key] = torch.cat([up, gate], dim=1).contiguous()
    for key in ("mlp.experts.w13_weight_scale_inv", "mlp.experts.w2_weight_scale_inv"):
        out[key] = out[key].view(torch.float8_e8m0fnu)
    return out


def rocm_layout(w: dict[str, torch.Tensor], align: int = 128) -> dict[str, torch.Tensor]:
    """The routed experts as AITER's fp4 path holds them on gfx950 before its shuffle
    (`Fp8MoEMethod.process_weights_after_loading_block_quant`): the intermediate padded with
    zeros to a multiple of 128 in both w13 halves and w2's K, fp4x2 weights, e8m0 scales."""
    out = dict(w)
    w13, s13 = w["mlp.experts.w13_weight"], w["mlp.experts.w13_weight_scale_inv"]
    w2, s2 = w["mlp.experts.w2_weight"], w["mlp.experts.w2_weight_scale_inv"]
    e, two_i, kp = w13.shape
    i = two_i // 2
    ip = -(-i // align) * align

    def pad_rows(t):
        new = torch.zeros(e, 2 * ip, t.shape[2], dtype=t.dtype)
        new[:, :i], new[:, ip : ip + i] = t[:, :i], t[:, i:]
        return new

    out["mlp.experts.w13_weight"] = pad_rows(w13.view(torch.uint8)).view(torch.float4_e2m1fn_x2)
    out["mlp.experts.w13_weight_scale_inv"] = pad_rows(s13).view(torch.float8_e8m0fnu)
    w2p = torch.zeros(e, w2.shape[1], ip // 2, dtype=torch.uint8)
    w2p[:, :, : w2.shape[2]] = w2.view(torch.uint8)
    s2p = torch.zeros(e, s2.shape[1], ip // 32, dtype=torch.uint8)
    s2p[:, :, : s2.shape[2]] = s2
    out["mlp.experts.w2_weight"] = w2p.view(torch.float4_e2m1fn_x2)
    out["mlp.experts.w2_weight_scale_inv"] = s2p.view(torch.float8_e8m0fnu)
    return out


def mxfp8_row_scales(scale: torch.Tensor, n: int, block_n: int) -> torch.Tensor:
    """`block_fp8_scale_to_mxfp8_e8m0`: fp32 power-of-two block scales [ceil(N/bn), K/32] ->
    per-row e8m0 bytes [N, K/32] (how gfx950 runs the 32-wide ue8m0 FP8 linears as MXFP8)."""
    bits = scale.float().contiguous().view(torch.int32)
    if bool(((bits & 0x7FFFFF) != 0).any()):
        raise ValueError("block scales are not powers of two")
    return (bits >> 23).to(torch.uint8).repeat_interleave(block_n, 0)[:n].contiguous()


# ---- checkpoint names -------------------------------------------------------------------------------
def remap_checkpoint_name(name: str) -> str:
    """`DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format` for decoder-layer names:
    layers.i.attn.* -> model.layers.i.self_attn.*, ffn -> mlp, attn_norm / ffn_norm -> the
    layer norms, `.scale` -> `.weight_scale_inv` (attention and MLP), gate.bias ->
    gate.e_score_correction_bias, gate.tid2eid -> topk.tid2eid, w1/w2/w3 -> gate/down/up_proj."""
    if name.startswith("layers."):
        name = "model." + name
    for old, new in ((".attn.", ".self_attn."), (".ffn.", ".mlp."), (".attn_norm.", ".input_layernorm."),
                     (".ffn_norm.", ".post_attention_layernorm.")):
        name = name.replace(old, new)
    if "self_attn" in name and name.endswith(".scale"):
        name = name.removesuffix(".scale") + ".weight_scale_inv"
    name = name.replace(".gate.tid2eid", ".topk.tid2eid").replace(".gate.bias", ".gate.e_score_correction_bias")
    name = name.replace(".w1.", ".gate_proj.").replace(".w2.", ".down_proj.").replace(".w3.", ".up_proj.")
    if "mlp" in name and name.endswith(".scale"):
        name = name.removesuffix(".scale") + ".weight_scale_inv"
    return name


def checkpoint_names(s: DsV41Shape, layer_id: int) -> list[str]:
    """The checkpoint's tensor names of one decoder layer (before `remap_checkpoint_name`), as
    DeepSeek's V4 format spells them; experts 0 and the last stand for all."""
    kind = s.layer_kind(layer_id)
    p = f"layers.{layer_id}."
    names = [p + "attn_norm.weight", p + "ffn_norm.weight"]
    names += [p + f"hc_{sub}_{x}" for sub in ("attn", "ffn") for x in ("fn", "base", "scale")]
    for lin in ("wq_a", "wkv", "wq_b", "wo_a", "wo_b"):
        names += [p + f"attn.{lin}.weight", p + f"attn.{lin}.scale"]
    names += [p + "attn.q_norm.weight", p + "attn.kv_norm.weight", p + "attn.attn_sink"]
    if kind.ratio in (4, 128):
        names += [p + f"attn.compressor.{x}" for x in ("wkv.weight", "wgate.weight", "ape", "norm.weight")]
        if kind.ratio == 4:
            names += [p + "attn.indexer.wq_b.weight", p + "attn.indexer.wq_b.scale",
                      p + "attn.indexer.weights_proj.weight"]
            names += [p + f"attn.indexer.compressor.{x}" for x in ("wkv.weight", "wgate.weight", "ape", "norm.weight")]
    names += [p + "ffn.gate.weight", p + ("ffn.gate.tid2eid" if kind.hash_routed else "ffn.gate.bias")]
    for e in (0, s.n_experts - 1):
        for x in ("w1", "w2", "w3"):
            names += [p + f"ffn.experts.{e}.{x}.weight", p + f"ffn.experts.{e}.{x}.scale"]
    for x in ("w1", "w2", "w3"):
        names += [p + f"ffn.shared_experts.{x}.weight", p + f"ffn.shared_experts.{x}.scale"]
    return names


# ---- caches and steps ------------------------------------------------------------------------------
def make_caches(s: DsV41Shape, full_pages: int, num_reqs: int) -> dict[int, LayerCaches]:
    """Empty pools for every layer of `s` in SGLang's layouts (`layouts.py`), sized for
    `full_pages` pages of `s.page_size` tokens and `num_reqs` request slots. Every pool is zero
    (as SGLang allocates them) and every state row empty."""
    nope, rope, page = s.nope_dim, s.rope_dim, s.page_size
    caches: dict[int, LayerCaches] = {}
    for i in range(s.num_layers):
        kind = s.layer_kind(i)
        c = LayerCaches(swa=torch.zeros(full_pages, L.v4_page_bytes(page, nope, rope), dtype=torch.uint8))
        r = kind.ratio
        owns = r in (4, 128) or kind.kv_source
        if owns:
            c.ckv = torch.zeros(full_pages, L.v4_page_bytes(page // r, nope, rope), dtype=torch.uint8)
        if r == 4:
            ring = s.ring_size(4)
            c.state = L.empty_state(full_pages * ring + 1, 4 * s.head_dim)
            c.index_state = L.empty_state(full_pages * ring + 1, 4 * s.index_head_dim)
            c.index_k = torch.zeros(full_pages, (page // 4) * (s.index_head_dim + 4), dtype=torch.uint8)
        elif r == 128:
            c.state = L.empty_state(num_reqs * s.ring_size(128) + 1, 2 * s.head_dim)
        elif r == 2 and kind.kv_source:
            c.state = L.empty_state(num_reqs * s.ring_size(2) + 1, 2 * s.head_dim)
        if r in (1, 2) and kind.kv_source and kind.index_source:
            ipages = -(-(full_pages * page) // (r * s.index_page_size))
            c.index_k = torch.zeros(ipages, s.index_page_size * L.index_fp4_row_bytes(s.index_head_dim),
                                    dtype=torch.uint8)
        caches[i] = c
    return caches


def make_step(s: DsV41Shape, start: torch.Tensor, tokens: int, req_to_token: torch.Tensor,
              full_to_swa: torch.Tensor, input_ids: torch.Tensor) -> StepInputs:
    """The step that runs positions start[r] .. start[r] + tokens - 1 of every request r
    (tokens = 1 decode, the draft count for verify, a prompt length for a prefill the
    reference runs token-causally). input_ids [R, tokens]."""
    nreq = start.shape[0]
    rows = torch.arange(nreq).repeat_interleave(tokens)
    pos = (start[:, None] + torch.arange(tokens)[None]).reshape(-1)
    return StepInputs(
        input_ids=input_ids.reshape(-1).long(),
        positions=pos.long(),
        req_rows=rows.long(),
        out_cache_loc=req_to_token[rows, pos].long(),
        req_to_token=req_to_token,
        full_to_swa=full_to_swa,
        page_size=s.page_size,
    )


def make_tables(s: DsV41Shape, num_reqs: int, max_ctx: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(req_to_token [R, max_ctx] int64, full_to_swa [slots] int64, pages): every request gets
    its own pages, a random permutation of 1..pages-1 (page 0 stays the padding page, as
    SGLang reserves it); each full page maps to a random SWA page (SGLang's SWA pool is its
    own allocator; here it is as large as the full pool, so no window is ever evicted)."""
    g = torch.Generator().manual_seed(seed)
    per = -(-max_ctx // s.page_size)
    pages = num_reqs * per + 1
    perm = torch.randperm(pages - 1, generator=g) + 1
    table = perm.view(num_reqs, per)
    j = torch.arange(max_ctx)
    req_to_token = table[:, j // s.page_size] * s.page_size + j % s.page_size
    swa_page = torch.randperm(pages, generator=g)
    slot = torch.arange(pages * s.page_size)
    full_to_swa = swa_page[slot // s.page_size] * s.page_size + slot % s.page_size
    return req_to_token.long(), full_to_swa.long(), pages
