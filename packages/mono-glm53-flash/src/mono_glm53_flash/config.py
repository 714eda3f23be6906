"""Shapes of GLM-5.3-Flash's covered decoder layers, whole or as one TP rank's shard.

`FlashShape` holds every dimension the reference, the weight builders and (later) the kernels
need, and the per-rank sizes derived from `tp_size` / `tp_rank`. `FlashModel` holds the layer
pattern: which global layer is a KDA (linear attention) layer and which a sparse-attention
(MLA + pooled-key indexer) layer, which layers the launch covers, and where each layer's state
lives in SGLang's pools.

Values are what SGLang 0.5.23 reads from `Glm5NextTextConfig` (sglang/srt/configs/glm5_next.py;
its defaults are `REAL` below) plus the values the GLM-5.3-Flash checkpoint sets where the
class default is None or off: `mhc=True`, `swiglu_limit=10.0` (the value SGLang's ROCm
shared-expert fusion gate names, models/glm5_next.py `shared_experts_fusion_disable_reason`),
`index_topk=2048`, `index_head_dim=128` (the only width `DSATokenToKVPool` accepts),
`index_kpool=4` (index_topk + kpool - 1 = 2051, kernels/ops/attention/dsa/transform_index.py)
with `index_kpool_compress` and `index_kpool_always_select_tail` (IndexerKPool asserts both).
`index_n_heads` is not recoverable from SGLang's code; 32 (GLM-5.3's) is assumed and every
use reads the field, so a checkpoint that differs only changes the field.

The real layer, TP1 (`REAL`):
- hidden 4096, RMSNorm eps 1e-5; mHC: 4 streams of 4096 (layer I/O is [T, 16384] bf16),
  24 mixes (4 pre, 4 post, 16 comb), 20 Sinkhorn iterations, eps 1e-6, post x 2.0.
- KDA layers: 64 heads x 128 (q, k, v, gate and output all 128 a head), a causal conv of
  kernel 4 over q|k|v (3 x 8192 channels), fp32 recurrent state [64, 128 (V), 128 (K)] a
  request, per-K forget gate, sigmoid output gate.
- sparse-attention layers: MLA with q_lora 1536, kv_lora 512, qk_nope 256 and no RoPE
  (qk_rope 0), v 256, 64 heads; softmax scale 256 ** -0.5; the pooled-key indexer
  (`IndexerKPool`): 32 x 128 index heads, one index key per 4 tokens (softmax-gated
  compression), top 512 groups = 2048 tokens plus up to 3 tail tokens.
- MoE (every layer from 3 on, `moe_layer_freq` 1): 288 routed experts top-8 + 1 shared,
  moe_inter 2048, sigmoid scores + fp32 correction bias, renormalised, x 2.5, SwiGLU with
  the gate clamped to <= 10 and the up projection to [-10, 10].

Pages: SGLang serves DSA with `index_kpool` k at page size 64 * k = 256 tokens
(arg_groups/model_overrides/deepseek_v2.py), so one index-K page holds 64 pooled keys.
FP8 linears use 128 x 128 blocks; MXFP4 experts use 32-element groups. `tiny()` keeps the
structure at CPU sizes (block 32, MXFP4 group 32, page 16, index head 32).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["SGLANG_READS", "FlashShape", "FlashModel", "REAL", "REAL_MODEL", "tiny", "tiny_model"]

#: The SGLang 0.5.23 names whose values or behaviour this module restates.
SGLANG_READS: tuple[str, ...] = (
    "sglang.srt.configs.glm5_next.Glm5NextConfig",
    "sglang.srt.configs.glm5_next.Glm5NextTextConfig",
    "sglang.srt.configs.glm5_next.Glm5NextTextConfig.is_kda_layer",
    "sglang.srt.configs.glm5_next.Glm5NextTextConfig.linear_layer_ids",
    "sglang.srt.configs.glm5_next.Glm5NextTextConfig.full_attention_layer_ids",
    "sglang.srt.configs.glm5_next.Glm5NextTextConfig.mamba2_cache_params",
    "sglang.srt.configs.mamba_utils.KimiLinearStateShape.create",
    "sglang.srt.models.glm5_next.Glm5NextDecoderLayer._is_layer_sparse",
    "sglang.srt.models.glm5_next._MHC_POST_MULT_VALUE",
    "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA",
    "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.mamba2_layer_index",
    "sglang.srt.mem_cache.memory_pool.HybridLinearKVPool",
    "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool",
    "sglang.srt.arg_groups.model_overrides.deepseek_v2._deepseek_family_overrides",
    "sglang.kernels.ops.attention.dsa.transform_index",
)


@dataclass(frozen=True)
class FlashShape:
    """Every dimension of a covered GLM-5.3-Flash decoder layer (and the rank it is cut for)."""

    hidden: int = 4096
    rms_eps: float = 1e-5
    # mHC (hyper-connection residual streams)
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    hc_post_mult: float = 2.0  # models/glm5_next.py _MHC_POST_MULT_VALUE
    # sparse MLA
    heads: int = 64
    q_lora: int = 1536
    kv_lora: int = 512
    qk_nope: int = 256
    qk_rope: int = 0
    v_head: int = 256
    # pooled-key indexer
    index_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 2048
    index_kpool: int = 4
    index_k_norm_eps: float = 1e-6  # LayerNorm built without eps: torch's default
    # KDA
    kda_heads: int = 64
    kda_head_dim: int = 128
    conv_kernel: int = 4
    gate_lower_bound: float | None = None
    # MoE
    n_experts: int = 288
    top_k: int = 8
    n_shared: int = 1
    moe_inter: int = 2048
    routed_scaling: float = 2.5
    norm_topk_prob: bool = True
    swiglu_limit: float = 10.0
    # quantisation and paging
    block: int = 128  # FP8 block (checkpoint weight_block_size)
    mx_group: int = 32  # MXFP4 elements per e8m0 scale
    page: int = 256  # KV page tokens: 64 * index_kpool
    tp_size: int = 1
    tp_rank: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} not in [0, {self.tp_size})")
        for name, total in (
            ("heads", self.heads),
            ("kda_heads", self.kda_heads),
            ("moe_inter", self.moe_inter),
        ):
            if total % self.tp_size:
                raise ValueError(f"{name}={total} is not divisible by tp_size={self.tp_size}")
        # SGLang shards block-quantised weights along whole blocks only (a shard cutting a
        # block would need requantisation, which SGLang never does).
        b, g = self.block, self.mx_group
        for name, size, unit in (
            ("q_b rows per rank", self.heads_per_rank * self.qk_head, b),
            ("MLA o_proj cols per rank", self.heads_per_rank * self.v_head, b),
            ("KDA q (k, v) rows per rank", self.kda_proj_per_rank, b),
            ("KDA o_proj cols per rank", self.kda_proj_per_rank, b),
            ("shared inter per rank", self.shared_inter_per_rank, b),
            ("moe_inter per rank (MXFP4 groups)", self.moe_inter_per_rank, g),
            ("hidden (MXFP4 groups)", self.hidden, g),
            ("hidden", self.hidden, b),
        ):
            if size % unit:
                raise ValueError(f"{name}={size} is not a multiple of {unit}")
        if self.qk_rope:
            raise ValueError("GLM-5.3-Flash's MLA has no RoPE (qk_rope_head_dim 0)")
        if self.index_head_dim & (self.index_head_dim - 1):
            raise ValueError("index_head_dim must be a power of 2 (Hadamard rotation)")
        if self.index_topk % self.index_kpool:
            raise ValueError("index_topk must be a multiple of index_kpool")
        if self.page % self.index_kpool:
            raise ValueError("the page must hold whole pooled groups")

    # ---- derived sizes ---------------------------------------------------------------------
    @property
    def hc_dim(self) -> int:
        """Width of the mHC streams a token: hc_mult * hidden (16384)."""
        return self.hc_mult * self.hidden

    @property
    def mix_hc(self) -> int:
        """Rows of hc_*_fn: (2 + hc_mult) * hc_mult mixes (24)."""
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def qk_head(self) -> int:
        return self.qk_nope + self.qk_rope

    @property
    def kv_cache_dim(self) -> int:
        """Values a token in the bf16 MLA cache: kv_lora + rope (512)."""
        return self.kv_lora + self.qk_rope

    @property
    def qkv_a_out(self) -> int:
        """Rows of fused_qkv_a_proj_with_mqa: q_lora + kv_lora + rope (2048)."""
        return self.q_lora + self.kv_lora + self.qk_rope

    @property
    def heads_per_rank(self) -> int:
        return self.heads // self.tp_size

    @property
    def softmax_scale(self) -> float:
        """MLA `layer.scaling` = qk_head ** -0.5; no RoPE, so no YaRN mscale."""
        return self.qk_head**-0.5

    @property
    def kda_proj(self) -> int:
        """q (or k, v, forget gate, output gate) width of a KDA layer: heads x head_dim (8192)."""
        return self.kda_heads * self.kda_head_dim

    @property
    def kda_heads_per_rank(self) -> int:
        return self.kda_heads // self.tp_size

    @property
    def kda_proj_per_rank(self) -> int:
        return self.kda_proj // self.tp_size

    @property
    def conv_dim_per_rank(self) -> int:
        """Channels of this rank's conv state: q|k|v (3 x 8192 / tp)."""
        return 3 * self.kda_proj_per_rank

    @property
    def kda_scale(self) -> float:
        return self.kda_head_dim**-0.5

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
    def index_page(self) -> int:
        """Pooled index keys one index-K page holds: page / kpool (64)."""
        return self.page // self.index_kpool

    @property
    def index_k_token_bytes(self) -> int:
        """Bytes a pooled key takes in the index-K cache: fp8 key + one fp32 scale (132)."""
        return self.index_head_dim + 4

    @property
    def group_topk(self) -> int:
        """Pooled groups the indexer selects: index_topk / kpool (512)."""
        return self.index_topk // self.index_kpool

    @property
    def topk_width(self) -> int:
        """Token indices the indexer returns a row: index_topk + kpool - 1 (2051)."""
        return self.index_topk + self.index_kpool - 1

    @property
    def index_softmax_scale(self) -> float:
        return self.index_head_dim**-0.5

    # ---- constructors ----------------------------------------------------------------------
    def tp_shard(self, tp_size: int, tp_rank: int) -> FlashShape:
        """The same layer cut for rank `tp_rank` of `tp_size`."""
        return dataclasses.replace(self, tp_size=tp_size, tp_rank=tp_rank)

    @property
    def whole(self) -> FlashShape:
        return self.tp_shard(1, 0)

    @classmethod
    def from_hf_config(cls, hf_config: Any, tp_size: int = 1, tp_rank: int = 0) -> FlashShape:
        """Read the dims from a `Glm5NextConfig` or its `text_config` (SGLang's getattr defaults)."""
        c = getattr(hf_config, "text_config", hf_config)
        lin = getattr(c, "linear_attn_config", None) or {}
        if getattr(c, "n_group", 1) != 1 or getattr(c, "topk_group", 1) != 1:
            raise NotImplementedError("grouped routing (n_group > 1) is not covered")
        if getattr(c, "qk_rope_head_dim", 0):
            raise NotImplementedError("an MLA with RoPE is not GLM-5.3-Flash")
        return cls(
            hidden=c.hidden_size,
            rms_eps=float(c.rms_norm_eps),
            hc_mult=c.hc_mult,
            hc_sinkhorn_iters=c.hc_sinkhorn_iters,
            hc_eps=float(c.hc_eps),
            heads=c.num_attention_heads,
            q_lora=c.q_lora_rank,
            kv_lora=c.kv_lora_rank,
            qk_nope=c.qk_nope_head_dim,
            qk_rope=c.qk_rope_head_dim,
            v_head=c.v_head_dim,
            index_heads=c.index_n_heads,
            index_head_dim=c.index_head_dim,
            index_topk=c.index_topk,
            index_kpool=getattr(c, "index_kpool", 1),
            kda_heads=lin.get("num_heads", c.linear_num_heads),
            kda_head_dim=lin.get("head_dim", c.linear_head_dim),
            conv_kernel=lin.get("short_conv_kernel_size", c.linear_conv_kernel_dim),
            gate_lower_bound=lin.get("gate_lower_bound", getattr(c, "gate_lower_bound", None)),
            n_experts=c.n_routed_experts,
            top_k=c.num_experts_per_tok,
            n_shared=c.n_shared_experts or 0,
            moe_inter=c.moe_intermediate_size,
            routed_scaling=float(c.routed_scaling_factor),
            norm_topk_prob=bool(c.norm_topk_prob),
            swiglu_limit=float(c.swiglu_limit),
            page=64 * getattr(c, "index_kpool", 1),
            tp_size=tp_size,
            tp_rank=tp_rank,
        )


