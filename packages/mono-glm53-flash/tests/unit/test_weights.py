"""The weight and state layouts `mono_glm53_flash.weights` builds, against SGLang's and AITER's."""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch

from mono_glm53_flash import reference as R
from mono_glm53_flash import weights as Wt
from mono_glm53_flash.config import REAL, tiny

S = tiny()


@pytest.fixture(scope="module")
def whole():
    return {kind: Wt.make_weights(S, kind, seed=50 + i) for i, kind in enumerate(("kda", "mla"))}


def _shape_table(s):
    """(dtype, shape) of every key for one rank, as SGLang's modules allocate them."""
    p, h, d = s.kda_proj_per_rank, s.hidden, s.kda_head_dim
    e, i, si = s.n_experts, s.moe_inter_per_rank, s.shared_inter_per_rank
    fp8, bf16, f32 = torch.float8_e4m3fn, torch.bfloat16, torch.float32
    common = {
        "hc_attn_fn": (f32, (s.mix_hc, s.hc_dim)),
        "hc_ffn_base": (f32, (s.mix_hc,)),
        "hc_ffn_scale": (f32, (3,)),
        "input_layernorm.weight": (bf16, (h,)),
        "mlp.gate.weight": (bf16, (s.n_experts, h)),
        "mlp.gate.e_score_correction_bias": (f32, (s.n_experts,)),
        "mlp.experts.w13_weight": (torch.int8, (e, 2 * i, h // 2)),
        "mlp.experts.w13_weight_scale_inv": (f32, (e, 2 * i, h // 32)),
        "mlp.experts.w2_weight": (torch.int8, (e, h, i // 2)),
        "mlp.experts.w2_weight_scale_inv": (f32, (e, h, i // 32)),
        "mlp.shared_experts.gate_up_proj.weight": (fp8, (2 * si, h)),
        "mlp.shared_experts.gate_up_proj.weight_scale_inv": (f32, (2 * si // s.block, h // s.block)),
        "mlp.shared_experts.down_proj.weight": (fp8, (h, si)),
    }
    kda = {
        "self_attn.qkv_proj.weight": (fp8, (3 * p, h)),
        "self_attn.qkv_proj.weight_scale_inv": (f32, (3 * p // s.block, h // s.block)),
        "self_attn.b_proj.weight": (bf16, (s.kda_heads_per_rank, h)),
        "self_attn.f_a_proj.weight": (bf16, (d, h)),
        "self_attn.f_b_proj.weight": (bf16, (p, d)),
        "self_attn.g_b_proj.weight": (bf16, (p, d)),
        "self_attn.dt_bias": (f32, (p,)),
        "self_attn.A_log": (f32, (1, 1, s.kda_heads_per_rank, 1)),
        "self_attn.qkv_conv1d.weight": (f32, (3 * p, 1, s.conv_kernel)),
        "self_attn.o_norm.weight": (bf16, (d,)),
        "self_attn.o_proj.weight": (fp8, (h, p)),
    }
    hl = s.heads_per_rank
    mla = {
        "self_attn.fused_qkv_a_proj_with_mqa.weight": (fp8, (s.q_lora + s.kv_lora, h)),
        "self_attn.q_b_proj.weight": (fp8, (hl * s.qk_nope, s.q_lora)),
        "self_attn.kv_b_proj.weight": (bf16, (hl * (s.qk_nope + s.v_head), s.kv_lora)),
        "self_attn.w_kc": (bf16, (hl, s.qk_nope, s.kv_lora)),
        "self_attn.w_vc": (bf16, (hl, s.kv_lora, s.v_head)),
        "self_attn.o_proj.weight": (fp8, (h, hl * s.v_head)),
        "self_attn.indexer.wq_b.weight": (fp8, (s.index_heads * s.index_head_dim, s.q_lora)),
        "self_attn.indexer.wk.weight": (fp8, (s.index_head_dim, h)),
        "self_attn.indexer.weights_proj.weight": (f32, (s.index_heads, h)),
        "self_attn.indexer.k_norm.bias": (f32, (s.index_head_dim,)),
        "self_attn.indexer.index_kpool_compress_ape": (f32, (s.index_kpool, s.index_head_dim)),
        "self_attn.indexer.index_kpool_compress_gate": (bf16, (s.index_head_dim, h)),
    }
    return {"kda": {**kda, **common}, "mla": {**mla, **common}}


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_every_rank_holds_sglangs_dtypes_and_shapes(whole, tp):
    for r in range(tp):
        s = S.tp_shard(tp, r)
        for kind, table in _shape_table(s).items():
            w = Wt.shard_weights(whole[kind], s)
            for key, (dtype, shape) in table.items():
                assert w[key].dtype == dtype and tuple(w[key].shape) == shape, (kind, tp, key, w[key].dtype, w[key].shape)


def test_shards_are_sections_of_the_whole(whole):
    """q|k|v and gate|up are cut section by section; rows and columns go back together."""
    w = whole["kda"]
    shards = [Wt.shard_weights(w, S.tp_shard(2, r)) for r in range(2)]
    p = S.kda_proj
    q0, k0, v0 = shards[0]["self_attn.qkv_proj.weight"].view(torch.uint8).split(p // 2)
    assert torch.equal(q0, w["self_attn.qkv_proj.weight"].view(torch.uint8)[: p // 2])
    assert torch.equal(k0, w["self_attn.qkv_proj.weight"].view(torch.uint8)[p : p + p // 2])
    assert torch.equal(v0, w["self_attn.qkv_proj.weight"].view(torch.uint8)[2 * p : 2 * p + p // 2])
    cols = torch.cat([sh["self_attn.o_proj.weight"].view(torch.uint8) for sh in shards], dim=1)
    assert torch.equal(cols, w["self_attn.o_proj.weight"].view(torch.uint8))
    i = S.moe_inter
    up1 = shards[1]["mlp.experts.w13_weight"][:, i // 2 :]
    assert torch.equal(up1, w["mlp.experts.w13_weight"][:, i + i // 2 :])
    w2 = torch.cat([sh["mlp.experts.w2_weight"] for sh in shards], dim=2)
    assert torch.equal(w2, w["mlp.experts.w2_weight"])
    assert torch.equal(shards[1]["self_attn.A_log"].flatten(), w["self_attn.A_log"].flatten()[S.kda_heads // 2 :])


def test_absorbed_weights_are_kv_b_split_as_post_load_weights_leaves_them(whole):
    w = whole["mla"]
    kv_b = w["self_attn.kv_b_proj.weight"].view(S.heads, S.qk_nope + S.v_head, S.kv_lora)
    assert torch.equal(w["self_attn.w_kc"], kv_b[:, : S.qk_nope])
    assert torch.equal(w["self_attn.w_vc"], kv_b[:, S.qk_nope :].transpose(1, 2))
    # strides of the transposed-contiguous buffers SGLang keeps
    assert w["self_attn.w_kc"].stride() == (S.kv_lora * S.qk_nope, 1, S.qk_nope)
    assert w["self_attn.w_vc"].stride() == (S.v_head * S.kv_lora, 1, S.kv_lora)


def test_mxfp4_experts_are_packed_e2m1_with_power_of_two_scales(whole):
    w = whole["kda"]
    s13 = w["mlp.experts.w13_weight_scale_inv"]
    assert torch.equal(torch.exp2(torch.log2(s13).round()), s13)
    vals = Wt.cuda_experts_dequant(w, "mlp.experts.w13_weight")
    assert vals.shape == (S.n_experts, 2 * S.moe_inter, S.hidden) and vals.abs().max() > 0


def _aiter_shuffle():
    """aiter/ops/shuffle.py without importing aiter (its __init__ needs ROCm), from an installed
    aiter or the amd-aiter wheel nox downloads (MONO_AITER_WHEEL)."""
    for base in sys.path:
        cand = Path(base) / "aiter" / "ops" / "shuffle.py"
        if cand.is_file():
            path = cand
            break
    else:
        wheels = [os.environ.get("MONO_AITER_WHEEL", "")] + glob.glob(os.path.expanduser("~/.cache/mono/aiter-wheel/amd_aiter-*.whl"))
        wheel = next((x for x in wheels if x and os.path.isfile(x)), None)
        if wheel is None:
            if os.environ.get("MONO_AITER_WHEEL"):
                pytest.fail(f"MONO_AITER_WHEEL={os.environ['MONO_AITER_WHEEL']} is not a file")
            pytest.skip("amd-aiter not available (nox sets MONO_AITER_WHEEL; a hand-run pytest may not)")
        path = Path(tempfile.mkdtemp()) / "shuffle.py"
        with zipfile.ZipFile(wheel) as z:
            path.write_bytes(z.read("aiter/ops/shuffle.py"))
    spec = importlib.util.spec_from_file_location("aiter_shuffle_only", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.shuffle_weight


def test_rocm_layout_is_aiters_shuffle(whole):
    shuffle_weight = _aiter_shuffle()
    rocm = Wt.rocm_layout(whole["kda"])
    for key in ("self_attn.qkv_proj.weight", "mlp.shared_experts.down_proj.weight"):
        want = shuffle_weight(whole["kda"][key], layout=(16, 16))
        assert torch.equal(rocm[key].view(torch.uint8), want.view(torch.uint8)), key
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    for key in Wt.MXFP4_WEIGHTS:
        packed = whole["kda"][key].view(torch.uint8)
        src = packed.view(fp4) if fp4 is not None else packed
        want = shuffle_weight(src, layout=(16, 16))
        assert torch.equal(rocm[key].view(torch.uint8), want.view(torch.uint8)), key
        if fp4 is not None:
            assert rocm[key].dtype == fp4
        scale = rocm[key + "_scale_inv"]
        assert scale.dtype == torch.float8_e8m0fnu
        assert torch.equal(scale.float(), whole["kda"][key + "_scale_inv"])


@pytest.mark.parametrize("tile", [0, 16])
def test_index_k_pages_hold_64_keys_then_their_scales(tile):
    """REAL geometry: a 256-token page keeps 64 pooled keys of 128 fp8 bytes (row-major, or
    AITER's 16 x 16 tiles) followed by their 64 fp32 scales: 64 * 132 bytes."""
    s = REAL
    state = R.MlaState(kv=torch.zeros(1), index_k=torch.zeros(3, s.index_page * s.index_k_token_bytes, dtype=torch.uint8),
                       tail_k=torch.zeros(1), tail_score=torch.zeros(1), preshuffle_tile=tile)
    keys = {}
    for row in range(s.index_page):
        k = torch.randn(128).clamp(-448, 448).to(torch.float8_e4m3fn)
        sc = torch.tensor(2.0 ** -(row % 7))
        R.write_index_key(state, 2, row, k, sc, s)
        keys[row] = (k, sc)
    assert state.index_k[[0, 1]].count_nonzero() == 0
    for row, (k, sc) in keys.items():
        got_k, got_s = R.read_index_key(state, 2, row, s)
        assert torch.equal(got_k, k.float()) and float(got_s) == float(sc)
    scales = state.index_k[2, 64 * 128 :].view(torch.float32)
    assert torch.equal(scales, torch.stack([keys[r][1] for r in range(64)]).float())
    if tile:
        # row 1's first 16 values sit right after row 0's first 16 (AITER's tile order)
        assert torch.equal(state.index_k[2, 16:32].view(torch.float8_e4m3fn).float(), keys[1][0][:16].float())


def test_mla_state_is_paged_and_consistent():
    inp, st = Wt.make_mla_state(S, [5, 17, 32], seed=51, tail_extra=2)
    assert st.tail_k.shape == (4, S.index_kpool + 2, S.index_head_dim) and st.tail_k.dtype == torch.bfloat16
    assert st.kv.dtype == torch.bfloat16 and st.kv.shape[1:] == (1, S.kv_lora)
    pages = inp.req_to_token[:, :: S.page] // S.page
    assert (pages > 0).all() and pages.unique().numel() == pages.numel()  # page 0 is SGLang's padding page
    assert torch.equal(inp.out_cache_loc, inp.req_to_token[torch.arange(3), inp.positions].long())
    # every group the context closed before the new token has a key with a positive scale
    for r, n in enumerate([5, 17, 32]):
        for grp in range((n - 1) // S.index_kpool):
            page = int(inp.req_to_token[r, grp * S.index_kpool]) // S.page
            _, sc = R.read_index_key(st, page, grp % S.index_page, S)
            assert float(sc) > 0


def test_kda_state_and_pool_shapes():
    st = Wt.make_kda_state(S.tp_shard(2, 1), n_slots=3, seed=52)
    s = S.tp_shard(2, 1)
    assert st.conv.shape == (4, s.conv_kernel - 1, s.conv_dim_per_rank) and st.conv.dtype == torch.bfloat16
    assert st.ssm.shape == (4, s.kda_heads_per_rank, s.kda_head_dim, s.kda_head_dim) and st.ssm.dtype == torch.float32
    pool = Wt.make_mamba_pool(s, n_kda_layers=2, n_slots=3, seed=53)
    assert pool.conv.shape == (2, *st.conv.shape) and pool.ssm.shape == (2, *st.ssm.shape)
    whole = Wt.make_kda_state(S, n_slots=3, seed=54)
    halves = [Wt.shard_kda_state(whole, S.tp_shard(2, r)) for r in range(2)]
    assert torch.equal(torch.cat([h.ssm for h in halves], dim=1), whole.ssm)
