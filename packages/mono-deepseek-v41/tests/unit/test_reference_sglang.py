"""The DeepSeek-V4.1 reference against SGLang 0.5.23's own torch code, on the CPU.

Each test feeds SGLang's function (from the installed wheel) and the reference the same fresh
random input (seeded per test). Where SGLang's torch code is the arithmetic the reference
mirrors the results must be bit-identical; a bound, where there is one, says why.
SGLang's Triton-only kernels are compared in test_reference_triton.py.
"""

from __future__ import annotations

import types

import pytest
import torch

from mono_deepseek_v41 import layouts as L
from mono_deepseek_v41 import quant as Q
from mono_deepseek_v41 import reference as R
from mono_deepseek_v41 import weights as W
from mono_deepseek_v41.config import tiny

pytest.importorskip("sglang")

BF16 = torch.bfloat16


def _orig(fn):
    """The Python function under a torch.compile decorator (compiling needs a C toolchain)."""
    return getattr(fn, "_torchdynamo_orig_callable", fn)


def _bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| in bf16 ulps of |b|."""
    ulp = torch.exp2(torch.floor(torch.log2(b.float().abs().clamp_min(2.0**-126))) - 7)
    return float(((a.float() - b.float()).abs() / ulp).max())


# ---- mHC ---------------------------------------------------------------------------------------
def test_mix_stats_and_combine_sum_equal_mhc_pre_torch():
    from sglang.kernels.ops.layernorm.mhc import _mhc_pre_torch

    torch.manual_seed(10)
    s = tiny()
    streams = torch.randn(7, s.hc_mult, s.hidden).bfloat16()
    fn = torch.randn(s.mix_hc, s.hc_dim) * s.hc_dim**-0.5
    scale, base = torch.rand(3) + 0.5, torch.randn(s.mix_hc)
    post, comb, layer_input = _mhc_pre_torch(streams, fn, scale, base, s.rms_eps, s.hc_eps, s.hc_eps, 2.0,
                                             s.hc_sinkhorn_iters)
    pre, post2, comb2 = R.hc_mix_stats(streams, fn, scale, base, s)
    assert torch.equal(post2, post[..., 0]) and torch.equal(comb2, comb)
    # _mhc_pre_torch sums the four weighted streams with torch.sum, mhc_combine (the served
    # kernel, compared bitwise in test_reference_triton) in stream order: one bf16 rounding
    # may land on the other side.
    assert _bf16_ulps(R.hc_sum(streams, pre), layer_input) <= 1


def test_hc_post_equals_mhc_post_torch():
    from sglang.kernels.ops.layernorm.mhc import _mhc_post_torch

    torch.manual_seed(11)
    s = tiny()
    y = torch.randn(5, s.hidden).bfloat16()
    streams = torch.randn(5, s.hc_mult, s.hidden).bfloat16()
    post, comb = torch.rand(5, s.hc_mult) * 2, torch.rand(5, s.hc_mult, s.hc_mult)
    assert torch.equal(R.hc_post(y, streams, post, comb), _mhc_post_torch(y, streams, post[..., None], comb))


def test_hc_expand_equals_hc_broadcast():
    from sglang.kernels.ops.layernorm.mhc import hc_broadcast

    x = torch.randn(3, 32).bfloat16()
    assert torch.equal(R.hc_expand(x, 4), hc_broadcast(x, 4))  # CPU: its torch form


# ---- rope ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("yarn", [False, True])
def test_freqs_equal_precompute_freqs_cis(yarn):
    from sglang.kernels.ops.attention.dsv4.rope import precompute_freqs_cis

    args = (64, 4096, 1024 if yarn else 0, 160000.0 if yarn else 10000.0, 16.0 if yarn else 1.0, 32, 1)
    assert torch.equal(R.freqs_cis(*args), precompute_freqs_cis(*args))


@pytest.mark.parametrize("inverse", [False, True])
def test_apply_rope_equals_rope_tail(inverse):
    from sglang.srt.layers.attention.dsv4.dsv41_sparse import rope_tail

    torch.manual_seed(12)
    fc = R.freqs_cis(64, 1024, 256, 40000.0, 4.0, 32, 1)
    pos = torch.tensor([0, 3, 255, 256, 1000])
    x = torch.randn(5, 3, 128).bfloat16()
    got = R.apply_rope(x, fc[pos], 64, inverse=inverse)
    want = rope_tail(x, fc[pos], 64, inverse=inverse)
    assert torch.equal(got[..., :64], want[..., :64])
    # rope_tail multiplies complex64 numbers, the kernels (and the reference) write out the
    # real products; the fp32 results may differ in the last bit, a bf16 rounding by one ulp.
    assert _bf16_ulps(got[..., 64:], want[..., 64:]) <= 1


# ---- V4.1 ratio-1/2 compressor and indexer ------------------------------------------------------
def test_low_ratio_compress_equals_sglang_torch_pieces():
    """Ratio 2 over a prompt and a decode step: every completed pair's latent and index key, as
    DeepseekV41Compressor (project, pool_pairs, finish), dsv41 RMSNorm and _rope_fq4 give them."""
    from sglang.srt.layers.attention.dsv4.dsv41_sparse import DeepseekV41Compressor, _rope_fq4
    from sglang.srt.layers.attention.dsv4.dsv41_sparse import RMSNorm as V41Norm

    torch.manual_seed(13)
    s = tiny()
    layer = 2
    assert s.layer_kind(layer).ratio == 2 and s.layer_kind(layer).kv_source
    w = W.make_layer_weights(s, layer, seed=5)
    comp = DeepseekV41Compressor(s.hidden, s.head_dim, 2, s.rms_eps, fused_compress=False)
    with torch.no_grad():
        comp.wkv.weight.copy_(w["self_attn.compressor.wkv.weight"])
        comp.wgate.weight.copy_(w["self_attn.compressor.wgate.weight"])
        comp.norm.weight.copy_(w["self_attn.compressor.norm.weight"])
    k_norm = V41Norm(s.index_head_dim, s.rms_eps)
    with torch.no_grad():
        k_norm.weight.copy_(w["self_attn.indexer.k_norm.weight"])
    freqs = R.layer_freqs(s, layer)
    req_to_token, f2s, pages = W.make_tables(s, 2, 64)
    caches = W.make_caches(s, pages, 2)
    x_all = torch.randn(2, 11, s.hidden).bfloat16()
    for start, n in ((0, 10), (10, 1)):  # a prompt, then one decode token
        step = W.make_step(s, torch.full((2,), start), n, req_to_token, f2s, torch.zeros(2, n, dtype=torch.long))
        R.low_ratio_compress(x_all[:, start : start + n].reshape(-1, s.hidden), w, s, step, caches[layer], freqs, 2)
    with torch.no_grad():
        for r in range(2):
            kv, score = comp.project(x_all[r])
            for p in range(1, 11, 2):
                pooled = comp.pool_pairs(kv[p - 1 : p + 1][None], score[p - 1 : p + 1][None])
                latent = comp.finish(pooled)
                fr = freqs[p - 1 : p]
                row = _rope_fq4(latent, fr, s.rope_dim, compressed_kv=True)
                k = k_norm((latent.float() @ w["self_attn.indexer.wk.weight"].float().t()).to(BF16))
                key = _rope_fq4(k, fr, s.rope_dim)
                slot = req_to_token[r, p : p + 1] // 2
                got_row = L.v4_read(caches[layer].ckv, slot, s.page_size // 2, s.nope_dim, s.rope_dim)
                want_row = L.v4_read(*_v4_buf(row, s), torch.zeros(1, dtype=torch.long), s.page_size // 2,
                                     s.nope_dim, s.rope_dim)
                assert torch.equal(got_row, want_row), (r, p)
                got_key = L.index_fp4_read(caches[layer].index_k, slot, s.index_page_size, s.index_head_dim)
                assert torch.equal(got_key, key.float()), (r, p)


def _v4_buf(row, s):
    buf = torch.zeros(1, L.v4_page_bytes(s.page_size // 2, s.nope_dim, s.rope_dim), dtype=torch.uint8)
    L.v4_write(buf, torch.zeros(1, dtype=torch.long), *Q.kv_quant_v4(row.float(), s.nope_dim), s.page_size // 2)
    return (buf,)


def test_v41_indexer_scores_equal_deepseek_v41_indexer_scores():
    from sglang.srt.layers.attention.dsv4.dsv41_sparse import DeepseekV41Indexer

    torch.manual_seed(14)
    q = Q.fake_quant_fp4(torch.randn(1, 4, 64)).bfloat16()
    k = Q.fake_quant_fp4(torch.randn(9, 64)).bfloat16()
    w = torch.randn(1, 4).bfloat16()
    want = DeepseekV41Indexer.scores(None, q, k, w)[0]
    got = (torch.relu(k.float() @ q[0].float().t()) * w[0].float()).sum(-1)
    # SGLang's torch form multiplies and sums in bf16 (einsum on bf16), the reference in fp32
    # as the paged fp4 logits kernel sm_90 runs does: within the bf16 steps of the sum.
    assert torch.allclose(got, want, rtol=2**-6, atol=2**-6 * float(want.abs().max()))


# ---- C4 indexer -----------------------------------------------------------------------------------
def test_index_logits_and_topk_equal_sglang_torch_indexer():
    from sglang.srt.layers.attention.dsv4.indexer import fp8_paged_mqa_logits_torch, topk_transform_pytorch_vectorized

    torch.manual_seed(15)
    d, page, heads, n = 128, 64, 4, 150
    buf = torch.zeros(4, page * (d + 4), dtype=torch.uint8)
    slots = torch.arange(n) + 64  # pages 1 and 2 (and part of 3) of the request
    q8, ks = Q.index_k_quant_fp8(Q.hadamard(torch.randn(n, d)))
    L.index_fp8_write(buf, slots, q8, ks, page)
    qv = Q.hadamard(torch.randn(heads, d))
    qs = qv.abs().amax(-1).clamp_min(1e-4) / 448
    qq = (qv / qs[:, None]).to(torch.float8_e4m3fn)
    hw = torch.randn(heads) * qs
    k_read, s_read = L.index_fp8_read(buf, slots, page, d)
    mine = R.index_logits_fp8(qq.float(), hw, k_read, s_read)
    table = torch.tensor([[1, 2, 3]])
    theirs = fp8_paged_mqa_logits_torch(qq[None, None], buf.view(4, page, 1, d + 4), hw[None], torch.tensor([n]),
                                        table, None, 3 * page, clean_logits=False)[0, :n]
    # SGLang's torch form runs its bmm in bf16 (DeepGEMM accumulates fp32, as the reference).
    assert torch.allclose(mine, theirs, rtol=2**-6, atol=2**-6 * float(mine.abs().max()))
    out = torch.empty(1, 16, dtype=torch.int32)
    raw = torch.empty(1, 16, dtype=torch.int32)
    topk_transform_pytorch_vectorized(mine[None], torch.tensor([n]), table, out, page, out_raw_indices=raw)
    assert sorted(raw[0].tolist()) == R._topk_positions(mine, n, 16).tolist()
    assert torch.equal(out[0].sort().values.long(), (slots[R._topk_positions(mine, n, 16)]).sort().values)
    short = torch.empty(1, 16, dtype=torch.int32)
    topk_transform_pytorch_vectorized(mine[None, :9], torch.tensor([9]), table, short, page, out_raw_indices=raw)
    assert raw[0, :9].tolist() == R._topk_positions(mine, 9, 16).tolist() and (raw[0, 9:] == -1).all()


# ---- routing ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_sqrtsoftplus_topk_equals_biased_topk_impl(seed):
    from sglang.srt.layers.moe.topk import biased_topk_impl

    torch.manual_seed(seed)
    logits = torch.randn(9, 16) * 4
    logits[0, 3] = 30.0  # past softplus' threshold
    bias = torch.randn(16) * 0.5
    w, ids = R.biased_sqrtsoftplus_topk(logits, bias, 4, 1.5)
    w2, ids2 = _orig(biased_topk_impl)(logits, logits, bias, 4, True, scoring_func="sqrtsoftplus",
                                       routed_scaling_factor=1.5, apply_routed_scaling_factor_on_output=True)
    o1, o2 = ids.sort(-1), ids2.sort(-1)
    assert torch.equal(o1.values, o2.values)
    # biased_topk_impl sums the k weights in torch.topk's unsorted order, the reference (as
    # moe_fused_gate) in rank order: the renormalising sum may differ in its last fp32 bit.
    assert torch.allclose(w.gather(1, o1.indices), w2.gather(1, o2.indices), rtol=2**-22, atol=0)


def test_hash_topk_equals_hash_topk_forward_torch():
    from sglang.srt.layers.moe.hash_topk import HashTopK

    torch.manual_seed(16)
    e, k, vocab = 16, 4, 50
    tid2eid = torch.stack([torch.randperm(e)[:k] for _ in range(vocab)]).int()
    logits, ids = torch.randn(6, e) * 3, torch.randint(0, vocab, (6,))
    fake = types.SimpleNamespace(score_func="sqrtsoftplus", topk=k, num_shared_topk_slots=0, tid2eid=tid2eid,
                                 routed_scaling_factor=1.5, num_experts=e)
    w2, ids2 = HashTopK._forward_torch(fake, logits, ids)
    w, got = R.hash_topk(logits, ids, tid2eid, 1.5)
    assert torch.equal(got, ids2) and torch.equal(w, w2 * 1.5)


def test_image_token_bias_equals_vision_topk_torch_branch(monkeypatch):
    from sglang.srt.multimodal.dsv41 import vl_routing

    torch.manual_seed(17)
    e, k, img = 16, 4, 9
    cfg = types.SimpleNamespace(num_shared_topk_slots=0, top_k=k, renormalize=True, routed_scaling_factor=1.5,
                                apply_routed_scaling_factor_on_output=True, runner_backend=None)
    bias, bias_vl = torch.randn(e), torch.randn(e) * 2
    moe = types.SimpleNamespace(
        topk=types.SimpleNamespace(topk_config=cfg, routing_inputs=lambda: (None, None)),
        gate=types.SimpleNamespace(e_score_correction_bias=bias, e_score_correction_bias_vl=bias_vl),
        config=types.SimpleNamespace(image_token_id=img), layer_id=0)
    monkeypatch.setattr(vl_routing, "_finish_vision_topk", lambda moe, logits, w, i, *a, **kw: (w, i))
    logits, ids = torch.randn(6, e) * 3, torch.tensor([1, 9, 2, 9, 9, 3])
    out = vl_routing.vision_topk(moe, logits, ids)
    w, got = R.biased_sqrtsoftplus_topk(logits, bias, k, 1.5, input_ids=ids, bias_vl=bias_vl, image_token_id=img)
    o1, o2 = got.sort(-1), out.topk_ids.sort(-1)
    assert torch.equal(o1.values, o2.values)
    assert torch.allclose(w.gather(1, o1.indices), out.topk_weights.gather(1, o2.indices), rtol=1e-6)


# ---- attention --------------------------------------------------------------------------------------
def test_sparse_attention_equals_dsv4_swa_reference():
    from sglang.test.kits.attention_unittest.attention_methods import dsv4_attention as D

    torch.manual_seed(18)
    heads, window = 4, D.DSV4_SWA_WINDOW
    kv = [torch.randn(200, 512).bfloat16(), torch.randn(40, 512).bfloat16()]
    sink = torch.randn(heads)
    case = types.SimpleNamespace(batch_size=2, input_lens=(1, 1), prefix_lens=(199, 39))
    fixture = types.SimpleNamespace(_swa_bf16_k_per_req=kv, actual_module=types.SimpleNamespace(attn_sink=sink))
    q = torch.randn(2, heads, 512).bfloat16()
    want = D._pure_torch_dsv4_swa_reference(fixture, q, None, case=case)
    for i, p in enumerate((199, 39)):
        keys = kv[i][max(0, p - window + 1) : p + 1]
        got = R.sparse_attention(q[i], keys, sink, 512**-0.5).to(BF16)
        assert torch.equal(got, want[i])


def test_compression_metadata_equals_low_ratio_compression_metadata():
    from sglang.srt.layers.attention.deepseek_v4_backend import _low_ratio_compression_metadata

    seq = torch.arange(1, 40, dtype=torch.int32)
    loc = torch.arange(100, 139)
    for r in (1, 2):
        out_loc, lens = _low_ratio_compression_metadata(r, seq, loc)
        written = [(p + 1) % r == 0 for p in range(39)]  # the reference stores these tokens' groups
        assert [bool(v) for v in (out_loc >= 0)] == written
        assert torch.equal(out_loc[out_loc >= 0], loc[torch.tensor(written)] // r)
        assert lens.tolist() == [max(1, (p + 1) // r) for p in range(39)]


# ---- number formats -----------------------------------------------------------------------------------
def test_fp4_fake_quant_and_ceil_pow2_equal_sglang():
    from sglang.kernels.ops.quantization import fp4_fake_quant as F

    torch.manual_seed(19)
    x = torch.randn(6, 128).bfloat16() * 3
    x[0, :16] = 0
    assert torch.equal(Q.fake_quant_fp4(x), F.fake_quant_fp4(x))
    assert torch.equal(Q.fake_quant_compressed_kv(x), F.fake_quant_compressed_kv(x))
    v = torch.rand(100) * 10 + 1e-6
    v[:3] = torch.tensor([1.0, 0.5, 2.0**-20])
    assert torch.equal(Q.ceil_pow2(v), F.ceil_pow2(v))


def test_mxfp4_equals_cast_e2m1fn_to_e4m3fn():
    """SGLang's lossless FP4 -> FP8 requantization reads our packing: same values."""
    from sglang.srt.layers.quantization.fp8 import cast_e2m1fn_to_e4m3fn

    torch.manual_seed(20)
    packed, exp = Q.mxfp4_quant(torch.randn(128, 256))
    # cast_e2m1fn_to_e4m3fn bounds a 128x128 block's scales to 2^6 apart; keep them in range
    exp = exp.clamp(min=int(exp.max()) - 6)
    w8, s8 = cast_e2m1fn_to_e4m3fn(packed, torch.exp2(exp.float() - 127))
    back = Q.fp8_block_dequant(w8, s8.float(), 128)
    assert torch.equal(back, Q.mxfp4_dequant(packed, exp))


def test_fp8_block_dequant_equals_dequant_fp8():
    from sglang.srt.models.deepseek_v4 import _dequant_fp8

    torch.manual_seed(21)
    q, sc = Q.fp8_block_quant(torch.randn(96, 64), 32)
    assert torch.equal(_dequant_fp8(q, sc), Q.fp8_block_dequant(q, sc, 32).bfloat16())


def test_mxfp8_row_scales_equal_block_fp8_scale_to_mxfp8_e8m0():
    from sglang.srt.layers.quantization.fp8_utils import block_fp8_scale_to_mxfp8_e8m0

    torch.manual_seed(22)
    _, sc = Q.fp8_block_quant(torch.randn(80, 96), 32)
    assert torch.equal(W.mxfp8_row_scales(sc, 80, 32), block_fp8_scale_to_mxfp8_e8m0(sc, (80, 96), [32, 32]))