@dataclass(frozen=True)
class FlashModel:
    """The layer pattern of the whole model and the pool index of each layer's state.

    Layers `first_dense` .. `num_layers - 2` are covered (launched); the dense layers before
    and the last layer (whose FFN update also contracts the streams, `hc_contract`) stay on
    SGLang's path. A layer is KDA unless it is in `full_attn_layers` (default: idx % 4 == 3,
    as `Glm5NextTextConfig` builds `linear_attn_config` without `layer_types`).
    """

    num_layers: int = 45
    first_dense: int = 3
    full_attn_layers: tuple[int, ...] = tuple(i for i in range(45) if i % 4 == 3)

    def is_kda(self, layer_id: int) -> bool:
        return layer_id not in self.full_attn_layers

    @property
    def kda_layers(self) -> tuple[int, ...]:
        """Every KDA layer, in the order SGLang's MambaPool stacks their states."""
        return tuple(i for i in range(self.num_layers) if self.is_kda(i))

    @property
    def covered_layers(self) -> range:
        return range(self.first_dense, self.num_layers - 1)

    @property
    def covered_kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i in self.covered_layers if self.is_kda(i))

    @property
    def covered_mla_layers(self) -> tuple[int, ...]:
        return tuple(i for i in self.covered_layers if not self.is_kda(i))

    def pool_index(self, layer_id: int) -> tuple[str, int]:
        """Where layer `layer_id`'s decode state lives: ("mamba", i) is
        `MambaPool.mamba_cache.conv[0][i]` / `.temporal[i]` (HybridReqToTokenPool.mamba_map);
        ("kv", i) is the i-th layer of the DSA KV pool under `HybridLinearKVPool`
        (`full_attention_layer_id_mapping`)."""
        if not 0 <= layer_id < self.num_layers:
            raise ValueError(f"layer {layer_id} not in [0, {self.num_layers})")
        if self.is_kda(layer_id):
            return "mamba", self.kda_layers.index(layer_id)
        return "kv", self.full_attn_layers.index(layer_id)

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> FlashModel:
        c = getattr(hf_config, "text_config", hf_config)
        lin = c.linear_attn_config
        return cls(
            num_layers=c.num_hidden_layers,
            first_dense=c.first_k_dense_replace,
            full_attn_layers=tuple(sorted(lin["full_attn_layers"])),
        )


