"""The served forward at SGLang's default context length.

SGLang sizes its page table (`ReqToTokenPool.req_to_token`) as context_len + 4 plus the
draft tokens (mem_cache/kv_cache_configurator.py, extra_max_context_len), and context_len
defaults to max_position_embeddings. The kernel the build makes for a width must take a step
whose page table is that wide: built max_position_embeddings wide, its `set_inputs` refused
every routed step ("max_seq_len larger than built for"), so every server would fail at
warm-up. Checked on the CPU through `build` with the kernel launcher (nothing is launched).
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch
from sglang.kernels.plugin_kernels.amd.spec import BuildContext

from mono_glm53 import build as build_mod
from mono_glm53.forward import StepInputs

_spec = importlib.util.spec_from_file_location(
    "glm53_forward_support_ctx", pathlib.Path(__file__).with_name("test_forward_support.py"))
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)


@pytest.mark.parametrize("draft_tokens", [0, 3])
def test_the_kernel_takes_sglangs_page_table_at_the_default_context(monkeypatch, draft_tokens):
    support.patch_pools(monkeypatch)
    monkeypatch.setenv("MONO_GLM53_LAYER", "kernel")
    model = support.TinyGlm(n_layers=4)
    context_len = int(model.config.max_position_embeddings)  # SGLang's default context length
    ctx = BuildContext(isa="sm_90", widths=(2,), deadline_s=60.0, copies={})
    built = build_mod.build(model, model.config, ctx, shape=model.shape)
    launcher = built._forward.launcher
    assert isinstance(launcher, build_mod.KernelLayer)

    table = context_len + 4 + draft_tokens
    rtt = torch.arange(3 * table, dtype=torch.int32).view(3, table) % 1000
    step = StepInputs(
        positions=torch.tensor([context_len - 1, 4]),
        out_cache_loc=torch.tensor([17, 18]),
        seq_lens=torch.tensor([context_len, 5], dtype=torch.int32),  # a row at the full context
        req_pool_indices=torch.tensor([2, 0]),
        req_to_token=rtt,
        max_seq_len=int(rtt.shape[1]),
    )
    k = launcher.kernel(3, 2, step.max_seq_len)
    assert k.max_seq_len >= table and k.max_seq_len % model.shape.page == 0
    assert k.cs.shape[0] >= table  # its rope table reaches every position the table holds
    hidden = torch.randn(2, model.shape.hidden).to(torch.bfloat16)
    k.set_inputs(hidden, hidden, step)  # raised "max_seq_len larger than built for" before
    assert k.seqlen.tolist() == [context_len, 5] and k.rtt is rtt
    assert launcher.kernel(4, 2, step.max_seq_len) is k  # one kernel per width, every layer
