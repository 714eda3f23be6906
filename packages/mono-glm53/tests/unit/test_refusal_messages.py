"""Every startup refusal says what to change, once, through SGLang 0.5.23's real binding.

`monokernel_disable_reasons` (what `--enable-amd-monokernel` runs at startup) is called on
the README's server (`mono_glm53.serving`, resolved as `mono_common.serving` builds it) with
one thing changed at a time. Each refusal must name the flag, variable or config value to
change (and the accepted values where there is a list), come once, and not contradict
another; every flag a refusal names must be one SGLang's launcher accepts; mono's own
environment variables are refused before the weights load; malformed config values give a
reason, never a traceback.
"""

from __future__ import annotations

import argparse
import re
import types

import pytest
from sglang.kernels.plugin_kernels.amd import spec as amd_spec
from sglang.srt.kernel_plugins.amd import binding
from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig

from mono_common.serving import server_config
from mono_common.widths import merge_widths_by_tp
from mono_glm53 import ARCHITECTURE, refusals, serving
from mono_glm53 import spec as glm_spec
from mono_glm53.plugin import SPEC_PATH

SETUP = serving.setup()
MONO_ENVS = ("MONO_GLM53_LAYER", "MONO_GLM53_KERNEL_MODE", "MONO_GLM53_FAULT", "MONO_GUARD_MODE",
             "SGLANG_AMD_MONO_CHECK", "SGLANG_DSA_FUSE_TOPK", "SGLANG_SIMULATE_UNIFORM_EXPERTS",
             "SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS")


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    amd_spec.register(backend="amd", architecture=ARCHITECTURE, path=SPEC_PATH)
    for name in MONO_ENVS:
        monkeypatch.delenv(name, raising=False)


def cfg(tp=8, **over):
    c = server_config(SETUP, tp)
    for k, v in over.items():
        setattr(c, k, v)
    return c


def hf(**over):
    h = serving.hf_config()
    for k, v in over.items():
        setattr(h, k, v)
    return h


def loose_hf(**over):
    """The config as a plain namespace: values of any type, as a hand-edited config.json
    gives them (transformers' config classes validate some field types themselves)."""
    h = types.SimpleNamespace(**serving.hf_config().to_dict())
    for k, v in over.items():
        setattr(h, k, v)
    return h


def reasons(c=None, h=None, isa="sm_90", dtype="bfloat16"):
    model_config = types.SimpleNamespace(hf_config=h if h is not None else hf(), dtype=dtype)
    _, out = binding.monokernel_disable_reasons(cfg=c if c is not None else cfg(), model_config=model_config, isa=isa)
    return out


def only(found, *words):
    """The single reason of `found`, which must hold every word."""
    assert len(found) == 1, found
    for w in words:
        assert w in found[0], (w, found[0])
    return found[0]


@pytest.mark.parametrize("isa", ["sm_90", "gfx950"])
def test_the_readme_server_has_no_reason(isa):
    assert reasons(isa=isa) == []


# --- server arguments: one reason each, in mono's words (SGLang's generic ones would repeat it)

SERVER_ARG_CASES = {
    "page_size": (16, ["page size 16 is not 64", "--page-size 64"]),
    "kv_cache_dtype": ("fp8_e4m3", ["--kv-cache-dtype fp8_e4m3", "--kv-cache-dtype bfloat16"]),
    "moe_runner_backend": ("deep_gemm", ["--moe-runner-backend deep_gemm", "--moe-runner-backend auto"]),
    "disable_shared_experts_fusion": (True, ["without --disable-shared-experts-fusion"]),
    "enable_hisparse": (True, ["without --enable-hisparse"]),
    "expert_distribution_recorder_mode": ("stat", ["without --expert-distribution-recorder-mode"]),
}


def test_every_server_arg_the_kernel_needs_is_refused_by_a_case():
    assert set(SERVER_ARG_CASES) == set(glm_spec.SERVER_ARGS)


@pytest.mark.parametrize("field", sorted(SERVER_ARG_CASES))
def test_a_server_arg_is_refused_once_naming_its_flag(field):
    value, words = SERVER_ARG_CASES[field]
    only(reasons(cfg(**{field: value})), *words)


def test_page_size_kv_dtype_and_tp_are_each_said_once():
    found = reasons(cfg(tp=2, page_size=16, kv_cache_dtype="fp8_e4m3"))
    assert sum("page" in r for r in found) == 1, found
    assert sum("kv-cache-dtype" in r or "kv_cache_dtype" in r for r in found) == 1, found
    tp = [r for r in found if "tp" in r.lower().split()[0]]
    assert tp == ["tp_size 2 is not one of ['4', '8']"], found