#: Glm5NextTextConfig defaults plus the checkpoint's values (see the module docstring), TP1.
REAL = FlashShape()
REAL_MODEL = FlashModel()


def tiny(tp_size: int = 1, tp_rank: int = 0, **overrides: Any) -> FlashShape:
    """A GLM-5.3-Flash-shaped layer small enough for the CPU: same structure (mHC with 4
    streams and 20 Sinkhorn iterations, KDA with a kernel-4 conv, MLA without RoPE and a
    4-token pooled indexer, MXFP4 routed + FP8 shared experts), FP8 block 32, page 16.
    tp_size may be 1, 2 or 4."""
    params: dict[str, Any] = dict(
        hidden=256,
        heads=4,
        q_lora=64,
        kv_lora=32,
        qk_nope=32,
        v_head=32,
        index_heads=2,
        index_head_dim=32,
        index_topk=16,
        index_kpool=4,
        kda_heads=4,
        kda_head_dim=32,
        n_experts=8,
        top_k=2,
        moe_inter=128,
        block=32,
        mx_group=32,
        page=16,
        tp_size=tp_size,
        tp_rank=tp_rank,
    )
    params.update(overrides)
    return FlashShape(**params)


def tiny_model() -> FlashModel:
    """Seven layers: dense 0..1, KDA 2, MLA 3, KDA 4, MLA 5 covered, 6 last (uncovered)."""
    return FlashModel(num_layers=7, first_dense=2, full_attn_layers=(3, 5))
