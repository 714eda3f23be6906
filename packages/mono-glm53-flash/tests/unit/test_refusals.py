"""Startup refusals of GLM-5.3-Flash's spec, run through the real SGLang 0.5.23 binding.

The spec is not registered by the package (no kernel, no entry point); each test registers it
by hand in a throwaway copy of SGLang's registry, then calls `monokernel_disable_reasons`
(sglang.srt.kernel_plugins.amd.binding) as SGLang's launcher does: a SimpleNamespace cfg with
every ServerArgs field at its default plus the values SGLang resolves for a GLM-5.3-Flash
server (page size 256, the DSA backend), a real `Glm5NextConfig` with the checkpoint's values,
and `isa` given explicitly (no GPU here). Each refusal fires with its message (what was wrong
and the fix), all reasons come back at once, each once, and the good config has none once the
"no kernel yet" refusal is set aside.
"""

from __future__ import annotations

import types

import msgspec
import pytest
from sglang.kernels.plugin_kernels.amd import spec as amd_spec
from sglang.srt.arg_groups.arg_utils import record_fields
from sglang.srt.configs.glm5_next import Glm5NextConfig
from sglang.srt.kernel_plugins.amd import binding
from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig
from sglang.srt.server_args import ServerArgs

from mono_glm53_flash import ARCHITECTURE
from mono_glm53_flash import refusals as _r
from mono_glm53_flash.spec import SPEC_PATH

DEFAULT_DECODE_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
MIXED_QUANT = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
    "routed_experts_quant_method": "mxfp4",
}
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


def server_defaults() -> dict:
    vals = {}
    for f in record_fields(ServerArgs):
        if f.default is not msgspec.NODEFAULT:
            vals[f.name] = f.default
        elif f.default_factory is not msgspec.NODEFAULT:
            vals[f.name] = f.default_factory()
        else:
            vals[f.name] = None
    return vals


def good_cfg(**over) -> types.SimpleNamespace:
    """A resolved TP4 GLM-5.3-Flash server, as SGLang's pipeline leaves it on H200 / MI355X."""
    vals = server_defaults()
    vals.update(
        model_path="zai-org/GLM-5.3-Flash",
        enable_amd_monokernel=True,
        tp_size=4,
        attention_backend="dsa",
        page_size=256,
        kv_cache_dtype="bfloat16",
        moe_runner_backend="auto",
        cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend="full", bs=list(DEFAULT_DECODE_BS), max_bs=64)),
        _cuda_graph_config_locked=set(),
    )
    vals.update(over)
    return types.SimpleNamespace(**vals)


def good_hf(quant=MIXED_QUANT, **text_over) -> Glm5NextConfig:
    text = {**CHECKPOINT_TEXT, **text_over}
    return Glm5NextConfig(text_config=text, architectures=[ARCHITECTURE], quantization_config=quant)


def reasons_for(cfg=None, hf=None, isa="sm_90", dtype="bfloat16"):
    model_config = types.SimpleNamespace(hf_config=hf or good_hf(), dtype=dtype)
    return binding.monokernel_disable_reasons(cfg=cfg or good_cfg(), model_config=model_config, isa=isa)


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    amd_spec.register(backend="amd", architecture=ARCHITECTURE, path=SPEC_PATH)
    # No kernel exists yet, so the spec refuses every server (tested below); the other
    # refusals are shown with that one set aside.
    monkeypatch.setattr(_r, "kernel_reasons", lambda: [])


def _one(reasons, needle):
    hits = [r for r in reasons if needle in r]
    assert len(hits) == 1, f"{len(hits)} reasons containing {needle!r} in {reasons}"
    return hits[0]


def test_without_a_kernel_every_server_is_refused(monkeypatch):
    monkeypatch.undo()  # the real registry and the real kernel_reasons
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    amd_spec.register(backend="amd", architecture=ARCHITECTURE, path=SPEC_PATH)
    for isa in ("sm_90", "gfx950"):
        _, reasons = reasons_for(isa=isa)
        assert len(reasons) == 1, reasons
        assert "ships no GLM-5.3-Flash layer kernel yet" in reasons[0]
        assert "serve without --enable-amd-monokernel" in reasons[0]


