"""DeepSeek-V4.1's MonoSpec against the real SGLang 0.5.23 contract, and its startup refusals.

The spec is NOT registered (no entry point, HAS_SPEC False): the tests register it in a
throwaway registry and call SGLang's own `monokernel_disable_reasons` as the launcher does,
with a SimpleNamespace cfg holding every ServerArgs default plus a resolved DeepSeek-V4.1
TP4 server, a real `DeepseekV41Config` with V4.1-Flash's shape values and an explicit ISA
(no GPU here). The good setup's only reason is the missing kernel; each other setup adds
its own reason, naming what to change.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from importlib import metadata

import msgspec
import pytest

pytest.importorskip("sglang")

from sglang.kernels.plugin_kernels.amd import spec as amd_spec  # noqa: E402
from sglang.srt.arg_groups.arg_utils import record_fields  # noqa: E402
from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES  # noqa: E402
from sglang.srt.configs.deepseek_v41 import DeepseekV41Config  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.kernel_plugins.amd import binding  # noqa: E402
from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

import mono_deepseek_v41  # noqa: E402
from mono_common.check import BoundName  # noqa: E402
from mono_common.contract import check_modules  # noqa: E402
from mono_deepseek_v41 import ARCHITECTURE  # noqa: E402
from mono_deepseek_v41 import refusals as _r  # noqa: E402
from mono_deepseek_v41.config import V41_FLASH  # noqa: E402
from mono_deepseek_v41.spec import HF_CONFIG, NUMERICS, SPEC, SPEC_PATH, WIDTHS, WIDTHS_BY_TP  # noqa: E402

DECODE_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
         "scale_fmt": "ue8m0", "routed_experts_quant_method": "mxfp4"}
# A 43-layer pattern with every ratio: 0, then the low ratios with their sources, C4, C128.
RATIOS = [0, 0, 1, 2, 4, 128] + [1, 2, 4, 1, 2, 128] * 6 + [0]


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
    """A resolved TP4 DeepSeek-V4.1-Flash server with DSpark (block 5 -> 6 tokens a request)."""
    vals = server_defaults()
    vals.update(
        model_path="deepseek-ai/DeepSeek-V4.1-Flash", enable_amd_monokernel=True, tp_size=4,
        attention_backend="dsv4", page_size=256, kv_cache_dtype="fp8_e4m3", moe_runner_backend="flashinfer_mxfp4",
        dsv4_attn_backend="flashmla", speculative_algorithm="DSPARK", speculative_num_draft_tokens=6,
        cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend="full", bs=list(DECODE_BS), max_bs=64)),
        _cuda_graph_config_locked=set(),
    )
    vals.update(over)
    return types.SimpleNamespace(**vals)


def good_hf(**over) -> DeepseekV41Config:
    s = V41_FLASH
    values = dict(
        architectures=["DeepseekV41ForCausalLM"], hidden_size=s.hidden, num_hidden_layers=len(RATIOS),
        num_attention_heads=s.heads, num_key_value_heads=1, head_dim=s.head_dim, qk_rope_head_dim=s.rope_dim,
        qk_nope_head_dim=s.nope_dim, q_lora_rank=s.q_lora, o_lora_rank=s.o_lora, o_groups=s.o_groups,
        window_size=128, n_routed_experts=256, num_experts_per_tok=6, n_shared_experts=1, moe_intermediate_size=2048,
        routed_scaling_factor=1.5, swiglu_limit=10.0, index_n_heads=32, index_head_dim=128, index_topk=512,
        compress_ratios=list(RATIOS), kv_source_layer_ids=[2, 3], index_source_layer_ids=[2, 3, 9],
        num_hash_layers=3, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, scoring_func="sqrtsoftplus",
        quantization_config=dict(QUANT),
    )
    values.update(over)
    return DeepseekV41Config(**values)


def reasons_for(cfg=None, hf=None, isa="sm_90", dtype="bfloat16"):
    model_config = types.SimpleNamespace(hf_config=hf if hf is not None else good_hf(), dtype=dtype)
    return binding.monokernel_disable_reasons(cfg=cfg or good_cfg(), model_config=model_config, isa=isa)


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    amd_spec.register(backend="amd", architecture=ARCHITECTURE, path=SPEC_PATH)
    return amd_spec._REGISTRY


# ---- the spec ------------------------------------------------------------------------------------
def test_not_registered_and_no_entry_point():
    assert mono_deepseek_v41.HAS_SPEC is False
    eps = [ep for ep in metadata.entry_points(group="sglang.srt.plugins")
           if ep.dist is not None and ep.dist.metadata["Name"] == "mono-deepseek-v41"]
    assert eps == []


@pytest.mark.parametrize("isa", ["gfx950", "sm_90"])
def test_find_spec_on_both_isas(isa):
    spec, why = amd_spec.find_spec(backend="amd", architectures=[ARCHITECTURE], isa=isa)
    assert why == "" and spec is SPEC
    assert amd_spec.find_spec(backend="amd", architectures=[ARCHITECTURE], isa="gfx942")[0] is None


def test_devices_widths_and_tp():
    assert SPEC.api_version == amd_spec.MONOKERNEL_API_VERSION == 1
    assert set(SPEC.devices) == {"gfx950", "sm_90"}
    assert SPEC.devices["gfx950"].resident_blocks == 256 and SPEC.devices["sm_90"].resident_blocks == 132
    for isa, limits in SPEC.devices.items():
        assert limits.widths == WIDTHS == tuple(sorted(set(WIDTHS))) and max(WIDTHS) == 48
        assert {2, 4} <= set(limits.tp_sizes) and limits.tp_sizes == tuple(sorted(WIDTHS_BY_TP[isa]))
    # a DSpark block of 6 tokens serves 1, 2, 4 and 8 requests; decode up to 48
    assert {6, 12, 24, 48} <= set(WIDTHS) and {1, 2, 4, 8, 16, 32, 48} <= set(WIDTHS)
    for tp in SPEC.devices["sm_90"].tp_sizes:
        V41_FLASH.tp_shard(tp, tp - 1)  # the Flash shapes cut for every served TP size


def test_numerics_name_each_launch_output():
    assert SPEC.numerics.kind is amd_spec.NumericsKind.TOLERANCE
    parsed = [BoundName.parse(n) for n in NUMERICS.bounds]
    assert {b.launch for b in parsed} == {"attn", "moe"}
    assert {("attn", "streams"), ("moe", "streams"), ("attn", "swa_kv")} <= {(b.launch, b.output) for b in parsed}
    assert all(0 < v <= 1 for v in NUMERICS.bounds.values())


def test_requirements_name_real_fields():
    req = SPEC.requires
    assert req.dtypes == {"bfloat16"} and req.attention_backends <= set(ATTENTION_BACKEND_CHOICES)
    assert not req.hf_config and not req.server_args and not req.env  # worded by the refusals instead
    hf = good_hf()
    for key, want in HF_CONFIG.items():
        assert getattr(hf, key, None) == want, key
    assert HF_CONFIG["hidden_size"] == V41_FLASH.hidden
    fields = {f.name for f in record_fields(ServerArgs)}
    for name in ("page_size", "kv_cache_dtype", "dsv4_attn_backend", "moe_runner_backend", "tp_size",
                 "enable_encoder_swa_bounded_replay", "speculative_num_draft_tokens"):
        assert name in fields, name
    assert all(hasattr(envs, name) for name in _r.ENV_REQUIRED)
    assert callable(SPEC.tokens_per_request) and SPEC.load_tensor is None


def test_contract_modules_resolve():
    for report in check_modules(mono_deepseek_v41.CONTRACT_MODULES):
        assert report.ok, report.describe()
        assert report.checked > 0, report.module


def test_spec_import_is_cheap_and_the_package_light():
    code = ("import sys, mono_deepseek_v41.spec; heavy = [m for m in ('mono_deepseek_v41.reference', "
            "'mono_deepseek_v41.weights', 'mono_deepseek_v41.quant', 'torch') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # sglang itself imports torch; the spec must not pull the reference or its builders
    assert "reference" not in out.stdout.splitlines()[-1] and "weights" not in out.stdout.splitlines()[-1]
    code = "import sys, mono_deepseek_v41, mono_deepseek_v41.config, mono_deepseek_v41.refusals; " \
           "print([m for m in ('torch', 'triton', 'sglang') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_build_raises_with_the_fix():
    with pytest.raises(NotImplementedError, match="serve without --enable-amd-monokernel"):
        SPEC.build(None, None, None)


# ---- refusals ---------------------------------------------------------------------------------------
KERNEL = "ships no DeepSeek-V4.1 layer kernel yet"


@pytest.mark.parametrize("isa", ["sm_90", "gfx950"])
def test_good_setup_is_refused_only_for_the_missing_kernel(isa):
    spec, reasons = reasons_for(isa=isa)
    assert spec is SPEC and len(reasons) == 1 and KERNEL in reasons[0], reasons
    assert "serve without --enable-amd-monokernel" in reasons[0]


# (cfg overrides, hf overrides, env, words every matching reason must hold)
CASES = {
    "tp 1": ({"tp_size": 1}, {}, {}, ["tp_size 1 is not one of ['2', '4', '8']"]),  # SGLang's words
    "page size": ({"page_size": 64}, {}, {}, ["page size 64 is not 256", "--page-size 256"]),
    "bf16 kv": ({"kv_cache_dtype": "bfloat16"}, {}, {}, ["--kv-cache-dtype bfloat16", "--kv-cache-dtype fp8_e4m3"]),
    "mega attention": ({"dsv4_attn_backend": "flashmla_mega"}, {}, {}, ["--dsv4-attn-backend flashmla_mega",
                                                                        "--dsv4-attn-backend flashmla"]),
    "triton moe": ({"moe_runner_backend": "triton"}, {}, {}, ["--moe-runner-backend triton",
                                                              "--moe-runner-backend auto"]),
    "w4a8 experts": ({"flashinfer_mxfp4_moe_precision": "fp8"}, {}, {}, ["W4A16", "leave it at default"]),
    "expert parallel": ({"ep_size": 2}, {}, {}, ["--ep-size", "--ep-size 1"]),
    "a2a": ({"moe_a2a_backend": "deepep"}, {}, {}, ["--moe-a2a-backend deepep", "without --moe-a2a-backend"]),
    "dp attention": ({"enable_dp_attention": True}, {}, {}, ["--enable-dp-attention", "without DP attention"]),
    "context parallel": ({"enable_prefill_cp": True}, {}, {}, ["--enable-prefill-cp", "without context parallelism"]),
    "two-batch overlap": ({"enable_two_batch_overlap": True}, {}, {}, ["--enable-two-batch-overlap", "batch overlap"]),
    "lora": ({"enable_lora": True}, {}, {}, ["--enable-lora", "without LoRA"]),
    "torch compile": ({"enable_torch_compile": True}, {}, {}, ["--enable-torch-compile"]),
    "ragged verify": ({}, {}, {"SGLANG_RAGGED_VERIFY_MODE": "compact"}, ["SGLANG_RAGGED_VERIFY_MODE=static"]),
    "shapes": ({}, {"hidden_size": 4096, "q_lora_rank": 1024}, {}, ["not DeepSeek-V4.1-Flash's",
                                                                     "hidden_size 4096, not 5120",
                                                                     "q_lora_rank 1024, not 1280"]),
    "hisparse": ({"enable_hisparse": True}, {}, {}, ["--enable-hisparse", "without --enable-hisparse"]),
    "shared fusion": ({"enforce_shared_experts_fusion": True}, {}, {}, ["without --enforce-shared-experts-fusion"]),
    "request window": ({"enable_encoder_swa_bounded_replay": True}, {}, {},
                       ["per-request SWA window", "without --enable-encoder-swa-bounded-replay"]),
    "fp4 indexer": ({"enable_deepseek_v4_fp4_indexer": True}, {}, {}, ["FP4 C4 indexer"]),
    "eagle": ({"speculative_algorithm": "EAGLE"}, {}, {}, ["--speculative-algorithm EAGLE", "DSPARK"]),
    "pd": ({"disaggregation_mode": "decode"}, {}, {}, ["--disaggregation-mode", "pd disaggregation"]),
    "pp": ({"pp_size": 2}, {}, {}, ["--pp-size", "--pp-size 1"]),
    "recorder": ({"expert_distribution_recorder_mode": "stat"}, {}, {}, ["--expert-distribution-recorder-mode stat"]),
    "block 128": ({}, {"quantization_config": dict(QUANT, weight_block_size=[128, 128])}, {}, ["[128, 128]", "[32, 32]"]),
    "not ue8m0": ({}, {"quantization_config": dict(QUANT, scale_fmt=None)}, {}, ["scale_fmt is None", "ue8m0"]),
    "fp8 experts": ({}, {"quantization_config": dict(QUANT, routed_experts_quant_method="fp8")}, {}, ["'fp8', not 'mxfp4'"]),
    "engram": ({}, {"engram_layer_ids": [5, 20]}, {}, ["engram_layer_ids [5, 20]", "DeepSeek-V4.1-Flash uses them",
                                                         "serve without --enable-amd-monokernel"]),
    "candidates": ({}, {"candidate_source_layer_id": 3}, {}, ["candidate_source_layer_id 3", "candidate-block"]),
    "vision": ({}, {"vision_n_layers": 24}, {}, ["vision tower", "language_model_only"]),
    "no hash layers": ({}, {"num_hash_layers": 0}, {}, ["num_hash_layers is missing or 0"]),
    "orphan index source": ({}, {"kv_source_layer_ids": [2, 3, 6], "index_source_layer_ids": [2, 3, 9]}, {},
                            ["index source layer 9 reads layer 6's index keys"]),
    "first ratio-1 not a source": ({}, {"index_source_layer_ids": [3, 9]}, {}, ["layer 2, the first of ratio 1"]),
    "v4 config": ({}, {"hc_pre_from_prev_sublayer": False}, {}, ["hc_pre_from_prev_sublayer is off"]),
    "q head norm": ({}, {"q_head_norm": True}, {}, ["q_head_norm is on"]),
    "v41 kv layout": ({}, {}, {"SGLANG_DSV4_KV_LAYOUT": "v41"}, ["SGLANG_DSV4_KV_LAYOUT=v41", "unset SGLANG_DSV4_KV_LAYOUT"]),
    "online c128": ({}, {}, {"SGLANG_OPT_USE_ONLINE_COMPRESS": "1"}, ["online C128", "unset SGLANG_OPT_USE_ONLINE_COMPRESS"]),
    "unfused wqkv_a": ({}, {}, {"SGLANG_OPT_FUSE_WQA_WKV": "0"}, ["separate wq_a / wkv"]),
    "fp4 dequant": ({}, {}, {"SGLANG_DSV4_FP4_DEQUANT": "1"}, ["requantized to FP8 blocks"]),
    "unified kv": ({}, {}, {"SGLANG_HACK_FLASHMLA_BACKEND": "unified_kv_triton"}, ["unified KV pool"]),
    "routing override": ({}, {}, {"SGLANG_SIMULATE_UNIFORM_EXPERTS": "1"}, ["benchmark routing override"]),
    "graphs off the widths": ({"cuda_graph_config": CudaGraphConfig(decode=PhaseConfig(backend="full", bs=[3, 5, 7], max_bs=7)),
                               "_cuda_graph_config_locked": {("decode", "bs")}}, {}, {},
                              ["none of the captured decode graphs", "batch sizes [3, 5, 7]"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refusal(case, monkeypatch):
    cfg_over, hf_over, env, words = CASES[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _, reasons = reasons_for(good_cfg(**cfg_over), good_hf(**hf_over))
    assert sum(KERNEL in r for r in reasons) == 1
    extra = [r for r in reasons if KERNEL not in r]
    assert extra, f"{case}: no reason beyond the missing kernel"
    assert len(extra) == len(set(extra)), "a reason is listed twice"
    assert any(all(w in r for w in words) for r in extra), (case, extra)


def test_every_reason_at_once():
    cfg = good_cfg(page_size=64, tp_size=1, enable_hisparse=True)
    _, reasons = reasons_for(cfg, good_hf(engram_layer_ids=[4]))
    for words in ("page size 64", "tp_size 1", "--enable-hisparse", "engram_layer_ids [4]"):
        assert any(words in r for r in reasons), words


def test_every_probed_feature_is_worded_by_the_spec():
    """SGLang refuses no feature in its generic words: each is accepted (DSpark speculation) or
    refused by config_disable_reasons with its flag."""
    assert SPEC.features | {amd_spec.Feature.PARTITIONED_GPU} == set(amd_spec.Feature)
    assert set(_r.FEATURES) | set(_r.ACCEPTED_FEATURES) | {"PARTITIONED_GPU"} == set(amd_spec.Feature.__members__)
    assert set(binding._PROBES) == set(amd_spec.Feature) - {amd_spec.Feature.PARTITIONED_GPU}


def test_model_reasons_on_a_model_without_layers():
    reasons = SPEC.model_disable_reasons(types.SimpleNamespace(model=None), good_hf(), {})
    assert KERNEL in reasons[0] and any("has no model.layers" in r for r in reasons)
