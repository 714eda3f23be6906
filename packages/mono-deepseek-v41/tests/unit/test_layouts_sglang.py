"""The state and weight layouts against SGLang 0.5.23's own writers, readers and loaders (CPU).

Pools: the V4 KV rows (SGLang's torch writer `set_k_and_s_torch` and reader
`dequantize_k_cache_paged_ref`), the fp4 index-K pool (`get_index_k_dequant`), the
compress-state row addressing (`CompressStatePool.translate_*`). Weights: the checkpoint name
remapping, the compressor's ape hotfix, the per-runtime expert forms, TP sharding.
"""

from __future__ import annotations

import types

import pytest
import torch

from mono_deepseek_v41 import layouts as L
from mono_deepseek_v41 import quant as Q
from mono_deepseek_v41 import weights as W
from mono_deepseek_v41.config import tiny

pytest.importorskip("sglang")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (torch.equal has no CPU kernel for the fp8 / fp4 dtypes)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 1:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def test_v4_rows_equal_sglang_torch_writer_and_reader():
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout
    from sglang.kernels.ops.kvcache.dsv4_main_kv_store import NopeFp8RopeBf16Pack
    from sglang.test.kernels.deepseek_v4.k_cache_reference import dequantize_k_cache_paged_ref, set_k_and_s_torch

    torch.manual_seed(30)
    page = 64
    assert L.v4_token_bytes(448, 64) == KVLayout.V4.bytes_per_token
    assert L.v4_page_bytes(page, 448, 64) == KVLayout.V4.page_bytes(page)
    rows = torch.randn(6, 512) * torch.tensor([1e-6, 0.01, 1, 10, 300, 1e4])[:, None]
    loc = torch.tensor([0, 5, 63, 64, 127, 150])
    q, exp, rope = Q.kv_quant_v4(rows, 448)
    mine = torch.zeros(3, KVLayout.V4.page_bytes(page), dtype=torch.uint8)
    L.v4_write(mine, loc, q, exp, rope, page)
    theirs = torch.zeros_like(mine)
    set_k_and_s_torch(theirs, loc, NopeFp8RopeBf16Pack(q, rope, exp), page)
    assert torch.equal(mine, theirs)
    back = L.v4_read(mine, loc, page, 448, 64)
    assert torch.equal(back, dequantize_k_cache_paged_ref(mine, loc, page)[:, 0])
    # what the pool keeps: rope exactly bf16; nope within half an e4m3 step of its tile's top
    # binade (2^-4 of 448 x scale <= 2 x amax, the amax floored at 1e-4 as the store floors it)
    assert torch.equal(back[:, 448:], rows[:, 448:].bfloat16())
    tile = rows[:, :448].unflatten(-1, (7, 64))
    err = (back[:, :448].float().unflatten(-1, (7, 64)) - tile).abs().amax(-1)
    assert bool((err <= 2**-3 * tile.abs().amax(-1).clamp_min(1e-4)).all())


def test_fp4_index_pool_equals_get_index_k_dequant():
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4IndexerPool

    torch.manual_seed(31)
    d, page = 128, 64
    buf = torch.zeros(3, page * L.index_fp4_row_bytes(d), dtype=torch.uint8)
    keys = Q.fake_quant_fp4(torch.randn(7, d) * 2)
    loc = torch.tensor([0, 1, 63, 64, 100, 128, 191])
    L.index_fp4_write(buf, loc, keys, page)
    pool = types.SimpleNamespace(use_fp4_indexer=True, index_k_with_scale_buffer=[buf], start_layer=0,
                                 page_size=page, size=3 * page)
    theirs = DeepSeekV4IndexerPool.get_index_k_dequant(pool, 0, loc)
    mine = L.index_fp4_read(buf, loc, page, d)
    assert torch.equal(mine.bfloat16(), theirs) and torch.equal(mine, keys)


def test_state_locs_equal_compress_state_pool():
    from sglang.srt.mem_cache.deepseek_v4_compress_state import CompressStatePool

    pool = types.SimpleNamespace(swa_page_size=256, ring_size=8)
    swa = torch.tensor([0, 7, 8, 255, 256, 300, -1])
    want = CompressStatePool.translate_from_swa_loc_to_state_loc(pool, swa.clone())
    got = L.swa_ring_loc(swa, 8, 256)
    assert torch.equal(got[:-1], want[:-1]) and want[-1] == -1
    pool.ring_size = 128
    req, pos = torch.tensor([0, 1, 3, 2]), torch.tensor([5, 130, 127, -1])
    want = CompressStatePool.translate_from_req_position_to_state_loc(pool, req, pos.clone())
    got = L.req_ring_loc(req, pos, 128, rows=4 * 128 + 1)
    assert torch.equal(got[:-1], want[:-1]) and want[-1] == -1 and got[-1] == 4 * 128


def test_ring_sizes_equal_get_compress_state_ring_size():
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import get_compress_state_ring_size

    for drafts in (0, 3, 6):
        s = tiny(draft_tokens=max(1, drafts))
        for ratio in (2, 4, 128):
            assert s.ring_size(ratio) == get_compress_state_ring_size(ratio, drafts if drafts > 1 else 0)


