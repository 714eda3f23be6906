"""Startup refusals of GLM-5.3's spec, run through the real SGLang 0.5.23 binding.

`monokernel_disable_reasons` (sglang.srt.kernel_plugins.amd.binding) is called as
SGLang's launcher calls it, with a SimpleNamespace cfg holding every ServerArgs
field at its default plus the resolved values of a good GLM-5.3 server, a real
transformers `GlmMoeDsaConfig` and `isa` given explicitly (no GPU here). Each
refusal is shown to fire with its message (what was wrong and what to pass), all
reasons come back at once, and the good config has none.
"""

from __future__ import annotations

import types

import msgspec
import pytest
from sglang.kernels.plugin_kernels.amd import spec as amd_spec
from sglang.srt.arg_groups.arg_utils import record_fields
from sglang.srt.kernel_plugins.amd import binding
from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig
from sglang.srt.server_args import ServerArgs
from transformers import GlmMoeDsaConfig

from mono_glm53 import ARCHITECTURE
from mono_glm53.plugin import SPEC_PATH

DEFAULT_DECODE_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
FP8_QUANT = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
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
    """A resolved TP8 GLM-5.3 server: what SGLang's pipeline leaves for H200/MI355X."""
    vals = server_defaults()
    vals.update(
        model_path="zai-org/GLM-5.3",
        enable_amd_monokernel=True,
        tp_size=8,
        attention_backend="dsa",
        page_size=64,
        kv_cache_dtype="bfloat16",
        moe_runner_backend="auto",
        cuda_graph_config=CudaGraphConfig(
            decode=PhaseConfig(backend="full", bs=list(DEFAULT_DECODE_BS), max_bs=64)
        ),
        _cuda_graph_config_locked=set(),
    )
    vals.update(over)
    return types.SimpleNamespace(**vals)


def good_hf(**over) -> GlmMoeDsaConfig:
    hf = GlmMoeDsaConfig(architectures=[ARCHITECTURE], quantization_config=dict(FP8_QUANT))
    hf.indexer_rope_interleave = True  # as the GLM-5.x checkpoints set it
    for k, v in over.items():
        setattr(hf, k, v)
    return hf


def reasons_for(cfg=None, hf=None, isa="sm_90", dtype="bfloat16"):
    model_config = types.SimpleNamespace(hf_config=hf or good_hf(), dtype=dtype)
    spec, reasons = binding.monokernel_disable_reasons(
        cfg=cfg or good_cfg(), model_config=model_config, isa=isa
    )
    return spec, reasons


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    amd_spec.register(backend="amd", architecture=ARCHITECTURE, path=SPEC_PATH)
    # the default launcher (the kernel); the TP sizes per ISA: test_tp_sizes.py
    monkeypatch.delenv("MONO_GLM53_LAYER", raising=False)


@pytest.mark.parametrize("isa", ["sm_90", "gfx950"])
def test_good_config_has_no_reason(isa):
    spec, reasons = reasons_for(isa=isa)
    assert spec is not None and spec.name == "mono-glm53"
    assert reasons == []


def _one(reasons, needle):
    hits = [r for r in reasons if needle in r]
    assert hits, f"no reason containing {needle!r} in {reasons}"
    return hits[0]


