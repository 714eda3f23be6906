"""The GLM-5.3-Flash reference against SGLang 0.5.23's own torch code, on the CPU.

Each test feeds SGLang's function (from the installed wheel) and the reference the same fresh
random input. Where the reference is SGLang's torch arithmetic op for op, the results must be
bit-identical; where it mirrors a fused kernel's arithmetic instead (fp32, one rounding), the
bound is one bf16 rounding step and says so.
"""

from __future__ import annotations

import pytest
import torch

from mono_glm53_flash import quant as Q
from mono_glm53_flash import reference as R
from mono_glm53_flash.config import REAL, tiny

pytest.importorskip("sglang")


def _orig(fn):
    """The Python function under a torch.compile decorator (compiling needs a C toolchain)."""
    return getattr(fn, "_torchdynamo_orig_callable", fn)


def _mhc_params(s, g, t=3):
    streams = (torch.randn(t, s.hc_dim, generator=g) * 2).bfloat16()
    fn = torch.randn(s.mix_hc, s.hc_dim, generator=g) * s.hc_dim**-0.5
    base = torch.randn(s.mix_hc, generator=g)
    scale = 0.5 + torch.rand(3, generator=g)
    return streams, fn, scale, base


@pytest.mark.parametrize("shape", ["real", "tiny"])
def test_hc_pre_is_mhc_pre_torch_bit_for_bit(shape):
    from sglang.kernels.ops.layernorm.mhc import _mhc_pre_torch

    s = REAL if shape == "real" else tiny()
    g = torch.Generator().manual_seed(11)
    streams, fn, scale, base = _mhc_params(s, g)
    t = streams.shape[0]
    post_w, comb_w, x_w = _mhc_pre_torch(
        residual=streams.view(t, s.hc_mult, s.hidden),
        fn=fn,
        hc_scale=scale,
        hc_base=base,
        rms_eps=s.rms_eps,
        hc_pre_eps=s.hc_eps,
        hc_sinkhorn_eps=s.hc_eps,
        hc_post_mult_value=s.hc_post_mult,
        sinkhorn_repeat=s.hc_sinkhorn_iters,
    )
    x, comb, post = R.hc_pre(streams, fn, scale, base, s)
    assert torch.equal(x, x_w) and torch.equal(comb, comb_w) and torch.equal(post, post_w.view(t, s.hc_mult))
    # the last Sinkhorn step normalises columns; 20 iterations bring the rows close too
    assert torch.allclose(comb.sum(-2), torch.ones(t, s.hc_mult), atol=1e-5)
    assert torch.allclose(comb.sum(-1), torch.ones(t, s.hc_mult), atol=1e-2)


def test_hc_pre_and_post_equal_sglangs_dispatch_on_the_torch_path(monkeypatch):
    """`mhc.hc_pre` / `hc_post` (what Glm5NextDecoderLayer calls) with TileLang switched off
    take `_mhc_pre_torch` / `_mhc_post_torch`: the reference equals them, and GLM-5.3-Flash's
    post multiplier is the model file's constant."""
    from sglang.kernels.ops.layernorm import mhc
    from sglang.srt.models import glm5_next

    monkeypatch.setenv("SGLANG_OPT_USE_TILELANG_MHC_PRE", "0")
    monkeypatch.setenv("SGLANG_OPT_USE_TILELANG_MHC_POST", "0")
    s = tiny()
    assert glm5_next._MHC_POST_MULT_VALUE == s.hc_post_mult
    g = torch.Generator().manual_seed(12)
    streams, fn, scale, base = _mhc_params(s, g)
    x_w, comb_w, post_w, fused = mhc.hc_pre(
        streams, fn, scale, base, s.hc_mult, s.rms_eps, s.hc_eps, s.hc_sinkhorn_iters, s.hc_post_mult
    )
    assert fused is False
    x, comb, post = R.hc_pre(streams, fn, scale, base, s)
    assert torch.equal(x, x_w) and torch.equal(comb.flatten(1), comb_w) and torch.equal(post, post_w)
    y = torch.randn(streams.shape[0], s.hidden, generator=g).bfloat16()
    want = mhc.hc_post(y, streams, post_w, comb_w, s.hc_mult)
    assert torch.equal(R.hc_post(y, streams, post, comb), want)


def test_hc_post_is_mhc_post_torch_bit_for_bit():
    from sglang.kernels.ops.layernorm.mhc import _mhc_post_torch

    s = REAL
    g = torch.Generator().manual_seed(13)
    t, n, h = 4, s.hc_mult, s.hidden
    x = torch.randn(t, h, generator=g).bfloat16()
    streams = torch.randn(t, n * h, generator=g).bfloat16()
    post = 2 * torch.rand(t, n, generator=g)
    comb = torch.rand(t, n, n, generator=g)
    want = _mhc_post_torch(x, streams.view(t, n, h), post.view(t, n, 1), comb)
    assert torch.equal(R.hc_post(x, streams, post, comb), want.view(t, n * h))


def test_hc_expand_and_contract_equal_sglang():
    from sglang.kernels.ops.layernorm import mhc

    x = torch.randn(3, 64).bfloat16()
    assert torch.equal(R.hc_expand(x, 4), mhc.hc_expand(x, 4))
    y = torch.randn(3, 256).bfloat16()
    assert torch.equal(R.hc_contract(y, 4), mhc.hc_contract(y, 4))