def test_ape_hotfix_equals_compressor_hotfix():
    from sglang.srt.layers.attention.dsv4.compressor import Compressor

    torch.manual_seed(32)
    for ratio in (4, 128):
        ape = torch.randn(ratio, (2 if ratio == 4 else 1) * 16)
        fake = types.SimpleNamespace(ape=torch.nn.Parameter(ape.clone()), overlap=ratio == 4, ratio=ratio,
                                     ape_converted=False)
        Compressor._apply_ape_hotfix(fake)
        assert torch.equal(L.ape_hotfix(ape, ratio), fake.ape.data)


def test_checkpoint_names_remap_as_sglang_loads_them():
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM

    s = tiny()
    for layer in range(s.num_layers):
        for name in W.checkpoint_names(s, layer):
            want = DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format(name, num_hidden_layers=s.num_layers)
            assert W.remap_checkpoint_name(name) == want, name
    # and the keys make_layer_weights uses are those names under model.layers.i.
    w = W.make_layer_weights(s, 3, seed=0)
    remapped = {W.remap_checkpoint_name(n).removeprefix("model.layers.3.") for n in W.checkpoint_names(s, 3)}
    for key in ("input_layernorm.weight", "self_attn.wq_b.weight", "self_attn.wq_b.weight_scale_inv",
                "self_attn.attn_sink", "mlp.gate.e_score_correction_bias", "self_attn.compressor.ape",
                "self_attn.indexer.weights_proj.weight", "hc_attn_fn"):
        assert key in remapped and key in w, key
    hashed = {W.remap_checkpoint_name(n).removeprefix("model.layers.0.") for n in W.checkpoint_names(s, 0)}
    assert "mlp.topk.tid2eid" in hashed and "mlp.topk.tid2eid" in W.make_layer_weights(s, 0, seed=0)


@pytest.mark.parametrize("tp", [2, 4])
def test_shards_reassemble_the_whole_layer(tp):
    s = tiny()
    w = W.make_layer_weights(s, 3, seed=1)
    shards = [W.shard(w, s.tp_shard(tp, r)) for r in range(tp)]
    for key in ("self_attn.wq_b.weight", "self_attn.wq_b.weight_scale_inv", "self_attn.wo_a.weight"):
        assert _same(torch.cat([sh[key] for sh in shards]), w[key]), key
    for key in ("self_attn.wo_b.weight", "mlp.shared_experts.down_proj.weight", "mlp.experts.w2_weight",
                "mlp.experts.w2_weight_scale_inv"):
        assert _same(torch.cat([sh[key] for sh in shards], dim=-1), w[key]), key
    for key in ("mlp.shared_experts.gate_up_proj.weight", "mlp.experts.w13_weight"):
        dim = 0 if key.startswith("mlp.shared") else 1
        gate = torch.cat([sh[key].chunk(2, dim)[0] for sh in shards], dim)
        up = torch.cat([sh[key].chunk(2, dim)[1] for sh in shards], dim)
        assert _same(torch.cat([gate, up], dim), w[key]), key
    for key in ("self_attn.wqkv_a.weight", "self_attn.attn_sink", "hc_ffn_fn", "mlp.gate.weight",
                "self_attn.compressor.wkv_gate.weight"):
        assert all(_same(sh[key], w[key]) for sh in shards), key


def test_expert_runtime_forms():
    s = tiny()
    w = W.make_layer_weights(s, 4, seed=2)
    cuda = W.cuda_layout(w)
    i = s.moe_inter
    assert _same(cuda["mlp.experts.w13_weight"][:, :i], w["mlp.experts.w13_weight"][:, i:])
    assert cuda["mlp.experts.w13_weight_scale_inv"].dtype == torch.float8_e8m0fnu
    rank = W.shard(w, s.tp_shard(4, 1))  # 32 intermediate values a rank: AITER pads them to 128
    il = s.tp_shard(4, 1).moe_inter_per_rank
    rocm = W.rocm_layout(rank)
    assert rocm["mlp.experts.w13_weight"].shape[1] == 2 * 128 and rocm["mlp.experts.w2_weight"].shape[2] == 64
    assert rocm["mlp.experts.w13_weight"].dtype == torch.float4_e2m1fn_x2
    w13 = rocm["mlp.experts.w13_weight"].view(torch.uint8)
    assert _same(w13[:, :il], rank["mlp.experts.w13_weight"].view(torch.uint8)[:, :il])
    assert _same(w13[:, 128 : 128 + il], rank["mlp.experts.w13_weight"].view(torch.uint8)[:, il:])
    assert not w13[:, il:128].any() and not w13[:, 128 + il :].any()  # the padding is zero
    w2 = rocm["mlp.experts.w2_weight"].view(torch.uint8)
    assert _same(w2[:, :, : il // 2], rank["mlp.experts.w2_weight"].view(torch.uint8)) and not w2[:, :, il // 2 :].any()