@pytest.mark.parametrize("isa", ["sm_90", "gfx950"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_good_config_has_no_reason(isa, tp):
    spec, reasons = reasons_for(good_cfg(tp_size=tp), isa=isa)
    assert spec is not None and spec.name == "mono-glm53-flash"
    assert reasons == []


def test_tp1_and_other_isas_are_refused_in_sglangs_words():
    _, reasons = reasons_for(good_cfg(tp_size=1))
    assert reasons == ["tp_size 1 is not one of ['2', '4', '8']"]
    spec, reasons = reasons_for(isa="gfx942")
    assert spec is None and "gfx942" in reasons[0]


# (cfg overrides, quantization_config or None to keep, text config overrides, env, words)
CASES = {
    "page size": ({"page_size": 64}, None, {}, {}, ["page size 64 is not 256", "--page-size 256"]),
    "kv cache dtype": ({"kv_cache_dtype": "fp8_e4m3"}, None, {}, {}, ["--kv-cache-dtype fp8_e4m3", "--kv-cache-dtype bfloat16"]),
    "moe runner": ({"moe_runner_backend": "marlin"}, None, {}, {}, ["--moe-runner-backend marlin", "--moe-runner-backend auto"]),
    "hisparse": ({"enable_hisparse": True}, None, {}, {}, ["--enable-hisparse", "without --enable-hisparse"]),
    "expert distribution recorder": ({"expert_distribution_recorder_mode": "stat"}, None, {}, {}, ["--expert-distribution-recorder-mode stat", "without --expert-distribution-recorder-mode"]),
    "replayssm": ({"enable_linear_replayssm": True}, None, {}, {}, ["--enable-linear-replayssm keeps the KDA state", "without --enable-linear-replayssm"]),
    "replayssm spec": ({"enable_linear_replayssm_spec": True}, None, {}, {}, ["--enable-linear-replayssm-spec", "without --enable-linear-replayssm-spec"]),
    "ssm dtype": ({"mamba_ssm_dtype": "bfloat16"}, None, {}, {}, ["--mamba-ssm-dtype bfloat16", "fp32", "without --mamba-ssm-dtype"]),
    "speculative decoding": ({"speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4}, None, {}, {}, ["speculative decoding (EAGLE)", "without --speculative-algorithm"]),
    "uniform routing override": ({}, None, {}, {"SGLANG_SIMULATE_UNIFORM_EXPERTS": "1"}, ["SGLANG_SIMULATE_UNIFORM_EXPERTS is set", "benchmark routing override", "unset SGLANG_SIMULATE_UNIFORM_EXPERTS"]),
    "round-robin routing override": ({}, None, {}, {"SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS": "1"}, ["SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS is set", "unset SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS"]),
    "conv state dtype": ({}, None, {}, {"SGLANG_MAMBA_CONV_DTYPE": "float32"}, ["SGLANG_MAMBA_CONV_DTYPE=float32", "unset SGLANG_MAMBA_CONV_DTYPE"]),
    "ssm state dtype env": ({}, None, {}, {"SGLANG_MAMBA_SSM_DTYPE": "bfloat16"}, ["SGLANG_MAMBA_SSM_DTYPE=bfloat16", "unset SGLANG_MAMBA_SSM_DTYPE"]),
    "moe_layer_freq": ({}, None, {"moe_layer_freq": 2}, {}, ["config.moe_layer_freq 2", "moe_layer_freq 1"]),
    "no mhc": ({}, None, {"mhc": False}, {}, ["config.mhc is off", "mhc true"]),
    "per-token index cache": ({}, None, {"index_kpool": 1}, {}, ["not IndexerKPool's 4-token pooled cache (index_kpool 1", "index_kpool 4"]),
    "uncompressed kpool": ({}, None, {"index_kpool_compress": False}, {}, ["index_kpool_compress False", "compress and always_select_tail true"]),
    "shared top-k layers": ({}, None, {"index_topk_freq": 2}, {}, ["reuse the previous layer's top-k", "without shared top-k layers"]),
    "unquantized checkpoint": ({}, {}, {}, {}, ["the checkpoint is unquantized", "mixed FP8/MXFP4 checkpoint"]),
    "FP8 block 32": ({}, dict(MIXED_QUANT, weight_block_size=[32, 32]), {}, {}, ["weight_block_size is [32, 32]", "mixed FP8/MXFP4 checkpoint"]),
    "FP8 routed experts": ({}, {k: v for k, v in MIXED_QUANT.items() if k != "routed_experts_quant_method"}, {}, {}, ["the routed experts are not MXFP4", "routed_experts_quant_method 'mxfp4'"]),
    "bf16 shared expert": ({}, dict(MIXED_QUANT, ignored_layers=["model.layers.3.mlp.shared_experts"]), {}, {}, ["leaves the shared experts unquantized (bf16)", "FP8 block-128 shared expert"]),
    "--quantization": ({"quantization": "w8a8_fp8"}, None, {}, {}, ["--quantization w8a8_fp8", "without --quantization"]),
    "another model's shapes": ({}, None, {"hidden_size": 6144}, {}, ["config.hidden_size is 6144, not 4096", "serve GLM-5.3-Flash"]),
    "explicit graphs above every width": (
        {
            "cuda_graph_config": CudaGraphConfig(decode=PhaseConfig(backend="full", bs=[16, 32], max_bs=32)),
            "_cuda_graph_config_locked": {("decode", "bs")},
        },
        None,
        {},
        {},
        ["batch sizes [16, 32]", "at TP 4 it serves batch sizes [1, 2, 4, 8]", "--cuda-graph-bs-decode 1 2 4 8"],
    ),
    "breakable decode graphs": (
        {"cuda_graph_config": CudaGraphConfig(decode=PhaseConfig(backend="breakable", bs=[1, 2, 4, 8]))},
        None,
        {},
        {},
        ["'breakable'", "'full' decode graph backend"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_refusal_fires_once_with_its_fix(case, monkeypatch):
    cfg_over, quant, text_over, env, words = CASES[case]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    hf = good_hf(MIXED_QUANT if quant is None else (quant or None), **text_over)
    _, reasons = reasons_for(good_cfg(**cfg_over), hf)
    msg = _one(reasons, words[0])
    for w in words[1:]:
        assert w in msg, (case, msg)
    assert len(reasons) == len(set(reasons)), reasons


def test_speculative_decoding_is_refused_once_not_also_in_sglangs_words():
    cfg = good_cfg(speculative_algorithm="EAGLE3", speculative_num_draft_tokens=4)
    _, reasons = reasons_for(cfg)
    assert [r for r in reasons if "speculative" in r.lower() or "eagle3" in r.lower()] == [
        "speculative decoding (EAGLE3): the kernel runs one decode token a request, not target-verify "
        "steps; start the server without --speculative-algorithm"
    ]


def test_dtype_and_attention_backend_are_sglangs():
    _, reasons = reasons_for(good_cfg(attention_backend="flashmla"), dtype="float16")
    assert "dtype 'float16' is not one of ['bfloat16']" in reasons
    assert "decode attention backend 'flashmla' is not one of ['dsa', 'nsa']" in reasons


def test_every_reason_comes_at_once(monkeypatch):
    monkeypatch.setenv("SGLANG_SIMULATE_UNIFORM_EXPERTS", "1")
    cfg = good_cfg(page_size=64, kv_cache_dtype="fp8_e4m3", enable_hisparse=True, enable_linear_replayssm=True,
                   enable_torch_compile=True)
    _, reasons = reasons_for(cfg, good_hf(None, index_kpool=1, moe_layer_freq=2))
    for needle in (
        "torch-compiled decode is in use",
        "page size 64 is not 256",
        "--kv-cache-dtype fp8_e4m3",
        "--enable-hisparse",
        "--enable-linear-replayssm",
        "index_kpool 1",
        "moe_layer_freq 2",
        "the checkpoint is unquantized",
        "SGLANG_SIMULATE_UNIFORM_EXPERTS is set",
    ):
        _one(reasons, needle)
    assert len(reasons) == len(set(reasons))


def test_handle_amd_monokernel_aligns_graphs_and_raises_all_reasons(monkeypatch):
    """SGLang's resolution step with its CPU seams patched (sglang-contract.md section 4)."""
    declared = {}
    hf = good_hf()
    monkeypatch.setattr(binding, "device_isa", lambda: "gfx950")
    monkeypatch.setattr(binding, "model_config_of", lambda sa: types.SimpleNamespace(hf_config=hf, dtype="bfloat16"))
    monkeypatch.setattr(binding, "declare_resolution", lambda sa, src, **kw: declared.update(kw))
    monkeypatch.setattr(binding, "resolving_view", lambda sa: sa)
    graphs = CudaGraphConfig(decode=PhaseConfig(backend="full", bs=[1, 2, 3, 4, 6, 8, 12, 16], max_bs=16))
    binding.handle_amd_monokernel(good_cfg(cuda_graph_config=graphs))
    assert declared["cuda_graph_config"].decode.bs == [1, 2, 4, 8, 12, 16]
    with pytest.raises(ValueError) as err:
        binding.handle_amd_monokernel(good_cfg(page_size=64, kv_cache_dtype="fp8_e4m3"))
    text = str(err.value)
    assert text.startswith("--enable-amd-monokernel cannot run this setup:")
    assert "--page-size 256" in text and "--kv-cache-dtype bfloat16" in text
