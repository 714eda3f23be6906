"""Shapes of DeepSeek-V4.1-Flash's decoder layers, whole or as one TP rank's shard.

`DsV41Shape` holds every dimension the reference, the weight builders and the spec need, and
the per-layer structure (compress ratio, kv/index sources, hash routing). Pure Python: no
torch, so the spec can read it in SGLang's launcher.

Where the values come from (SGLang 0.5.23):

* The checkpoint's `DeepseekV41ForCausalLM` config is parsed by `DeepseekV41Config`
  (configs/deepseek_v41.py), a transformers `DeepseekV3Config` whose only own defaults are
  `hc_pre_from_prev_sublayer=True`, `q_head_norm=False` and empty source/Engram lists; every
  other value comes from the checkpoint's config.json. `DEFAULTS` are the dataclass defaults
  of `DeepSeekV4Config` (configs/deepseek_v4.py), the native V4 schema SGLang's model reads.
* `V41_FLASH_GATES` lists the values SGLang's code is gated on for V4.1, with where: those
  are the values the real V4.1-Flash checkpoint is known (from the code, not from its
  config.json, which is not available here) to change from the defaults. `V41_FLASH` applies
  them; every other field keeps its default and is marked unknown in `V41_FLASH_UNKNOWN`.
* SGLang reads a few attributes that `DeepSeekV4Config` does not define with getattr:
  `num_hash_layers` (not the dataclass's `n_hash_layers`!, models/deepseek_v2.py
  `DeepseekV2MoE.__init__`) and `swiglu_limit`; `head_dim` is required
  (`MqaAttentionBase.__init__` asserts `head_dim == qk_rope + qk_nope`).

Per layer `compress_ratios[i]` picks the attention kind: 0 sliding window only; 1 and 2 the
V4.1 low-ratio compressors (a layer in `kv_source_layer_ids` owns the compressed latents, one
in `index_source_layer_ids` runs the indexer; the others read the nearest preceding source's
latents and the last published top-k); 4 the overlapping C4 compressor with its C4 indexer;
128 the C128 compressor (every compressed block visible). The first `num_hash_layers` layers
route by `tid2eid[input_ids]`, the others by sqrtsoftplus + bias.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SGLANG_READS",
    "DEFAULTS",
    "DsV41Shape",
    "LayerKind",
    "V41_FLASH",
    "V41_FLASH_GATES",
    "V41_FLASH_UNKNOWN",
    "tiny",
]

COMPRESS_RATIOS = (0, 1, 2, 4, 128)

#: The SGLang names this module reads (as strings: it imports nothing of SGLang).
SGLANG_READS: tuple[str, ...] = (
    "sglang.srt.configs.deepseek_v4.DeepSeekV4Config",
    "sglang.srt.configs.deepseek_v41.DeepseekV41Config",
    "sglang.srt.configs.deepseek_v41.DeepseekV41Config.hc_pre_from_prev_sublayer",
    "sglang.srt.configs.deepseek_v41.DeepseekV41Config.q_head_norm",
    "sglang.srt.models.deepseek_v4.MqaAttentionBase",
    "sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayerBase.refresh_mhc_norm_weight_cache",
    "sglang.srt.models.deepseek_v4.MQALayer._normalize_q_lora",
    "sglang.srt.models.deepseek_v4._apply_wo_a_bf16_matmul",
    "sglang.srt.models.deepseek_v4._dequant_fp8",
    "sglang.srt.models.deepseek_v4_mhc.make_boundary",
    "sglang.srt.layers.attention.dsv4.dsv41_sparse._small_weights_proj_max_m",
    "sglang.srt.layers.attention.dsv4.dsv41_sparse.DeepseekV41Indexer.forward_wk",
    "sglang.srt.layers.attention.deepseek_v4_backend.SWA_WINDOW",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.get_compress_state_ring_size",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.get_swa_ring_size",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool.source_layer_of",
    "sglang.srt.arg_groups.model_overrides.deepseek_v4._deepseek_v4_overrides",
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LayerKind:
    """What one decoder layer runs: its attention kind and its router."""

    layer_id: int
    ratio: int  # 0, 1, 2, 4 or 128
    kv_source: bool  # ratio 1/2: owns the compressed latents (its compressor runs)
    index_source: bool  # ratio 1/2: runs the V4.1 indexer and publishes a top-k
    kv_source_layer: int | None  # ratio 1/2: the layer whose latents it attends
    hash_routed: bool

    @property
    def name(self) -> str:
        if self.ratio == 0:
            attn = "swa"
        elif self.ratio in (4, 128):
            attn = f"c{self.ratio}"
        else:
            roles = [r for r, on in (("kv", self.kv_source), ("index", self.index_source)) if on]
            attn = f"c{self.ratio}" + ("+" + "+".join(roles) if roles else "")
        return f"{attn}/{'hash' if self.hash_routed else 'topk'}"


@dataclass(frozen=True)
class DsV41Shape:
    """Every dimension of a DeepSeek-V4.1 decoder stack (and the TP rank it is cut for)."""

    hidden: int = 4096
    num_layers: int = 43
    heads: int = 64
    head_dim: int = 512  # qk_nope + qk_rope; k = v (one latent head)
    rope_dim: int = 64  # qk_rope_head_dim: the roped tail of every head
    q_lora: int = 1024
    o_lora: int = 1024
    o_groups: int = 8
    window: int = 128  # SGLang's SWA_WINDOW (deepseek_v4_backend.py), = config.window_size
    n_experts: int = 256
    top_k: int = 6
    n_shared: int = 1
    moe_inter: int = 2048
    routed_scaling: float = 1.5
    swiglu_limit: float | None = 10.0
    index_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    compress_ratios: tuple[int, ...] = ()
    kv_source_layer_ids: tuple[int, ...] = ()
    index_source_layer_ids: tuple[int, ...] = ()
    candidate_source_layer_id: int = -1
    engram_layer_ids: tuple[int, ...] = ()
    num_hash_layers: int = 3
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 40000.0
    # YaRN of the compressed layers (rope_scaling); factor 1 / original 0 means none.
    rope_factor: float = 1.0
    rope_original_max_position: int = 0
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    max_position: int = 65536
    vocab: int = 129280
    image_token_id: int = 129264
    fp8_block: int = 32  # V4.1 attention/shared FP8 weights: 32x32 blocks (V4: 128x128)
    mxfp4_group: int = 32  # routed experts: one e8m0 scale per 32 values along K
    page_size: int = 256  # --page-size SGLang forces for DeepseekV4ForCausalLM
    index_page_size: int = 64  # ratio-1/2 index-K pages (DSV41_INDEX_PAGE_SIZE without DeepGEMM paged)
    tp_size: int = 1
    tp_rank: int = 0
    draft_tokens: int = 1  # tokens a request carries in a step (verify: the draft length)

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} not in [0, {self.tp_size})")
        if self.head_dim <= self.rope_dim or self.rope_dim % 2:
            raise ValueError("head_dim must exceed an even rope_dim")
        for name, total in (("heads", self.heads), ("o_groups", self.o_groups), ("moe_inter", self.moe_inter)):
            if total % self.tp_size:
                raise ValueError(f"{name}={total} is not divisible by tp_size={self.tp_size}")
        if (self.heads * self.head_dim) % self.o_groups:
            raise ValueError("heads * head_dim must split into o_groups")
        if self.compress_ratios and len(self.compress_ratios) != self.num_layers:
            raise ValueError(f"{len(self.compress_ratios)} compress_ratios for {self.num_layers} layers")
        bad = sorted(set(self.compress_ratios) - set(COMPRESS_RATIOS))
        if bad:
            raise ValueError(f"compress ratios {bad} are not among {COMPRESS_RATIOS}")
        for i in self.kv_source_layer_ids + self.index_source_layer_ids:
            if self.ratio(i) not in (1, 2):
                raise ValueError(f"source layer {i} has ratio {self.ratio(i)}, not 1 or 2")
        for i, r in enumerate(self.compress_ratios):
            if r in (1, 2) and not any(s <= i and self.ratio(s) == r for s in self.kv_source_layer_ids):
                raise ValueError(f"layer {i} (ratio {r}) has no preceding kv_source layer")
        if self.index_head_dim & (self.index_head_dim - 1):
            raise ValueError("index_head_dim must be a power of 2 (Hadamard rotation)")
        if self.rope_dim > self.index_head_dim or self.nope_dim % 64:
            raise ValueError("the RoPE tail must fit an index head, and nope must be whole 64-value V4 tiles")
        # SGLang shards FP8 block weights along whole blocks; a rank boundary inside a block
        # would need requantisation, which SGLang never does.
        b = self.fp8_block
        for name, size in (
            ("wq_b rows per rank", self.heads_per_rank * self.head_dim),
            ("wo_b cols per rank", self.groups_per_rank * self.o_lora),
            ("shared inter per rank", self.shared_inter_per_rank),
            ("hidden", self.hidden),
            ("q_lora", self.q_lora),
        ):
            if size % b:
                raise ValueError(f"{name}={size} is not a multiple of the FP8 block {b}")
        if self.moe_inter_per_rank % self.mxfp4_group or self.hidden % self.mxfp4_group:
            raise ValueError("MXFP4 experts need K dims that are multiples of 32")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def nope_dim(self) -> int:
        return self.head_dim - self.rope_dim

    @property
    def heads_per_rank(self) -> int:
        return self.heads // self.tp_size

    @property
    def groups_per_rank(self) -> int:
        return self.o_groups // self.tp_size

    @property
    def group_in_dim(self) -> int:
        """wo_a's input width: heads * head_dim / o_groups (4096 for V4.1-Flash)."""
        return self.heads * self.head_dim // self.o_groups

    @property
    def moe_inter_per_rank(self) -> int:
        return self.moe_inter // self.tp_size

    @property
    def shared_inter(self) -> int:
        return self.moe_inter * self.n_shared

    @property
    def shared_inter_per_rank(self) -> int:
        return self.shared_inter // self.tp_size

    @property
    def hc_dim(self) -> int:
        return self.hc_mult * self.hidden

    @property
    def mix_hc(self) -> int:
        """Rows of hc_*_fn: pre (mult) + post (mult) + comb (mult^2)."""
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5

    @property
    def index_softmax_scale(self) -> float:
        return self.index_head_dim**-0.5

    @property
    def tokens_per_step(self) -> int:
        return self.draft_tokens

    @property
    def swa_ring(self) -> int:
        """SWA slots a request needs: the window plus the draft tokens a verify writes ahead
        (`get_swa_ring_size`)."""
        return self.window + self.draft_tokens - 1

    def ring_size(self, ratio: int) -> int:
        """Compress-state rows a request needs (`get_compress_state_ring_size`, offline C128)."""
        speculative = self.draft_tokens > 1
        if ratio == 2:
            return 1 << (self.draft_tokens + 1).bit_length() if speculative else 2
        if ratio == 4:
            return 16 if speculative else 8
        if ratio == 128:
            return 256 if speculative else 128
        raise ValueError(f"ratio {ratio} keeps no compress state")

    def ratio(self, layer_id: int) -> int:
        return self.compress_ratios[layer_id] if self.compress_ratios else 0

    def kv_source_of(self, layer_id: int) -> int | None:
        """`DeepSeekV4TokenToKVPool.source_layer_of`: the nearest preceding kv_source layer
        of the same ratio (ratios 1/2), the layer itself otherwise."""
        r = self.ratio(layer_id)
        if r not in (1, 2):
            return layer_id
        return max(s for s in self.kv_source_layer_ids if s <= layer_id and self.ratio(s) == r)

    def layer_kind(self, layer_id: int) -> LayerKind:
        r = self.ratio(layer_id)
        return LayerKind(
            layer_id=layer_id,
            ratio=r,
            kv_source=r in (1, 2) and layer_id in self.kv_source_layer_ids,
            index_source=r in (1, 2) and layer_id in self.index_source_layer_ids,
            kv_source_layer=self.kv_source_of(layer_id) if r in (1, 2) else None,
            hash_routed=layer_id < self.num_hash_layers,
        )

    def rope_base(self, layer_id: int) -> float:
        """`MqaAttentionBase.rope_base`: compress_rope_theta on compressing layers."""
        return self.compress_rope_theta if self.ratio(layer_id) else self.rope_theta

    def rope_yarn(self, layer_id: int) -> tuple[int, float]:
        """(original_seq_len, factor) of `precompute_freqs_cis`: YaRN only on compressing layers."""
        if self.ratio(layer_id) and self.rope_original_max_position:
            return self.rope_original_max_position, self.rope_factor
        return 0, 1.0

    def nblk(self, n: int) -> int:
        return _cdiv(n, self.fp8_block)

    # ---- constructors --------------------------------------------------------------------
    def tp_shard(self, tp_size: int, tp_rank: int) -> DsV41Shape:
        """The same stack cut for rank `tp_rank` of `tp_size`."""
        return dataclasses.replace(self, tp_size=tp_size, tp_rank=tp_rank)

    def with_draft_tokens(self, n: int) -> DsV41Shape:
        return dataclasses.replace(self, draft_tokens=n)

    @property
    def whole(self) -> DsV41Shape:
        return self.tp_shard(1, 0)

    @classmethod
    def from_hf_config(cls, hf: Any, tp_size: int = 1, tp_rank: int = 0, draft_tokens: int = 1) -> DsV41Shape:
        """Read the dims from a `DeepseekV41Config`/`DeepSeekV4Config` (or anything with its
        attributes), with SGLang 0.5.23's getattr defaults."""

        def get(name, default=None):
            return getattr(hf, name, default)

        scaling = get("rope_scaling") or {}
        if get("rope_parameters") and not scaling:
            scaling = {k: v for k, v in dict(get("rope_parameters")).items() if k != "rope_theta"}
        head_dim = get("head_dim") or (get("qk_nope_head_dim", 448) + get("qk_rope_head_dim", 64))
        ratios = tuple(int(r) for r in (get("compress_ratios") or ()))
        return cls(
            hidden=int(hf.hidden_size),
            num_layers=int(hf.num_hidden_layers),
            heads=int(hf.num_attention_heads),
            head_dim=int(head_dim),
            rope_dim=int(hf.qk_rope_head_dim),
            q_lora=int(hf.q_lora_rank),
            o_lora=int(get("o_lora_rank", 1024)),
            o_groups=int(get("o_groups", 8)),
            window=int(get("window_size", 128)),
            n_experts=int(hf.n_routed_experts),
            top_k=int(hf.num_experts_per_tok),
            n_shared=int(get("n_shared_experts") or 0),
            moe_inter=int(hf.moe_intermediate_size),
            routed_scaling=float(hf.routed_scaling_factor),
            swiglu_limit=None if get("swiglu_limit") is None else float(get("swiglu_limit")),
            index_heads=int(hf.index_n_heads),
            index_head_dim=int(hf.index_head_dim),
            index_topk=int(hf.index_topk),
            compress_ratios=ratios,
            kv_source_layer_ids=tuple(get("kv_source_layer_ids") or ()),
            index_source_layer_ids=tuple(get("index_source_layer_ids") or ()),
            candidate_source_layer_id=int(get("candidate_source_layer_id", -1)),
            engram_layer_ids=tuple(get("engram_layer_ids") or ()),
            num_hash_layers=int(get("num_hash_layers", 0) or 0),
            hc_mult=int(get("hc_mult", 4)),
            hc_sinkhorn_iters=int(get("hc_sinkhorn_iters", 20)),
            hc_eps=float(get("hc_eps", 1e-6)),
            rms_eps=float(hf.rms_norm_eps),
            rope_theta=float(get("rope_theta", 10000.0) or (get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            compress_rope_theta=float(get("compress_rope_theta", 40000.0)),
            rope_factor=float(scaling.get("factor", 1.0)),
            rope_original_max_position=int(scaling.get("original_max_position_embeddings", 0) or 0),
            rope_beta_fast=float(scaling.get("beta_fast", 32)),
            rope_beta_slow=float(scaling.get("beta_slow", 1)),
            max_position=int(hf.max_position_embeddings),
            vocab=int(hf.vocab_size),
            image_token_id=int(get("image_token_id", 129264)),
            tp_size=tp_size,
            tp_rank=tp_rank,
            draft_tokens=draft_tokens,
        )


#: `DeepSeekV4Config` dataclass defaults (configs/deepseek_v4.py), TP1, one token a request.
#: `num_hash_layers` is the dataclass's `n_hash_layers` (3); SGLang's MoE reads
#: `num_hash_layers`, which the V4.1 checkpoint's config.json must carry.
DEFAULTS = DsV41Shape()

#: field -> (V4.1-Flash value, the SGLang 0.5.23 gate that implies it). Only what the code
#: shows; none of these is read from the checkpoint's config.json (not available here).
V41_FLASH_GATES: dict[str, tuple[Any, str]] = {
    "hidden": (5120, "deepseek_v4.py refresh_mhc_norm_weight_cache: hc_attn_fn.shape == (24, 20480); "
               "deepseek_v4_mhc.py fused paths: cfg.hidden == 5120, norm.weight.shape == (5120,)"),
    "q_lora": (1280, "deepseek_v4.py MQALayer._normalize_q_lora: q.shape[1] == 1280 (rmsnorm_mxfp8 path)"),
    "index_heads": (32, "dsv41_sparse.py _small_weights_proj_max_m: can_use_n32k5120_gemm (weights_proj [32, 5120])"),
    "index_head_dim": (128, "dsv41_sparse.py DeepseekV41Indexer.forward_wk: can_use_n128k512_gemm (wk [128, 512])"),
    "heads": (64, "deepseek_v4.py _apply_wo_a_bf16_matmul: o [T, 2, 4096] at TP4 -> 8 groups x 4096 = 64 x 512"),
    "o_groups": (8, "deepseek_v4.py _apply_wo_a_bf16_matmul: wo_a (2, 1024, 4096) per TP4 rank"),
    "o_lora": (1024, "deepseek_v4.py _apply_wo_a_bf16_matmul: wo_a.shape == (2, 1024, 4096)"),
    "fp8_block": (32, "deepseek_v4.py _dequant_fp8: 'V4 128x128, V4.1 32x32'; model_overrides/deepseek_v4.py: "
                  "weight_block_size [32, 32], scale_fmt ue8m0"),
    "n_experts": (256, "layers/moe/router_gemv.py tuning note 'for N=256, K=5120 on GB300' (a comment, "
                  "not a gate: weakest of these)"),
}

#: Fields SGLang's code does not pin for V4.1-Flash: they keep `DEFAULTS` in `V41_FLASH` and
#: must be read from the checkpoint (`DsV41Shape.from_hf_config`).
V41_FLASH_UNKNOWN = (
    "num_layers",
    "top_k",
    "moe_inter",
    "routed_scaling",
    "swiglu_limit",
    "index_topk",
    "compress_ratios",
    "kv_source_layer_ids",
    "index_source_layer_ids",
    "candidate_source_layer_id",
    "engram_layer_ids",
    "num_hash_layers",
    "rope_theta",
    "compress_rope_theta",
    "rope_factor",
    "rope_original_max_position",
    "vocab",
)

V41_FLASH = dataclasses.replace(DEFAULTS, **{k: v for k, (v, _) in V41_FLASH_GATES.items()})


def tiny(tp_size: int = 1, tp_rank: int = 0, draft_tokens: int = 1, **overrides: Any) -> DsV41Shape:
    """A V4.1-shaped stack small enough for the CPU: the same structure, every layer kind.

    Layers: 0 SWA (hash), 1 ratio 1 kv+index source (hash), 2 ratio 2 kv+index source,
    3 C4 + indexer, 4 C128, 5 ratio 1 reader, 6 ratio 2 reader, 7 ratio 1 index source only
    (new top-k over layer 1's latents). Dims divide for TP 1, 2 and 4; FP8 blocks stay 32.
    The SwiGLU limit is 1.0 so that random weights actually reach the clamp.
    """
    params: dict[str, Any] = dict(
        hidden=128,
        num_layers=8,
        heads=4,
        head_dim=128,  # nope 64: one V4 scale tile; rope 64 as the real model
        rope_dim=64,
        q_lora=64,
        o_lora=32,
        o_groups=4,
        window=16,
        n_experts=8,
        top_k=2,
        n_shared=1,
        moe_inter=128,
        routed_scaling=1.5,
        swiglu_limit=1.0,
        index_heads=4,
        index_head_dim=64,  # the RoPE tail (64) must fit in an index head
        index_topk=8,
        compress_ratios=(0, 1, 2, 4, 128, 1, 2, 1),
        kv_source_layer_ids=(1, 2),
        index_source_layer_ids=(1, 2, 7),
        num_hash_layers=2,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        rope_theta=10000.0,
        compress_rope_theta=40000.0,
        rope_factor=4.0,
        rope_original_max_position=256,
        max_position=1024,
        vocab=512,
        image_token_id=500,
        page_size=256,  # as SGLang forces; C4 index pages are then 64 keys, as its readers assert
        index_page_size=64,
        tp_size=tp_size,
        tp_rank=tp_rank,
        draft_tokens=draft_tokens,
    )
    params.update(overrides)
    return DsV41Shape(**params)

