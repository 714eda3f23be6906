"""SGLang's own `install_monokernel_forward` installs GLM-5.3's forward (contract.md section 4).

The runtime context is mocked exactly at the seams the contract lists (`_backend`,
`device_isa`, `_gather_tp`, `get_device`, `get_spec`, `get_exec`, `attention_backends`,
`get_attn_backend`, `torch.cuda.{get_device_properties,current_device,memory_allocated,
is_current_stream_capturing}`); everything else is SGLang 0.5.23's code. The model is the
tiny SGLang-shaped model of test_forward_support.py, the spec is the registered
`mono_glm53.spec:SPEC` (its real `model_disable_reasons` and `build`, with the torch
reference as the covered-layer launcher). Proves: the signature is kept, served keys
route to the built forward (which really runs), other keys and modes go to the model's
forward, the capture check passes for the aligned graphs and refuses graphs that are all
wider than the widths, and the model refusals stop install on every rank.
"""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import types

import pytest
import torch
from sglang.kernels.plugin_kernels.amd import spec as amd_spec
from sglang.srt.kernel_plugins.amd import binding
from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig

from mono_glm53 import ARCHITECTURE
from mono_glm53.plugin import SPEC_PATH

_spec = importlib.util.spec_from_file_location(
    "glm53_forward_support", pathlib.Path(__file__).with_name("test_forward_support.py")
)
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)

ALIGNED_BS = [2, 4, 8, 12, 16, 24, 32]  # what handle_amd_monokernel leaves for widths (2, 4, 8)


def mock_runtime(monkeypatch, *, bs=ALIGNED_BS, graphs="full", sms=132, capturing=False):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    amd_spec.register(backend="amd", architecture=ARCHITECTURE, path=SPEC_PATH)
    monkeypatch.setenv("MONO_GLM53_LAYER", "reference")
    support.patch_pools(monkeypatch)
    monkeypatch.setattr(binding, "_backend", lambda: "amd")
    monkeypatch.setattr(binding, "device_isa", lambda: "sm_90")
    monkeypatch.setattr(binding, "_gather_tp", lambda obj: [obj])
    monkeypatch.setattr(binding, "get_device", lambda: types.SimpleNamespace(watchdog_timeout=300))
    monkeypatch.setattr(binding, "get_spec", lambda: types.SimpleNamespace(speculative_algorithm=None, speculative_num_draft_tokens=None))
    graph = CudaGraphConfig(decode=PhaseConfig(backend=graphs, bs=list(bs), max_bs=max(bs)))
    monkeypatch.setattr(binding, "get_exec", lambda: types.SimpleNamespace(graph=types.SimpleNamespace(cuda_graph_config=graph)))
    monkeypatch.setattr(binding, "attention_backends", lambda: ("dsa", "dsa"))
    monkeypatch.setattr(binding, "get_attn_backend", lambda: types.SimpleNamespace(decode_attention_backend_str="dsa"))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(multi_processor_count=sms))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)


def install(model, hooks=None):
    hooks = [] if hooks is None else hooks
    binding.install_monokernel_forward(model=model, hf_config=model.config, capture_tail_hooks=hooks)
    return hooks


def test_install_routes_served_keys_and_falls_back(monkeypatch):
    mock_runtime(monkeypatch)
    model = support.TinyGlm()
    original_sig = inspect.signature(model.forward)
    hooks = install(model)
    assert "forward" in model.__dict__
    assert inspect.signature(model.forward) == original_sig
    served, unread = model._monokernel_unread_metadata
    assert {k.batch_size for k in served} == {2, 4, 8} and unread == frozenset()
    assert "Online weight updates are not supported" in model._derived_weight_cache_error

    # a served key (decode, batch 2) runs the built forward: real logits, caches written
    ids, pos, fb = support.forward_batch(model, pool=model.pool.clone())
    logits = model.forward(ids, pos, fb)
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, support.VOCAB)
    _, _, fb_ref = support.forward_batch(model, pool=model.pool.clone())
    expected = support.reference_forward(model, ids, pos, fb_ref, fb_ref.token_to_kv_pool)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    # keyword forward_batch routes too
    _, _, fb2 = support.forward_batch(model, pool=model.pool.clone())
    assert isinstance(model.forward(ids, pos, forward_batch=fb2), torch.Tensor)

    # everything else: the model's own forward
    _, _, fb_one = support.forward_batch(model, rows=1)
    assert model.forward(ids[:1], pos[:1], fb_one) == "the model's own forward"
    _, _, fb_ext = support.forward_batch(model, mode="extend")
    assert model.forward(ids, pos, fb_ext) == "the model's own forward"

    # the capture check: one hook, satisfied once every graph size is seen
    assert len(hooks) == 1
    check = hooks[0]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    runner = types.SimpleNamespace(capture_bs=ALIGNED_BS)
    for bs in ALIGNED_BS:
        fake = types.SimpleNamespace(forward_mode=support.Mode("decode"), batch_size=bs, input_ids=torch.zeros(bs))
        check(runner, None, fake, bs)
    assert check.is_done


