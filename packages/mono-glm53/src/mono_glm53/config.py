"""Shapes of one GLM-5.3 MoE decoder layer, whole or as one TP rank's shard.

`GlmLayerShape` holds every dimension the reference, the weight builders, the benchmark and
the kernels need, plus the per-rank sizes derived from `tp_size` / `tp_rank`.

Values follow what SGLang 0.5.23 reads from an HF `GlmMoeDsaConfig` (transformers 5.19
defaults are `REAL`), including the attributes SGLang reads with `getattr` defaults:

* `rope_interleave` (MLA RoPE; `getattr(config, "rope_interleave", True)`, so the MLA rope is
  interleaved / GPT-J style unless the config says otherwise; models/deepseek_v2.py,
  `DeepseekV2AttentionMLA.__init__`).
* `indexer_rope_interleave` (indexer RoPE; `getattr(config, "indexer_rope_interleave", False)`,
  so neox style by default; the GLM-5.x checkpoints set it True). It also picks the CUDA
  indexer path: interleaved -> the fused path (`use_dsa_indexer_fusion`, no Hadamard, bf16
  `wk_weights_proj`), neox -> the unfused path with the Hadamard rotation
  (layers/attention/dsa/dsa_indexer.py, `Indexer.__init__` and `_maybe_rotate`).
* the indexer's `k_norm` is a `LayerNorm` built without an eps, so its eps is LayerNorm's
  default 1e-6, not `rms_norm_eps`.

FP8 block size: `block` is a field. The real model uses 128 (checkpoint `weight_block_size`
[128, 128]); `tiny()` uses 32 so its dims can stay small while keeping the same structure
(every sharded dim still a whole number of blocks). The index-K quantisation group is the
whole index head (`index_head_dim`), as SGLang's CUDA kernels hard-code (one fp32 scale per
token), so an index-K cache token takes `index_head_dim + 4` bytes (132 for the real model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["GlmLayerShape", "REAL", "REAL_INTERLEAVED", "SHAPE_NAMES", "named_shape", "tiny"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GlmLayerShape:
    """Every dimension of one GLM-5.3 MoE decoder layer (and the rank it is cut for)."""

    hidden: int = 6144
    q_lora: int = 2048
    kv_lora: int = 512
    qk_nope: int = 192
    qk_rope: int = 64
    v_head: int = 256
    heads: int = 64
    index_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 2048
    n_experts: int = 256
    top_k: int = 8
    moe_inter: int = 2048
    n_shared: int = 1
    routed_scaling: float = 2.5
    norm_topk_prob: bool = True
    rms_eps: float = 1e-5
    index_k_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    indexer_rope_interleave: bool = False
    max_position: int = 202752
    block: int = 128
    page: int = 64
    tp_size: int = 1
    tp_rank: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} not in [0, {self.tp_size})")
        for name, total in (
            ("heads", self.heads),
            ("moe_inter", self.moe_inter),
        ):
            if total % self.tp_size:
                raise ValueError(f"{name}={total} is not divisible by tp_size={self.tp_size}")
        b = self.block
        # SGLang shards FP8 block-quantised weights along whole 128-blocks only; a shard that
        # cut a block would need requantisation, which SGLang never does.
        for name, size in (
            ("q_b rows per rank", self.heads_per_rank * self.qk_head),
            ("o_proj cols per rank", self.heads_per_rank * self.v_head),
            ("moe_inter per rank", self.moe_inter_per_rank),
            ("shared inter per rank", self.shared_inter_per_rank),
            ("hidden", self.hidden),
            ("q_lora", self.q_lora),
        ):
            if size % b:
                raise ValueError(f"{name}={size} is not a multiple of block={b}")
        if self.index_head_dim & (self.index_head_dim - 1):
            raise ValueError("index_head_dim must be a power of 2 (Hadamard rotation)")
        if self.qk_rope > self.index_head_dim:
            raise ValueError("qk_rope must fit in the index head")
        if self.page & (self.page - 1):
            raise ValueError("page must be a power of 2")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def qk_head(self) -> int:
        """q/k head width before absorption: nope + rope (256)."""
        return self.qk_nope + self.qk_rope

    @property
    def kv_cache_dim(self) -> int:
        """Values per token in the bf16 MLA cache: kv_lora + rope (576)."""
        return self.kv_lora + self.qk_rope

    @property
    def qkv_a_out(self) -> int:
        """Rows of `fused_qkv_a_proj_with_mqa`: q_lora + kv_lora + rope (2624)."""
        return self.q_lora + self.kv_lora + self.qk_rope

    @property
    def heads_per_rank(self) -> int:
        return self.heads // self.tp_size

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
    def softmax_scale(self) -> float:
        """MLA `layer.scaling` = qk_head ** -0.5 (no YaRN mscale: the default config has no
        rope_scaling, so `compute_mla_mscale_scaling` is not applied)."""
        return self.qk_head**-0.5

    @property
    def index_softmax_scale(self) -> float:
        return self.index_head_dim**-0.5

    @property
    def indexer_fused(self) -> bool:
        """Whether SGLang's CUDA indexer takes the fused path (interleaved indexer rope)."""
        return self.indexer_rope_interleave

    @property
    def indexer_hadamard(self) -> bool:
        """Whether the Hadamard rotation is applied to index q and k (CUDA: unfused path only)."""
        return not self.indexer_fused

    @property
    def index_k_token_bytes(self) -> int:
        """Bytes per token in the paged index-K cache: fp8 key + one fp32 scale."""
        return self.index_head_dim + 4

    @property
    def index_k_page_bytes(self) -> int:
        return self.page * self.index_k_token_bytes

    def nblk(self, n: int) -> int:
        """Number of FP8 blocks covering `n` (last block may be partial)."""
        return _cdiv(n, self.block)

    # ---- constructors --------------------------------------------------------------------
    def tp_shard(self, tp_size: int, tp_rank: int) -> GlmLayerShape:
        """The same layer cut for rank `tp_rank` of `tp_size`."""
        return dataclasses.replace(self, tp_size=tp_size, tp_rank=tp_rank)

    @property
    def whole(self) -> GlmLayerShape:
        return self.tp_shard(1, 0)

    @classmethod
    def from_hf_config(cls, hf_config: Any, tp_size: int = 1, tp_rank: int = 0) -> GlmLayerShape:
        """Read the dims from an HF `GlmMoeDsaConfig` (or any object with its attributes),
        with the same `getattr` defaults SGLang 0.5.23 uses."""
        c = hf_config
        # Like DeepseekV2DecoderLayer.__init__: rope_parameters when the config has it
        # (transformers 5), else rope_theta / rope_scaling.
        if getattr(c, "rope_parameters", None) is not None:
            rope_theta = c.rope_parameters["rope_theta"]
            scaled = c.rope_parameters.get("rope_type") not in (None, "default")
        else:
            rope_theta = getattr(c, "rope_theta", 10000.0)
            scaled = bool(getattr(c, "rope_scaling", None))
        if scaled:
            raise NotImplementedError(
                "rope scaling (YaRN) changes layer.scaling and the cos/sin cache; the "
                "reference covers the default config only"
            )
        if getattr(c, "n_group", 1) != 1 or getattr(c, "topk_group", 1) != 1:
            raise NotImplementedError("grouped routing with n_group > 1 is not covered")
        if getattr(c, "index_kpool", 1) != 1:
            raise NotImplementedError("index_kpool > 1 (IndexerKPool) is not covered")
        if getattr(c, "index_k_norm_type", "layer") != "layer":
            raise NotImplementedError("an RMSNorm index k_norm is not covered")
        return cls(
            hidden=c.hidden_size,
            q_lora=c.q_lora_rank,
            kv_lora=c.kv_lora_rank,
            qk_nope=c.qk_nope_head_dim,
            qk_rope=c.qk_rope_head_dim,
            v_head=c.v_head_dim,
            heads=c.num_attention_heads,
            index_heads=c.index_n_heads,
            index_head_dim=c.index_head_dim,
            index_topk=c.index_topk,
            n_experts=c.n_routed_experts,
            top_k=c.num_experts_per_tok,
            moe_inter=c.moe_intermediate_size,
            n_shared=c.n_shared_experts or 0,
            routed_scaling=float(c.routed_scaling_factor),
            norm_topk_prob=bool(getattr(c, "norm_topk_prob", True)),
            rms_eps=float(c.rms_norm_eps),
            rope_theta=float(rope_theta),
            rope_interleave=bool(getattr(c, "rope_interleave", True)),
            indexer_rope_interleave=bool(getattr(c, "indexer_rope_interleave", False)),
            max_position=int(getattr(c, "max_position_embeddings", 202752)),
            tp_size=tp_size,
            tp_rank=tp_rank,
        )