def test_rms_norm_equals_forward_native():
    from sglang.srt.layers.layernorm import RMSNorm

    g = torch.Generator().manual_seed(14)
    m = RMSNorm(REAL.hidden, eps=REAL.rms_eps)
    with torch.no_grad():
        m.weight.copy_((1 + 0.1 * torch.randn(REAL.hidden, generator=g)).bfloat16())
    x = torch.randn(5, REAL.hidden, generator=g).bfloat16()
    assert torch.equal(R.rms_norm(x, m.weight.data, REAL.rms_eps), m.forward_native(x))


def test_layer_norm_equals_forward_native():
    from sglang.srt.layers.layernorm import LayerNorm

    g = torch.Generator().manual_seed(15)
    m = LayerNorm(128, dtype=torch.float32)  # IndexerKPool's k_norm: eps left at 1e-6
    assert m.variance_epsilon == REAL.index_k_norm_eps
    with torch.no_grad():
        m.weight.copy_(1 + 0.1 * torch.randn(128, generator=g))
        m.bias.copy_(0.1 * torch.randn(128, generator=g))
    x = torch.randn(7, 128, generator=g).bfloat16()
    assert torch.equal(R.layer_norm(x, m.weight.data, m.bias.data, m.variance_epsilon), m.forward_native(x))


@pytest.mark.parametrize("rows", [1, 8])
def test_biased_topk_equals_biased_topk_impl(rows):
    from sglang.srt.layers.moe import topk as T

    s = REAL
    g = torch.Generator().manual_seed(16 + rows)
    logits = torch.randn(rows, s.n_experts, generator=g) * 2
    bias = torch.randn(s.n_experts, generator=g) * 0.1
    got_w, got_i = R.biased_topk(logits, bias, s)
    want_w, want_i = _orig(T.biased_topk_impl)(
        torch.empty(rows, 16), logits, bias, s.top_k, True, "sigmoid", 0, s.routed_scaling, None, None, True
    )
    # Unsorted top-k: compare per row after sorting by expert id (random fp32 scores have no ties).
    oa, ob = got_i.sort(-1), want_i.sort(-1)
    assert torch.equal(oa.values, ob.values)
    assert torch.equal(got_w.gather(1, oa.indices), want_w.gather(1, ob.indices))


def test_swiglu_clamp_equals_swiglu_clamped():
    from sglang.srt.models.glm5_next import swiglu_clamped

    g = torch.Generator().manual_seed(17)
    # values past the limit on both sides of both halves
    y = (torch.randn(4, 2 * 256, generator=g) * 12).bfloat16()
    assert (y.abs() > REAL.swiglu_limit).any()
    want = _orig(swiglu_clamped)(y, REAL.swiglu_limit)
    assert torch.equal(R.swiglu_clamp(y, REAL.swiglu_limit), want)
    # the fused kernels' arithmetic (fp32, one rounding) is within one bf16 rounding of it
    fused = R._swiglu_clamp_f32(y, REAL.swiglu_limit).float()
    assert ((fused - want.float()).abs() <= 2**-7 * want.float().abs() + 1e-30).all()


def test_mxfp4_dequant_equals_sglangs_two_dequantisers():
    from sglang.srt.layers.quantization.fp8_utils import dequant_mxfp4
    from sglang.srt.layers.quantization.quark.schemes.quark_w4a4_mxfp4 import _dequant_mxfp4_to_bf16

    g = torch.Generator().manual_seed(18)
    n, k = 96, 256
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    scale = torch.randint(110, 140, (n, k // 32), generator=g, dtype=torch.uint8)
    got = Q.mxfp4_dequant(packed, scale)
    # fp8_utils.dequant_mxfp4: [batch, n, k/32, 16] blocks, out float32
    want = dequant_mxfp4(packed.view(1, n, k // 32, 16), scale.view(1, n, k // 32), torch.float32)
    assert torch.equal(got, want.view(n, k))
    assert torch.equal(got.bfloat16(), _dequant_mxfp4_to_bf16(packed, scale))
    # the CUDA layout keeps the scales as fp32 values, ROCm as e8m0: the same numbers
    assert torch.equal(Q.mxfp4_dequant(packed, Q.e8m0_decode(scale)), got)
    assert torch.equal(Q.mxfp4_dequant(packed, scale.view(torch.float8_e8m0fnu)), got)


def test_mxfp4_quant_round_trips_and_rounds_to_nearest():
    g = torch.Generator().manual_seed(19)
    x = torch.randn(8, 128, generator=g)
    packed, s = Q.mxfp4_quant(x)
    back = Q.mxfp4_dequant(packed, s)
    # every value is the nearest e2m1 grid point of x / scale (saturating at 6)
    grid = torch.tensor(sorted(set(Q.E2M1_VALUES)))
    xs = (x.view(8, 4, 32) / s[..., None]).clamp(-6, 6)
    nearest = (xs[..., None] - grid).abs().min(-1).values
    assert torch.allclose((back.view(8, 4, 32) / s[..., None] - xs).abs(), nearest)
    # scales are powers of two (e8m0) and the group maximum maps into [4, 8) before saturation
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)
    amax = x.view(8, 4, 32).abs().amax(-1) / s
    assert ((amax >= 4) & (amax < 8)).all()


def test_block_dequant_equals_block_quant_dequant():
    from sglang.srt.layers.quantization.fp8_utils import block_quant_dequant

    g = torch.Generator().manual_seed(20)
    w = torch.randn(2048, 640, generator=g)
    q, s = Q.block_quant(w, 128)
    assert s.shape == (16, 5)
    for dt in (torch.float32, torch.bfloat16):
        assert torch.equal(Q.block_dequant(q, s, 128, dt), block_quant_dequant(q, s, [128, 128], dt))
