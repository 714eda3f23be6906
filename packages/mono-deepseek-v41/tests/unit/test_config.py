"""The shapes against SGLang 0.5.23's config classes: the defaults are DeepSeekV4Config's, the
V4.1 flags DeepseekV41Config's, a checkpoint-style config reads back exactly, and a structure
the reference cannot serve is refused at construction."""

from __future__ import annotations

import dataclasses

import pytest

from mono_deepseek_v41 import config as C

pytest.importorskip("sglang")

# DsV41Shape field -> DeepSeekV4Config attribute
FIELDS = {
    "hidden": "hidden_size", "num_layers": "num_hidden_layers", "heads": "num_attention_heads",
    "rope_dim": "qk_rope_head_dim", "q_lora": "q_lora_rank", "o_lora": "o_lora_rank", "o_groups": "o_groups",
    "window": "window_size", "n_experts": "n_routed_experts", "top_k": "num_experts_per_tok",
    "n_shared": "n_shared_experts", "moe_inter": "moe_intermediate_size", "routed_scaling": "routed_scaling_factor",
    "index_heads": "index_n_heads", "index_head_dim": "index_head_dim", "index_topk": "index_topk",
    "num_hash_layers": "n_hash_layers", "hc_mult": "hc_mult", "hc_sinkhorn_iters": "hc_sinkhorn_iters",
    "hc_eps": "hc_eps", "rms_eps": "rms_norm_eps", "rope_theta": "rope_theta",
    "compress_rope_theta": "compress_rope_theta", "max_position": "max_position_embeddings",
    "vocab": "vocab_size", "image_token_id": "image_token_id",
}


def test_defaults_are_deepseek_v4_config_defaults():
    from sglang.srt.configs.deepseek_v4 import DeepSeekV4Config

    # the dataclass's declared defaults (constructing it needs a full quantization config)
    cfg = {f.name: f.default for f in dataclasses.fields(DeepSeekV4Config) if f.default is not dataclasses.MISSING}
    for mine, theirs in FIELDS.items():
        assert getattr(C.DEFAULTS, mine) == cfg[theirs], mine
    assert C.DEFAULTS.head_dim == cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    assert C.DEFAULTS.window == 128  # SGLang's SWA_WINDOW


def test_v41_flags_and_flash_gates():
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config
    from sglang.srt.layers.attention.deepseek_v4_backend import SWA_WINDOW

    assert DeepseekV41Config.hc_pre_from_prev_sublayer is True and DeepseekV41Config.q_head_norm is False
    assert C.V41_FLASH.window == SWA_WINDOW
    for name, (value, where) in C.V41_FLASH_GATES.items():
        assert getattr(C.V41_FLASH, name) == value and where, name
    for name in C.V41_FLASH_UNKNOWN:
        assert getattr(C.V41_FLASH, name) == getattr(C.DEFAULTS, name), name
    assert C.V41_FLASH.group_in_dim == 4096 and C.V41_FLASH.hc_dim == 20480 and C.V41_FLASH.mix_hc == 24


def test_checkpoint_config_reads_back():
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config

    t = C.tiny()
    values = dict(
        architectures=["DeepseekV41ForCausalLM"], hidden_size=t.hidden, num_hidden_layers=t.num_layers,
        num_attention_heads=t.heads, num_key_value_heads=1, head_dim=t.head_dim, qk_rope_head_dim=t.rope_dim,
        qk_nope_head_dim=t.nope_dim, q_lora_rank=t.q_lora, o_lora_rank=t.o_lora, o_groups=t.o_groups,
        window_size=t.window, n_routed_experts=t.n_experts, num_experts_per_tok=t.top_k, n_shared_experts=1,
        moe_intermediate_size=t.moe_inter, routed_scaling_factor=t.routed_scaling, swiglu_limit=t.swiglu_limit,
        index_n_heads=t.index_heads, index_head_dim=t.index_head_dim, index_topk=t.index_topk,
        compress_ratios=list(t.compress_ratios), kv_source_layer_ids=list(t.kv_source_layer_ids),
        index_source_layer_ids=list(t.index_source_layer_ids), num_hash_layers=t.num_hash_layers,
        hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=t.rms_eps, rope_theta=t.rope_theta,
        compress_rope_theta=t.compress_rope_theta, max_position_embeddings=t.max_position, vocab_size=t.vocab,
        image_token_id=t.image_token_id, scoring_func="sqrtsoftplus",
        rope_scaling={"type": "yarn", "factor": t.rope_factor,
                      "original_max_position_embeddings": t.rope_original_max_position,
                      "beta_fast": 32, "beta_slow": 1},
    )
    hf = DeepseekV41Config(**values)
    assert hf.model_type == "deepseek_v41" and hf.architectures == ["DeepseekV4ForCausalLM"]
    got = C.DsV41Shape.from_hf_config(hf)
    keep = ("page_size", "index_page_size", "fp8_block", "mxfp4_group", "candidate_source_layer_id", "engram_layer_ids")
    want = dataclasses.replace(t, **{k: getattr(got, k) for k in keep})
    assert got == want


def test_tiny_kinds_ranks_and_rings():
    t = C.tiny()
    assert [t.layer_kind(i).kv_source_layer for i in range(t.num_layers)] == [None, 1, 2, None, None, 1, 2, 1]
    assert [t.layer_kind(i).hash_routed for i in range(t.num_layers)] == [True, True] + [False] * 6
    assert t.rope_base(0) == t.rope_theta and t.rope_base(4) == t.compress_rope_theta
    assert t.rope_yarn(0) == (0, 1.0) and t.rope_yarn(3) == (t.rope_original_max_position, t.rope_factor)
    for tp in (2, 4):
        r = t.tp_shard(tp, tp - 1)
        assert r.heads_per_rank * tp == t.heads and r.groups_per_rank * tp == t.o_groups
    assert t.with_draft_tokens(6).swa_ring == t.window + 5


@pytest.mark.parametrize("bad, msg", [
    (dict(tp_size=3), "not divisible"),
    (dict(compress_ratios=(0, 3, 2, 4, 128, 1, 2, 1)), "not among"),
    (dict(kv_source_layer_ids=(2,)), "no preceding kv_source"),
    (dict(index_source_layer_ids=(0,)), "not 1 or 2"),
    (dict(index_head_dim=48), "power of 2"),
    (dict(rope_dim=96, index_head_dim=64), "RoPE tail"),
])
def test_structures_the_reference_cannot_serve_are_refused(bad, msg):
    with pytest.raises(ValueError, match=msg):
        C.tiny(**bad)