#: GlmMoeDsaConfig defaults (transformers 5.19), TP1. Real checkpoints set
#: `indexer_rope_interleave=True`; use `REAL_INTERLEAVED` for that variant.
REAL = GlmLayerShape()
REAL_INTERLEAVED = dataclasses.replace(REAL, indexer_rope_interleave=True)


def tiny(tp_size: int = 1, tp_rank: int = 0, **overrides: Any) -> GlmLayerShape:
    """A GLM-5.3-shaped layer small enough for the CPU and the Triton interpreter.

    Same structure (MLA with q/kv LoRA, DSA indexer, 1 shared + top-k of E routed experts),
    block 32 instead of 128, 16-token pages, top-16 sparse attention. tp_size may be 1, 2 or 4.
    """
    params = dict(
        hidden=256,
        q_lora=128,
        kv_lora=64,
        qk_nope=48,
        qk_rope=16,
        v_head=32,
        heads=4,
        index_heads=2,
        index_head_dim=32,
        index_topk=16,
        n_experts=8,
        top_k=2,
        moe_inter=128,
        n_shared=1,
        max_position=4096,
        block=32,
        page=16,
        tp_size=tp_size,
        tp_rank=tp_rank,
    )
    params.update(overrides)
    return GlmLayerShape(**params)


#: The shapes the bench, the GPU tests and the cache warmer name: the whole layer ("tp1") or one
#: TP8 rank's shard ("tp8"), with the HF config's default indexer (neox rope: SGLang's unfused
#: indexer path, with the Hadamard rotation) or, with an "i", the GLM-5.x checkpoints' (their
#: `indexer_rope_interleave=True`: the fused indexer path, what a served checkpoint launches).
SHAPE_NAMES = ("tp1", "tp8", "tp1i", "tp8i")


def named_shape(name: str, use_tiny: bool = False) -> GlmLayerShape:
    """The shape `name` (`SHAPE_NAMES`) at REAL's dims, or tiny's (`use_tiny`: its widest shard
    is TP4, under the tp8 names); an unknown name raises ValueError listing the known ones."""
    if name not in SHAPE_NAMES:
        raise ValueError(f"shape {name!r} is not one of {', '.join(SHAPE_NAMES)}")
    base = tiny() if use_tiny else REAL
    if name.endswith("i"):
        base = dataclasses.replace(base, indexer_rope_interleave=True)
    tp = 1 if name.startswith("tp1") else (4 if use_tiny else 8)
    return base.tp_shard(tp, 0)