def test_capture_check_refuses_graphs_all_wider_than_the_widths(monkeypatch):
    mock_runtime(monkeypatch, bs=ALIGNED_BS)
    model = support.TinyGlm()
    check = install(model)[0]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    runner = types.SimpleNamespace(capture_bs=[16, 32])
    with pytest.raises(ValueError, match="none of the 2 captured decode graphs"):
        for bs in (16, 32):
            fake = types.SimpleNamespace(forward_mode=support.Mode("decode"), batch_size=bs, input_ids=torch.zeros(bs))
            check(runner, None, fake, bs)


def test_install_refuses_when_no_graph_holds_a_width(monkeypatch):
    mock_runtime(monkeypatch, bs=[16, 32])
    with pytest.raises(ValueError, match="has no width for this server's steps"):
        install(support.TinyGlm())


def test_eager_server_routes_every_width(monkeypatch):
    mock_runtime(monkeypatch, graphs="disabled")
    model = support.TinyGlm()
    assert install(model) == []
    served, _ = model._monokernel_unread_metadata
    assert {k.rows for k in served} == {2, 4, 8}


def test_model_refusals_stop_install(monkeypatch):
    mock_runtime(monkeypatch, sms=100)
    model = support.TinyGlm(n_layers=4)
    layer = model.model.layers[3]
    layer.mlp.num_fused_shared_experts = 0
    layer.self_attn.q_b_proj.weight_scale_inv = torch.nn.Parameter(
        layer.self_attn.q_b_proj.weight_scale_inv.data.to(torch.bfloat16), requires_grad=False
    )
    gate = layer.mlp.gate
    gate.weight = torch.nn.Parameter(gate.weight.data.float() + 1e-4, requires_grad=False)
    type(layer.self_attn.indexer).__name__  # noqa: B018
    layer.self_attn.indexer.__class__ = type("IndexerKPool", (torch.nn.Module,), {})
    with pytest.raises(ValueError) as err:
        install(model)
    text = str(err.value)
    assert text.startswith("--enable-amd-monokernel: rank 0: ")
    for needle in (
        "layer 3.mlp: the shared expert is not fused",
        "layer 3.self_attn.q_b_proj.weight_scale_inv is torch.bfloat16",
        "bf16 cannot hold exactly",
        "indexer is IndexerKPool",
        "partitioned GPUs: 100 compute units, the launch grid needs 132",
    ):
        assert needle in text, needle
    assert "forward" not in model.__dict__


def test_missing_kernel_is_a_model_refusal(monkeypatch):
    import sys

    mock_runtime(monkeypatch)
    monkeypatch.setenv("MONO_GLM53_LAYER", "kernel")
    monkeypatch.setitem(sys.modules, "mono_glm53.kernels.layer", None)  # the import fails
    # ...also when an earlier test imported it (the package keeps the submodule attribute)
    import mono_glm53.kernels

    monkeypatch.delattr(mono_glm53.kernels, "layer", raising=False)
    model = support.TinyGlm(n_layers=4)
    with pytest.raises(ValueError, match=r"rank 0: the GLM-5.3 layer kernel \(mono_glm53\.kernels\.layer\) does not import"):
        install(model)
