"""Check mode (SGLANG_AMD_MONO_CHECK=1) on the tiny model, eager, on the CPU.

"SGLang's layer" here is the tiny model's covered-layer module (the torch reference on
SGLang's residual-stream protocol, test_forward_support.py), not SGLang's real
DeepseekV2DecoderLayer, which cannot run on a CPU. Proves the harness: each covered
layer is run twice on the same input and cache rows, the stream / KV row / index key
are compared with the spec's NUMERICS, every out-of-bound value is logged, the server
keeps the launch's cache rows, and the mode refuses CUDA-graph capture.
"""

from __future__ import annotations

import importlib.util
import logging
import pathlib
import types

import pytest
import torch
from sglang.kernels.plugin_kernels.amd.spec import BuildContext, Plan, ShapeKey

from mono_common.ref.fp8 import index_k_quant
from mono_glm53 import build as build_mod
from mono_glm53 import check as check_mod
from mono_glm53 import refusals

_spec = importlib.util.spec_from_file_location(
    "glm53_forward_support", pathlib.Path(__file__).with_name("test_forward_support.py")
)
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)

PLAN = Plan(key=ShapeKey(forward_mode="decode", batch_size=2, tokens_per_request=1))


def _built(model, monkeypatch):
    support.patch_pools(monkeypatch)
    monkeypatch.setenv("MONO_GLM53_LAYER", "reference")
    monkeypatch.setenv("SGLANG_AMD_MONO_CHECK", "1")
    ctx = BuildContext(isa="sm_90", widths=(2,), deadline_s=60.0, copies={})
    return build_mod.build(model, model.config, ctx, shape=model.shape)


def test_dequant_index_keys_reads_sglangs_page_layout():
    s = support.tiny_shape()
    d, p = s.index_head_dim, s.page
    keys = torch.randn(3 * p, d)
    q, sc = index_k_quant(keys)
    cache = torch.zeros(3, p * (d + 4), dtype=torch.uint8)
    cache[:, : p * d] = q.view(torch.uint8).view(3, p * d)
    cache[:, p * d :] = sc.view(torch.uint8).view(3, p * 4)
    loc = torch.tensor([5, p + 7, 2 * p + p - 1])
    got = check_mod.dequant_index_keys(cache, loc, d)
    want = q.float()[loc] * sc.view(-1)[loc, None]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_check_mode_agrees_and_keeps_the_launch_rows(monkeypatch):
    model = support.TinyGlm()
    built = _built(model, monkeypatch)
    hook = built._forward.layer_hook
    assert isinstance(hook, check_mod.CheckHook)
    pool = model.pool.clone()
    ids, pos, fb = support.forward_batch(model, pool=pool)
    logits = built.forward(PLAN, ids, pos, fb)
    assert hook.layers_checked == 2 and hook.violations == []
    ref_pool = model.pool.clone()
    _, _, fb_ref = support.forward_batch(model, pool=ref_pool)
    torch.testing.assert_close(logits, support.reference_forward(model, ids, pos, fb_ref, ref_pool), rtol=0, atol=0)
    for i in (3, 4):
        assert torch.equal(pool.kv[i], ref_pool.kv[i]) and torch.equal(pool.index_k[i], ref_pool.index_k[i])


def test_every_out_of_bound_value_is_logged(monkeypatch, caplog):
    model = support.TinyGlm()
    built = _built(model, monkeypatch)
    inner_run = built._forward.launcher.run

    def faulty(layer_id, hidden, residual, step, caches, prev_topk):
        h, r, t = inner_run(layer_id, hidden, residual, step, caches, prev_topk)
        caches.kv[step.out_cache_loc] = -caches.kv[step.out_cache_loc]  # a wrong KV row
        return (h.float() * 1.5).to(h.dtype), r, t  # and a wrong stream

    monkeypatch.setattr(built._forward.launcher, "run", faulty)
    ids, pos, fb = support.forward_batch(model, pool=model.pool.clone())
    with caplog.at_level(logging.WARNING, logger="mono_glm53.check"):
        built.forward(PLAN, ids, pos, fb)
    hook = built._forward.layer_hook
    bounds = {(layer, v.bound) for layer, v in hook.violations}
    for layer in (3, 4):
        assert (layer, "layer.kv.cosine") in bounds and (layer, "layer.kv.rel") in bounds
        assert (layer, "layer.stream.rel") in bounds
        # the relative error SGLang's Numerics cannot name, checked beside it (check.REL_L2_BOUNDS)
        assert (layer, "layer.stream.rel_l2") in bounds
    assert not any(v.bound.startswith("layer.index_k") for _, v in hook.violations)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mono-glm53 check:")]
    assert len(logged) == len(hook.violations)
    assert any("layer 3: layer.kv.cosine = " in m and "needs >= 0.9999" in m for m in logged)


def test_check_mode_refuses_capture(monkeypatch):
    model = support.TinyGlm(n_layers=4)
    built = _built(model, monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    ids, pos, fb = support.forward_batch(model, pool=model.pool.clone())
    with pytest.raises(RuntimeError, match="--disable-cuda-graph"):
        built.forward(PLAN, ids, pos, fb)


def test_check_mode_with_decode_graphs_is_refused_at_startup(monkeypatch):
    graphs = types.SimpleNamespace(decode=types.SimpleNamespace(backend="full", bs=[2, 4, 8]))
    assert refusals.check_mode_reasons(types.SimpleNamespace(cuda_graph_config=graphs)) == []
    monkeypatch.setenv("SGLANG_AMD_MONO_CHECK", "1")
    (reason,) = refusals.check_mode_reasons(types.SimpleNamespace(cuda_graph_config=graphs))
    assert "--disable-cuda-graph" in reason
    eager = types.SimpleNamespace(decode=types.SimpleNamespace(backend="disabled", bs=None))
    assert refusals.check_mode_reasons(types.SimpleNamespace(cuda_graph_config=eager)) == []
