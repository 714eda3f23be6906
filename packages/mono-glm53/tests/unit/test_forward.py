"""The forward's plumbing on the tiny config, against a mono-free reference step.

What this proves: `build` reads SGLang's module tree in place (the fused shared expert
as expert E, the W_UK/W_UV packs, the router, the rotary table copy), `GlmMonoForward`
runs the embedding and dense layers 0..2 through SGLang's residual-stream protocol,
exports the (output, residual) pair with SGLang's `residual_batch.to_pp`, reaches each
covered layer's caches through the pool accessors, writes the MLA KV row and index key
of every row, and ends with SGLang's `final_norm_pair` and the logits; and that the
result and every cache byte equal the reference step bit for bit.

The plumbing tests run the covered layers on `build.ReferenceLayer` (MONO_GLM53_LAYER=
reference, the torch reference): they prove the plumbing, not the kernel. The last test
runs the same forward with `build.KernelLayer` (the Triton kernel, staged mode, under
TRITON_INTERPRET=1) and compares it with the reference step against NUMERICS.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch
from sglang.kernels.plugin_kernels.amd.spec import BuildContext, Plan, ShapeKey

from mono_glm53 import build as build_mod
from mono_glm53.build import BuiltGlm53, ReferenceLayer

_spec = importlib.util.spec_from_file_location(
    "glm53_forward_support", pathlib.Path(__file__).with_name("test_forward_support.py")
)
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)


@pytest.fixture(scope="module")
def tiny_model():
    return support.TinyGlm()


def _build(model, monkeypatch, widths=(2,)):
    support.patch_pools(monkeypatch)
    monkeypatch.setenv("MONO_GLM53_LAYER", "reference")
    ctx = BuildContext(isa="sm_90", widths=widths, deadline_s=60.0, copies={})
    built = build_mod.build(model, model.config, ctx, shape=model.shape)
    return built, ctx


def test_build_returns_a_built_object_with_its_copies(tiny_model, monkeypatch):
    built, ctx = _build(tiny_model, monkeypatch)
    assert isinstance(built, BuiltGlm53) and built.widths == (2,)
    assert isinstance(built._forward.launcher, ReferenceLayer)
    kinds = sorted({k[0] for k in ctx.copies})
    assert kinds == ["rotary", "w_uk", "w_uv"]  # the tiny gate is bf16: no router copy
    for i in (3, 4):
        w = built._forward.launcher.weights[i]
        assert ctx.copies[("w_uk", i)].is_contiguous()
        torch.testing.assert_close(ctx.copies[("w_uk", i)], tiny_model.layer_weights[i]["self_attn.w_kc"], rtol=0, atol=0)
        # the fused shared expert is read in place as expert E
        assert w["mlp.shared_experts.gate_up_proj.weight"].data_ptr() == (
            tiny_model.model.layers[i].mlp.experts.w13_weight.data[tiny_model.shape.n_experts].data_ptr()
        )
        assert w["self_attn.q_b_proj.weight"].data_ptr() == tiny_model.model.layers[i].self_attn.q_b_proj.weight.data_ptr()


def test_fp32_router_gets_a_bf16_copy(monkeypatch):
    model = support.TinyGlm(n_layers=4)
    gate = model.model.layers[3].mlp.gate
    gate.weight = torch.nn.Parameter(gate.weight.data.float(), requires_grad=False)
    _, ctx = _build(model, monkeypatch)
    assert ctx.copies[("router", 3)].dtype == torch.bfloat16


def test_widths_outside_the_kernel_are_refused(tiny_model, monkeypatch):
    with pytest.raises(ValueError, match="cannot build widths"):
        _build(tiny_model, monkeypatch, widths=(3,))


def test_forward_writes_the_same_caches_and_returns_the_same_logits(tiny_model, monkeypatch):
    built, _ = _build(tiny_model, monkeypatch)
    pool_mono = tiny_model.pool.clone()
    pool_ref = tiny_model.pool.clone()
    before = tiny_model.pool.clone()
    ids, pos, fb = support.forward_batch(tiny_model, pool=pool_mono)
    # the covered layers read the pool the forward batch carries
    plan = Plan(key=ShapeKey(forward_mode="decode", batch_size=2, tokens_per_request=1))
    logits = built.forward(plan, ids, pos, fb)
    _, _, fb_ref = support.forward_batch(tiny_model, pool=pool_ref)
    expected = support.reference_forward(tiny_model, ids, pos, fb_ref, pool_ref)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    loc = fb.out_cache_loc
    for i in (3, 4):
        assert torch.equal(pool_mono.kv[i], pool_ref.kv[i]), i
        assert torch.equal(pool_mono.index_k[i], pool_ref.index_k[i]), i
        # every row wrote its KV row (and nothing else changed)
        changed = (pool_mono.kv[i] != before.kv[i]).any(dim=-1).any(dim=-1).nonzero().flatten()
        assert sorted(changed.tolist()) == sorted(loc.tolist())
        assert not torch.equal(pool_mono.index_k[i], before.index_k[i])
    assert fb.residual_stream is None  # the stream was consumed, as SGLang's forward leaves it


def test_forward_refuses_a_step_of_other_rows(tiny_model, monkeypatch):
    built, _ = _build(tiny_model, monkeypatch)
    ids, pos, fb = support.forward_batch(tiny_model, pool=tiny_model.pool.clone())
    plan = Plan(key=ShapeKey(forward_mode="decode", batch_size=4, tokens_per_request=1))
    with pytest.raises(RuntimeError, match="routed as"):
        built.forward(plan, ids, pos, fb)


def test_forward_on_the_kernel_in_staged_mode_under_the_interpreter():
    """The Triton layer kernel (staged: one launch a stage) under TRITON_INTERPRET=1, driven
    by the forward, equals the kernel launched directly on the same step bit for bit
    (logits and caches), and the covered layer's output stream, KV rows and index keys are
    within NUMERICS of the torch reference step (the tiny model has 8 index heads, so the
    index top-k has no exact ties).
    It runs in a fresh interpreter: TRITON_INTERPRET must be set before any Triton kernel
    (mono_common's guard included) is defined."""
    import os
    import subprocess
    import sys

    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "import importlib.util, pathlib\n"
        f"p = pathlib.Path({str(pathlib.Path(__file__).with_name('test_forward_support.py'))!r})\n"
        "spec = importlib.util.spec_from_file_location('glm53_forward_support', p)\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print('RESULT', m.kernel_forward_check())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1500, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-4000:]
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")][-1]
    assert line == "RESULT (True, [])", line