# (cfg overrides, hf overrides, env, words the message must hold)
CASES = {
    "bf16 checkpoint": ({}, {"quantization_config": None}, {}, ["unquantized", "FP8 e4m3 block-128"]),
    "other quant method": ({}, {"quantization_config": {"quant_method": "awq"}}, {}, ["'awq'", "FP8 e4m3 block-128"]),
    "block 32": ({}, {"quantization_config": dict(FP8_QUANT, weight_block_size=[32, 32])}, {}, ["[32, 32]", "block-128"]),
    "--quantization": ({"quantization": "w8a8_fp8"}, {}, {}, ["--quantization w8a8_fp8", "without --quantization"]),
    "page size": ({"page_size": 16}, {}, {}, ["page size 16 is not 64", "--page-size 64"]),
    "kv cache dtype": ({"kv_cache_dtype": "fp8_e4m3"}, {}, {}, ["--kv-cache-dtype fp8_e4m3", "--kv-cache-dtype bfloat16"]),
    "moe runner": ({"moe_runner_backend": "deep_gemm"}, {}, {}, ["--moe-runner-backend deep_gemm", "--moe-runner-backend auto"]),
    "unfused shared expert": ({"disable_shared_experts_fusion": True}, {}, {}, ["shared expert unfused", "without --disable-shared-experts-fusion"]),
    "hisparse": ({"enable_hisparse": True}, {}, {}, ["--enable-hisparse", "without --enable-hisparse"]),
    "expert distribution recorder": ({"expert_distribution_recorder_mode": "stat"}, {}, {}, ["--expert-distribution-recorder-mode stat", "without --expert-distribution-recorder-mode"]),
    "kpool indexer": ({}, {"index_kpool": 4}, {}, ["index_kpool 4", "IndexerKPool", "index_kpool 1"]),
    "rms index norm": ({}, {"index_k_norm_type": "rms"}, {}, ["index_k_norm_type 'rms'", "LayerNorm"]),
    "shared top-k layers": ({}, {"indexer_types": ["full"] * 10 + ["shared"] * 68}, {}, ["reuse the previous layer's top-k", "'full'"]),
    "yarn": ({}, {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}}, {}, ["scaled (yarn)", "rope_type 'default'"]),
    "context longer than rotary table": ({"context_length": 262144}, {}, {}, ["262144 tokens", "202752-row rotary table", "--context-length 202752"]),
    "unfused DSA top-k": ({}, {}, {"SGLANG_DSA_FUSE_TOPK": "0"}, ["SGLANG_DSA_FUSE_TOPK=0", "unfused DSA top-k", "unset SGLANG_DSA_FUSE_TOPK"]),
    "uniform routing override": ({}, {}, {"SGLANG_SIMULATE_UNIFORM_EXPERTS": "1"}, ["SGLANG_SIMULATE_UNIFORM_EXPERTS is set", "benchmark routing override", "unset SGLANG_SIMULATE_UNIFORM_EXPERTS"]),
    "round-robin routing override": ({}, {}, {"SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS": "1"}, ["SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS is set", "unset SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS"]),
    "explicit graphs above every width": (
        {
            "cuda_graph_config": CudaGraphConfig(decode=PhaseConfig(backend="full", bs=[16, 32], max_bs=32)),
            "_cuda_graph_config_locked": {("decode", "bs")},
        },
        {},
        {},
        ["batch sizes [16, 32]", "at TP 8 it serves batch sizes [2, 4, 8]", "--cuda-graph-bs-decode 2 4 8"],
    ),
    "graph ceiling below every width": (
        {"cuda_graph_config": CudaGraphConfig(decode=PhaseConfig(backend="full", bs=[1], max_bs=1))},
        {},
        {},
        ["batch sizes [1]", "serves batch sizes [2, 4, 8]"],
    ),
    "breakable decode graphs": (
        {"cuda_graph_config": CudaGraphConfig(decode=PhaseConfig(backend="breakable", bs=[2, 4, 8]))},
        {},
        {},
        ["'breakable'", "--cuda-graph-backend-decode full"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_refusal_fires_with_its_message(case, monkeypatch):
    cfg_over, hf_over, env, words = CASES[case]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    _, reasons = reasons_for(good_cfg(**cfg_over), good_hf(**hf_over))
    assert reasons, case
    msg = _one(reasons, words[0])
    for w in words[1:]:
        assert w in msg, (case, msg)


def test_requirement_values_are_refused_once_in_words_that_name_the_fix(monkeypatch):
    monkeypatch.setenv("SGLANG_DSA_FUSE_TOPK", "0")
    _, reasons = reasons_for(good_cfg(page_size=16), good_hf(hidden_size=4096))
    assert len(reasons) == 3, reasons  # not also in SGLang's generic words
    _one(reasons, "--page-size 64")
    _one(reasons, "hidden_size 4096, not 6144")
    _one(reasons, "unset SGLANG_DSA_FUSE_TOPK")


def test_dtype_and_attention_backend():
    _, reasons = reasons_for(good_cfg(attention_backend="flashmla"), dtype="float16")
    assert "dtype 'float16' is not one of ['bfloat16']" in reasons
    assert "decode attention backend 'flashmla' is not one of ['dsa', 'nsa']" in reasons
    # the split decode backend wins, as SGLang resolves it
    _, reasons = reasons_for(good_cfg(attention_backend="flashmla", decode_attention_backend="dsa"))
    assert reasons == []


def test_every_reason_comes_at_once(monkeypatch):
    monkeypatch.setenv("SGLANG_SIMULATE_UNIFORM_EXPERTS", "1")
    cfg = good_cfg(
        page_size=1,
        kv_cache_dtype="fp8_e4m3",
        enable_hisparse=True,
        disable_shared_experts_fusion=True,
        context_length=10**6,
        enable_torch_compile=True,
    )
    _, reasons = reasons_for(cfg, good_hf(index_kpool=4, quantization_config=None))
    for needle in (
        "--enable-torch-compile",
        "page size 1 is not 64",
        "--kv-cache-dtype fp8_e4m3",
        "--enable-hisparse",
        "--disable-shared-experts-fusion",
        "1000000 tokens",
        "index_kpool 4",
        "unquantized",
        "SGLANG_SIMULATE_UNIFORM_EXPERTS is set",
    ):
        _one(reasons, needle)


def test_handle_amd_monokernel_raises_all_reasons_and_aligns_graphs(monkeypatch):
    """SGLang's resolution step with its CPU seams patched (contract.md section 4)."""
    declared = {}
    hf = good_hf()
    monkeypatch.setattr(binding, "device_isa", lambda: "sm_90")
    monkeypatch.setattr(binding, "model_config_of", lambda sa: types.SimpleNamespace(hf_config=hf, dtype="bfloat16"))
    monkeypatch.setattr(binding, "declare_resolution", lambda sa, src, **kw: declared.update(kw))
    monkeypatch.setattr(binding, "resolving_view", lambda sa: sa)
    binding.handle_amd_monokernel(good_cfg())
    decode = declared["cuda_graph_config"].decode
    assert decode.bs == [2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
    with pytest.raises(ValueError) as err:
        binding.handle_amd_monokernel(good_cfg(page_size=16, kv_cache_dtype="fp8_e4m3"))
    text = str(err.value)
    assert text.startswith("--enable-amd-monokernel cannot run this setup:")
    assert "--page-size 64" in text and "--kv-cache-dtype bfloat16" in text


def test_no_gpu_is_a_reason():
    _, reasons = binding.monokernel_disable_reasons(
        cfg=good_cfg(), model_config=types.SimpleNamespace(hf_config=good_hf(), dtype="bfloat16"), isa=None
    )
    assert reasons == ["no GPU is visible"]
