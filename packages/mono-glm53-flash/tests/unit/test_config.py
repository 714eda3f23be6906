"""GLM-5.3-Flash's shapes and layer pattern against SGLang 0.5.23's own config classes."""

from __future__ import annotations

import dataclasses

import pytest
from sglang.srt.configs.glm5_next import Glm5NextConfig, Glm5NextTextConfig

from mono_glm53_flash.config import REAL, REAL_MODEL, FlashModel, FlashShape, tiny, tiny_model

# What the checkpoint sets where Glm5NextTextConfig's default is None or off.
CHECKPOINT_TEXT = {
    "mhc": True,
    "swiglu_limit": 10.0,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "index_kpool": 4,
    "index_kpool_compress": True,
    "index_kpool_always_select_tail": True,
}


def test_real_is_sglangs_config_with_the_checkpoint_values():
    hf = Glm5NextConfig(text_config=CHECKPOINT_TEXT, architectures=["Glm5NextForConditionalGeneration"])
    assert FlashShape.from_hf_config(hf) == REAL
    assert FlashShape.from_hf_config(hf.text_config, tp_size=8, tp_rank=3) == REAL.tp_shard(8, 3)
    d = Glm5NextTextConfig()
    assert (d.hidden_size, d.n_routed_experts, d.num_experts_per_tok, d.n_shared_experts) == (4096, 288, 8, 1)
    assert (d.q_lora_rank, d.kv_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim) == (1536, 512, 256, 0, 256)
    assert (d.linear_num_heads, d.linear_head_dim, d.linear_conv_kernel_dim) == (64, 128, 4)
    assert (d.hc_mult, d.hc_sinkhorn_iters, d.hc_eps) == (4, 20, 1e-6)
    assert REAL.mix_hc == 24 and REAL.hc_dim == 16384 and REAL.softmax_scale == 256**-0.5


def test_the_index_width_is_sglangs():
    from sglang.srt.configs.model_config import get_dsa_mtp_topk_width

    hf = Glm5NextConfig(text_config=CHECKPOINT_TEXT)
    assert get_dsa_mtp_topk_width(hf.text_config) == REAL.topk_width == 2051
    assert REAL.group_topk == 512 and REAL.page == 256 and REAL.index_page == 64
    assert REAL.index_k_token_bytes == 132


def test_layer_pattern_and_pool_indices_are_sglangs():
    hf = Glm5NextConfig(text_config=CHECKPOINT_TEXT).text_config
    model = FlashModel.from_hf_config(hf)
    assert model == REAL_MODEL
    assert list(model.kda_layers) == hf.linear_layer_ids
    assert list(model.full_attn_layers) == hf.full_attention_layer_ids
    assert len(model.covered_kda_layers) == 30 and len(model.covered_mla_layers) == 11
    assert model.covered_layers == range(3, 44)
    # MambaPool stacks the KDA layers in linear_layer_ids order (HybridReqToTokenPool.mamba_map);
    # HybridLinearKVPool numbers the full-attention layers in order
    for i, layer in enumerate(hf.linear_layer_ids):
        assert model.pool_index(layer) == ("mamba", i)
    for i, layer in enumerate(hf.full_attention_layer_ids):
        assert model.pool_index(layer) == ("kv", i)
    with pytest.raises(ValueError):
        model.pool_index(45)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_state_shapes_are_kimi_linear_state_shape(tp):
    from sglang.srt.configs.mamba_utils import KimiLinearStateShape

    shape = KimiLinearStateShape.create(tp_world_size=tp, num_heads=64, head_dim=128, conv_kernel_size=4)
    s = REAL.tp_shard(tp, 0)
    assert list(shape.conv[0]) == [s.conv_kernel - 1, s.conv_dim_per_rank]
    assert tuple(shape.temporal) == (s.kda_heads_per_rank, s.kda_head_dim, s.kda_head_dim)


def test_tp_shards_cut_whole_blocks_and_refuse_otherwise():
    for tp in (2, 4, 8):
        s = REAL.tp_shard(tp, tp - 1)
        assert s.kda_proj_per_rank % s.block == 0 and s.moe_inter_per_rank % s.mx_group == 0
    for tp in (1, 2, 4):
        tiny(tp, tp - 1)
    with pytest.raises(ValueError, match="heads=4 is not divisible by tp_size=8"):
        tiny(8, 0)
    with pytest.raises(ValueError, match="shared inter per rank=16 is not a multiple of 32"):
        tiny(4, 0, moe_inter=64)  # an FP8 block of the shared expert would be cut
    with pytest.raises(ValueError, match=r"moe_inter per rank \(MXFP4 groups\)=16 is not a multiple of 32"):
        tiny(4, 0, moe_inter=64, block=16)  # an MXFP4 group would be cut
    with pytest.raises(ValueError, match="tp_rank"):
        REAL.tp_shard(4, 4)
    with pytest.raises(ValueError, match="no RoPE"):
        dataclasses.replace(REAL, qk_rope=64)


def test_tiny_model_has_both_kinds_covered():
    m = tiny_model()
    assert m.covered_kda_layers == (2, 4) and m.covered_mla_layers == (3, 5)