# --- SGLang environment variables and HF config shapes

@pytest.mark.parametrize("name,value,words", [
    ("SGLANG_DSA_FUSE_TOPK", "0", ["SGLANG_DSA_FUSE_TOPK=0", "unset SGLANG_DSA_FUSE_TOPK"]),
    ("SGLANG_SIMULATE_UNIFORM_EXPERTS", "1", ["unset SGLANG_SIMULATE_UNIFORM_EXPERTS"]),
    ("SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS", "1", ["unset SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS"]),
])
def test_an_sglang_env_var_is_refused_once_naming_the_fix(monkeypatch, name, value, words):
    monkeypatch.setenv(name, value)
    only(reasons(), *words)


def test_every_env_var_the_kernel_needs_is_checked_by_a_case():
    assert set(glm_spec.ENV) == {"SGLANG_DSA_FUSE_TOPK", "SGLANG_SIMULATE_UNIFORM_EXPERTS",
                                 "SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS"}


def test_other_shapes_are_one_reason_naming_each_value_and_the_checkpoint():
    msg = only(reasons(h=hf(hidden_size=4096, num_hidden_layers=40)),
               "hidden_size 4096, not 6144", "num_hidden_layers 40, not 78",
               "serve the GLM-5.3 FP8 checkpoint with its config.json unchanged")
    assert "is not 6144" not in msg  # not SGLang's generic wording, and not twice


@pytest.mark.parametrize("key", sorted(glm_spec.HF_CONFIG))
def test_each_shape_value_is_checked(key):
    want = glm_spec.HF_CONFIG[key]
    other = "gelu" if isinstance(want, str) else (not want if isinstance(want, bool) else want * 2 + 1)
    only(reasons(h=hf(**{key: other})), f"{key} {other!r}, not {want!r}")


# --- SGLang's refused-by-default features, each with the flag to drop

FEATURE_CASES = {
    "PIPELINE_PARALLEL": ({"pp_size": 2}, ["--pp-size 2", "--pp-size 1"]),
    "MULTI_NODE_TP": ({"nnodes": 2}, ["--nnodes 2", "--nnodes 1"]),
    "DP_ATTENTION": ({"enable_dp_attention": True}, ["--enable-dp-attention", "without --enable-dp-attention"]),
    "EXPERT_PARALLEL": ({"ep_size": 8}, ["--ep-size 8", "--ep-size 1"]),
    "EPLB": ({"enable_eplb": True}, ["without --enable-eplb"]),
    "CONTEXT_PARALLEL": ({"attn_cp_size": 2}, ["--attn-cp-size 2", "--attn-cp-size 1"]),
    "SPECULATIVE_DECODING": ({"speculative_algorithm": "EAGLE"},
                             ["--speculative-algorithm EAGLE", "without --speculative-algorithm"]),
    "TWO_BATCH_OVERLAP": ({"enable_two_batch_overlap": True}, ["--enable-two-batch-overlap", "without"]),
    "LORA": ({"enable_lora": True}, ["--enable-lora", "without --enable-lora"]),
    "PD_DISAGGREGATION": ({"disaggregation_mode": "decode"},
                          ["--disaggregation-mode decode", "without --disaggregation-mode"]),
    "RETURN_ROUTED_EXPERTS": ({"enable_return_routed_experts": True}, ["without --enable-return-routed-experts"]),
    "RETURN_INDEXER_TOPK": ({"enable_return_indexer_topk": True}, ["without --enable-return-indexer-topk"]),
    "KV_OFFLOAD": ({"enable_hierarchical_cache": True}, ["--enable-hierarchical-cache", "without KV offload"]),
    "MEMORY_RELEASE": ({"enable_memory_saver": True}, ["--enable-memory-saver", "without --enable-memory-saver"]),
    "CPU_OFFLOAD": ({"cpu_offload_gb": 4}, ["--cpu-offload-gb 4", "without --cpu-offload-gb"]),
    "TORCH_COMPILE": ({"enable_torch_compile": True}, ["without --enable-torch-compile"]),
}


def test_every_feature_sglang_probes_is_worded_by_mono():
    probed = {f.name for f in binding._PROBES}
    assert probed == set(refusals.FEATURES) | set(refusals.FEATURES_COVERED_BY)
    assert set(FEATURE_CASES) == set(refusals.FEATURES)
    assert {f.name for f in glm_spec.SPEC.features} == probed


@pytest.mark.parametrize("feature", sorted(FEATURE_CASES))
def test_a_feature_in_use_is_refused_once_naming_its_flag(feature):
    over, words = FEATURE_CASES[feature]
    c = cfg(**over)
    assert feature in {f.name for f in binding.features_in_use(c)}  # SGLang's own probe fires
    msg = only(reasons(c), *words)
    assert "the spec does not accept it" not in msg


