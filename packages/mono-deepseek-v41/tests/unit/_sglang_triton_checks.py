"""SGLang's Triton kernels that have no torch form, run under TRITON_INTERPRET=1 on the CPU
against the reference. Run by test_reference_triton.py in a subprocess (the interpreter must
be on before Triton decorates SGLang's kernels at import): prints one JSON object
{check: [passed, detail]} as its last line. Not collected by pytest (no test_ prefix).

The interpreter truncates an fp32 value stored to a bf16 pointer (the GPU rounds to nearest
even), so the kernels are compared with fp32 outputs where they allow it, and a bf16 store
through the interpreter is allowed one bf16 ulp."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
torch.set_num_threads(1)

from mono_deepseek_v41 import layouts as L  # noqa: E402
from mono_deepseek_v41 import reference as R  # noqa: E402
from mono_deepseek_v41.config import tiny  # noqa: E402
from mono_deepseek_v41.quant import kv_quant_v4  # noqa: E402

results: dict[str, list] = {}


def check(name):
    def deco(fn):
        try:
            ok, detail = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none is raised
            ok, detail = False, f"raised {exc!r}"
        results[name] = [bool(ok), str(detail)]
        return fn

    return deco


def ulp_close(a, b, ulps=1):
    """|a - b| within `ulps` bf16 ulps of |b| (elementwise)."""
    a, b = a.float(), b.float()
    tol = ulps * torch.exp2(torch.floor(torch.log2(b.abs().clamp_min(2.0**-126))) - 7)
    return bool(((a - b).abs() <= tol).all()), float((a - b).abs().max().detach())


@check("mhc_combine")
def _():
    from sglang.kernels.ops.layernorm.mhc import mhc_combine

    torch.manual_seed(0)
    streams = torch.randn(5, 4, 96).bfloat16()
    pre = torch.rand(5, 4) + 0.1
    got = mhc_combine(streams.flatten(1), pre, 4, torch.float32).to(torch.bfloat16)
    want = R.hc_sum(streams, pre)
    return torch.equal(got, want), f"max |diff| {(got.float() - want.float()).abs().max():.3g}"


@check("hc_split_sinkhorn")
def _():
    from sglang.kernels.ops.layernorm.mhc import _hc_split_sinkhorn_triton

    torch.manual_seed(1)
    s = tiny()
    mixes = torch.randn(6, s.mix_hc)
    scale, base = torch.rand(3) + 0.5, torch.randn(s.mix_hc)
    pre, post, comb = _hc_split_sinkhorn_triton(mixes[None], scale, base, s.hc_mult, s.hc_sinkhorn_iters, s.hc_eps)
    p2, q2, c2 = R.hc_split(mixes, scale, base, s)
    # numpy's exp in the interpreter and torch's vectorised exp differ in the last fp32 bit;
    # twenty Sinkhorn rounds keep that below 1e-6 relative.
    errs = [float((a[0] - b).abs().max() / b.abs().max()) for a, b in ((pre, p2), (post, q2), (comb, c2))]
    return max(errs) < 1e-6, f"max rel {max(errs):.3g}"


@check("non_cuda_decoder_mixin")
def _():
    from sglang.kernels.ops.layernorm import mhc as mhc_ops
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.models import deepseek_v4_mhc as mhc
    from sglang.srt.models.deepseek_v4_platform_stage import NonCudaDecoderMixin

    # TileLang's Sinkhorn has no CPU form; its Triton port (SGLang's own, for gfx1250) does.
    mhc_ops.is_gfx1250_supported = lambda: True
    # mhc_combine's bf16 store: the kernel's fp32 sum, rounded as the GPU rounds it.
    combine = mhc_ops.mhc_combine
    mhc_ops.mhc_combine = lambda x, pre, hc, dtype: combine(x, pre, hc, torch.float32).to(dtype)
    torch.manual_seed(2)
    s = tiny(hidden=64, rms_eps=1e-6)
    h, m = s.hidden, s.hc_mult
    w = {}
    for sub in ("attn", "ffn"):
        w[f"hc_{sub}_fn"] = torch.randn(s.mix_hc, m * h) * (m * h) ** -0.5
        w[f"hc_{sub}_base"] = torch.randn(s.mix_hc) * 0.5
        w[f"hc_{sub}_scale"] = torch.rand(3) + 0.5
    norms = {}
    for key in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        n = RMSNorm(h, eps=s.rms_eps)
        with torch.no_grad():  # bf16 values: the served model's norm weights are bf16
            n.weight.copy_((1 + 0.1 * torch.randn(h)).bfloat16())
        n.forward = n.forward_native  # CPU: SGLang's platform probe would pick a CUDA kernel
        norms[key], w[key] = n, n.weight.detach().bfloat16()
    a_mat, m_mat = torch.randn(h, h) * h**-0.5, torch.randn(h, h) * h**-0.5

    def attn_fn(x):
        return torch.tanh(x.float() @ a_mat).bfloat16()

    def moe_fn(x):
        return torch.tanh(x.float() @ m_mat).bfloat16()

    cfg = mhc.HcConfig(mult=m, sinkhorn_iters=s.hc_sinkhorn_iters, eps=s.hc_eps, rms_eps=s.rms_eps, hidden=h,
                       pre_from_prev=True, cp_prefill=False)

    class Attn:
        attn_tp_size = 1

        def accepts_mxfp8_swizzled_input(self):
            return False

        @contextlib.contextmanager
        def maybe_use_decode_attn_tp(self, fb):
            yield

        def __call__(self, x, positions, forward_batch, x_quant=None, defer_all_reduce=False):
            return attn_fn(x)

    layer = types.SimpleNamespace(
        hc_cfg=cfg,
        attn_hc=mhc.HcSubLayer(cfg, w["hc_attn_fn"], w["hc_attn_scale"], w["hc_attn_base"],
                               norms["input_layernorm.weight"]),
        ffn_hc=mhc.HcSubLayer(cfg, w["hc_ffn_fn"], w["hc_ffn_scale"], w["hc_ffn_base"],
                              norms["post_attention_layernorm.weight"]),
        post_attention_layernorm=norms["post_attention_layernorm.weight"],
        input_layernorm=norms["input_layernorm.weight"],
        self_attn=Attn(), hc_stats_stream=None, local_boundary=None, next_boundary=None, _next_layer=None,
        _can_fuse_attn_mhc=False, _can_fuse_ffn_mhc=False, mlp=types.SimpleNamespace(tp_size=1),
        _run_moe_ffn_dp_sync=lambda x, fb, **kw: moe_fn(x),
    )
    layer._init_boundaries = types.MethodType(NonCudaDecoderMixin._init_boundaries, layer)
    fb = types.SimpleNamespace(forward_mode=ForwardMode.DECODE)
    streams = torch.randn(3, m, h).bfloat16()
    state, mine = mhc.HcState(streams.clone()), R.HcState(streams.clone())
    worst = 0.0
    for _ in range(3):  # three layers: the first combine has no pre, the next ones the lag
        state = NonCudaDecoderMixin.forward_hc_pre_from_prev(layer, None, state, None, fb, None)
        mine = R.hc_layer(mine, s, w, attn_fn, moe_fn)
        # the interpreter's numpy exp and torch's differ in the last fp32 bit inside the
        # Sinkhorn rounds, which may flip one bf16 rounding of a stream
        ok, d = ulp_close(mine.streams, state.streams, ulps=1)
        worst = max(worst, d)
        if not ok:
            return False, f"streams differ by {d:.3g}"
        if not torch.allclose(mine.pre, state.pre, rtol=1e-5, atol=1e-6):
            return False, "pre differs"
    return True, f"3 layers, max |streams diff| {worst:.3g}"


@check("dequantize_k_cache_paged_dsv4")
def _():
    from sglang.kernels.ops.attention.dsv4.dequant_k_cache import dequantize_k_cache_paged_dsv4
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout

    torch.manual_seed(3)
    page = 64
    buf = torch.zeros(3, KVLayout.V4.page_bytes(page), dtype=torch.uint8)
    loc = torch.tensor([1, 63, 64, 130, 191])
    L.v4_write(buf, loc, *kv_quant_v4(torch.randn(5, 512) * 3, 448), page)
    got = dequantize_k_cache_paged_dsv4(buf, loc, page)[:, 0]
    want = L.v4_read(buf, loc, page, 448, 64)
    return torch.equal(got, want), f"max |diff| {(got.float() - want.float()).abs().max():.3g}"


@check("apply_rotary_emb_triton")
def _():
    from sglang.kernels.ops.attention.dsv4.rope import apply_rotary_emb_triton, precompute_freqs_cis

    torch.manual_seed(4)
    fc = precompute_freqs_cis(64, 512, 128, 160000.0, 4.0, 32, 1)
    pos = torch.tensor([0, 7, 300, 511])
    worst = 0.0
    for inverse in (False, True):
        q = torch.randn(4, 3, 64).bfloat16().float()  # fp32 rows: no store rounding
        got = apply_rotary_emb_triton(q.clone(), fc, positions=pos, inverse=inverse)
        want = R.apply_rope(q, fc[pos], 64, inverse=inverse)
        d = float((got - want).abs().max())
        worst = max(worst, d)
        if not torch.equal(got, want):
            return False, f"inverse={inverse}: {d:.3g}"
    return True, f"max |diff| {worst:.3g}"


print(json.dumps(results))
sys.stdout.flush()