def test_eagle3_is_one_speculative_reason(monkeypatch):
    c = cfg(speculative_algorithm="EAGLE3")
    assert {"SPECULATIVE_DECODING", "EAGLE3_HIDDEN_STATES"} <= {f.name for f in binding.features_in_use(c)}
    only(reasons(c), "--speculative-algorithm EAGLE3")


# --- mono's own environment variables, refused before the weights load

@pytest.mark.parametrize("name,value,words", [
    ("MONO_GLM53_LAYER", "kernal", ["MONO_GLM53_LAYER='kernal'", "MONO_GLM53_LAYER=kernel", "MONO_GLM53_LAYER=reference"]),
    ("MONO_GLM53_KERNEL_MODE", "fuse", ["MONO_GLM53_KERNEL_MODE='fuse'", "=fused", "=staged"]),
    ("SGLANG_AMD_MONO_CHECK", "ture", ["SGLANG_AMD_MONO_CHECK='ture'", "SGLANG_AMD_MONO_CHECK=1", "SGLANG_AMD_MONO_CHECK=0"]),
    ("MONO_GLM53_FAULT", "stage99", ["MONO_GLM53_FAULT='stage99'", "stage<S>", "unset MONO_GLM53_FAULT"]),
    ("MONO_GLM53_FAULT", "rnk1:stage3", ["'rank<R>:stage<S>'", "unset MONO_GLM53_FAULT"]),
    ("MONO_GUARD_MODE", "loud", ["MONO_GUARD_MODE='loud'", "fault or report"]),
])
def test_an_unknown_mono_env_value_is_refused_before_load(monkeypatch, name, value, words):
    monkeypatch.setenv(name, value)
    only(reasons(), *words)


@pytest.mark.parametrize("name,value", [
    ("MONO_GLM53_LAYER", "reference"), ("MONO_GLM53_LAYER", "Kernel"), ("MONO_GLM53_KERNEL_MODE", "staged"),
    ("MONO_GLM53_FAULT", "rank1:stage3"), ("MONO_GUARD_MODE", "report"), ("SGLANG_AMD_MONO_CHECK", "0"),
])
def test_known_mono_env_values_pass(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert reasons() == []


# --- malformed config values: a reason, never a traceback

@pytest.mark.parametrize("quant,words", [
    ({"quant_method": "fp8", "weight_block_size": 128}, ["weight_block_size is 128, not [128, 128]", "weight_block_size [128, 128])"]),
    ({"quant_method": "fp8", "weight_block_size": ["a", "b"]}, ["weight_block_size is ['a', 'b'], not [128, 128]"]),
    ({"quant_method": "fp8", "weight_block_size": None}, ["weight_block_size is None, not [128, 128]"]),
    ("fp8", ["unreadable quantization_config 'fp8'", "serve GLM-5.3's FP8 checkpoint"]),
])
def test_a_malformed_quantization_config_is_a_reason(quant, words):
    only(reasons(h=loose_hf(quantization_config=quant)), *words)


def test_missing_max_position_embeddings_names_the_config_not_a_zero_context():
    msg = only(reasons(h=loose_hf(max_position_embeddings=None)),
               "config.max_position_embeddings is None", "max_position_embeddings 202752")
    assert "--context-length 0" not in msg


def test_context_longer_than_the_rotary_table_names_the_flag_and_the_limit():
    only(reasons(cfg(context_length=300000)), "300000 tokens", "--context-length 202752 or less")


@pytest.mark.parametrize("key,value", [("index_kpool", "four"), ("index_init_tokens", [1]),
                                       ("num_hidden_layers", "78")])
def test_wrongly_typed_config_values_are_reasons(key, value):
    found = reasons(h=loose_hf(**{key: value}))
    assert found and all("Traceback" not in r for r in found)
    assert any(key in r for r in found), found


def test_a_check_that_breaks_on_a_value_becomes_a_reason():
    class Exploding:
        def __getattr__(self, name):
            raise RuntimeError(f"config attribute {name} is unreadable")

    found = refusals.config_reasons(cfg(), Exploding(), widths_by_tp=merge_widths_by_tp(glm_spec.WIDTHS_BY_TP),
                                    hf_values=glm_spec.HF_CONFIG)
    assert found and all("could not be checked" in r for r in found), found
    assert all("serve GLM-5.3's config.json unchanged" in r for r in found)


# --- what every refusal names is real

def _sglang_flags() -> set[str]:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return {s for a in parser._actions for s in a.option_strings}


def test_every_flag_a_refusal_names_is_an_sglang_flag(monkeypatch):
    texts = []
    for field, (value, _) in SERVER_ARG_CASES.items():
        texts += reasons(cfg(**{field: value}))
    for over, _ in FEATURE_CASES.values():
        texts += reasons(cfg(**over))
    for over in ({"enable_dp_attention": True, "attn_dp_size": 2},
                 {"enable_single_batch_overlap": True, "lora_paths": ["a"]},
                 {"dcp_size": 2, "enable_prefill_cp": True},
                 {"disaggregation_decode_enable_offload_kvcache": True, "enable_lmcache": True, "enable_flexkv": True},
                 {"enable_weights_cpu_backup": True, "offload_group_size": 2},
                 {"context_length": 10**6, "quantization": "w8a8_fp8"},
                 {"cuda_graph_config": CudaGraphConfig(decode=PhaseConfig(backend="full", bs=[16], max_bs=16)),
                  "_cuda_graph_config_locked": {("decode", "bs")}}):
        texts += reasons(cfg(**over))
    monkeypatch.setenv("SGLANG_AMD_MONO_CHECK", "1")
    texts += reasons()
    named = {m for t in texts for m in re.findall(r"(--[a-z][a-z0-9-]+)", t)}
    assert named, texts
    assert named - {"--enable-amd-monokernel"} <= _sglang_flags(), named - _sglang_flags()


def test_a_server_with_many_problems_gets_each_reason_once(monkeypatch):
    monkeypatch.setenv("MONO_GLM53_LAYER", "kernal")
    monkeypatch.setenv("SGLANG_DSA_FUSE_TOPK", "0")
    found = reasons(cfg(page_size=1, ep_size=8, enable_torch_compile=True, context_length=10**6),
                    hf(index_kpool=4, quantization_config=None, hidden_size=1))
    assert len(found) == len(set(found)) == 9, found
    for needle in ("page size 1", "--ep-size 8", "--enable-torch-compile", "1000000 tokens", "index_kpool 4",
                   "unquantized", "hidden_size 1,", "MONO_GLM53_LAYER='kernal'", "SGLANG_DSA_FUSE_TOPK=0"):
        assert sum(needle in r for r in found) == 1, (needle, found)


def test_every_flag_the_refusal_sources_name_is_an_sglang_flag():
    """The after-load refusals too (they run on a loaded model, which a CPU test cannot build
    for every case): every `--flag` written in the refusal and check sources is SGLang's."""
    import pathlib

    src = pathlib.Path(refusals.__file__).parent
    named = set()
    for module in ("refusals.py", "check.py", "build.py", "forward.py", "spec.py"):
        named |= set(re.findall(r"(--[a-z][a-z0-9-]+)", (src / module).read_text()))
    assert "--page-size" in named
    assert named <= _sglang_flags(), named - _sglang_flags()


# --- a GPU the kernel is not built for

def _resolve_on(isa, monkeypatch):
    from sglang.srt.arg_groups import resolution_hooks

    monkeypatch.setattr(resolution_hooks, "_HOOKS", {})
    monkeypatch.setattr(refusals, "_ISA_HINT_REGISTERED", False)
    from mono_glm53 import plugin

    plugin.register()
    plugin.register()  # the hook wraps the step once however often SGLang loads the plugin
    assert len(resolution_hooks._HOOKS["handle_amd_monokernel"]) == 1
    h = hf()
    monkeypatch.setattr(binding, "device_isa", lambda: isa)
    monkeypatch.setattr(binding, "model_config_of", lambda sa: types.SimpleNamespace(hf_config=h, dtype="bfloat16"))
    monkeypatch.setattr(binding, "declare_resolution", lambda sa, src, **kw: None)
    monkeypatch.setattr(binding, "resolving_view", lambda sa: sa)
    resolution_hooks.run_hook(binding.handle_amd_monokernel, cfg())


def test_an_unsupported_gpu_is_refused_naming_the_supported_ones(monkeypatch):
    with pytest.raises(ValueError) as err:
        _resolve_on("sm_100", monkeypatch)
    text = str(err.value)
    assert text.startswith("--enable-amd-monokernel cannot run this setup:")
    line = only([ln for ln in text.splitlines() if "sm_100" in ln],
                "has no spec for ['GlmMoeDsaForCausalLM'] on sm_100: mono-glm53's kernel is built for "
                "gfx950 (MI355X), sm_90 (H200/H100) only",
                "without --enable-amd-monokernel")
    assert text.count("sm_100") == 1, line


@pytest.mark.parametrize("isa", ["sm_90", "gfx950"])
def test_the_wrapped_resolution_step_passes_a_supported_gpu(isa, monkeypatch):
    _resolve_on(isa, monkeypatch)
