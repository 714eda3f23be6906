"""GLM-5.3-Flash's MonoSpec against the real SGLang 0.5.23 contract (sglang-contract.md section 4).

The spec is not registered by the package (see test_package.py); here it is registered by
hand in a throwaway registry to show SGLang would find it on both ISAs.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from sglang.kernels.plugin_kernels.amd import spec as amd_spec
from sglang.srt.arg_groups.arg_utils import record_fields
from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
from sglang.srt.configs.glm5_next import Glm5NextTextConfig
from sglang.srt.environ import envs
from sglang.srt.server_args import ServerArgs

import mono_glm53_flash
from mono_common.check import BoundName
from mono_common.contract import check_module
from mono_glm53_flash import refusals as _r
from mono_glm53_flash.spec import HF_CONFIG, SPEC, SPEC_PATH, WIDTHS_BY_TP


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    return amd_spec._REGISTRY


@pytest.mark.parametrize("isa", ["gfx950", "sm_90"])
def test_sglang_finds_the_spec_when_registered_by_hand(registry, isa):
    amd_spec.register(backend="amd", architecture=mono_glm53_flash.ARCHITECTURE, path=SPEC_PATH)
    spec, why = amd_spec.find_spec(backend="amd", architectures=[mono_glm53_flash.ARCHITECTURE], isa=isa)
    assert why == "" and spec is SPEC


def test_api_version_is_pinned():
    assert SPEC.api_version == amd_spec.MONOKERNEL_API_VERSION == 1


def test_structure_msgspec_does_not_check():
    assert isinstance(SPEC, amd_spec.MonoSpec)
    assert set(SPEC.devices) == {"gfx950", "sm_90"}
    assert SPEC.devices["gfx950"].resident_blocks == 256 and SPEC.devices["sm_90"].resident_blocks == 132
    for isa, limits in SPEC.devices.items():
        assert isinstance(limits, amd_spec.DeviceLimits)
        assert isinstance(limits.widths, tuple) and limits.widths == (1, 2, 4, 8)
        assert limits.tp_sizes == (2, 4, 8) == tuple(sorted(WIDTHS_BY_TP[isa]))
    assert SPEC.features <= set(amd_spec.Feature)
    assert {f.name for f in SPEC.features} == set(_r.FEATURES_REFUSED_HERE)
    assert SPEC.unread_metadata <= set(amd_spec.StepMetadata)
    assert SPEC.load_tensor is None
    assert callable(SPEC.build) and callable(SPEC.model_disable_reasons) and callable(SPEC.config_disable_reasons)


def test_numerics_name_streams_state_and_cache_rows_of_both_launch_kinds():
    assert SPEC.numerics.kind is amd_spec.NumericsKind.TOLERANCE
    parsed = {(b.launch, b.output) for b in map(BoundName.parse, SPEC.numerics.bounds)}
    assert parsed == {
        ("kda", "streams"), ("kda", "state"), ("kda", "conv"),
        ("mla", "streams"), ("mla", "kv"), ("mla", "index_k"), ("mla", "tail"),
    }
    for name, value in SPEC.numerics.bounds.items():
        assert 0 < value <= 1, name


def test_requirements_and_refusals_name_real_sglang_fields():
    req = SPEC.requires
    assert req.dtypes == {"bfloat16"} and req.attention_backends <= set(ATTENTION_BACKEND_CHOICES)
    assert not req.server_args and not req.env and not req.hf_config  # worded by config_disable_reasons
    fields = {f.name for f in record_fields(ServerArgs)}
    for name in ("page_size", "kv_cache_dtype", "moe_runner_backend", "enable_hisparse",
                 "expert_distribution_recorder_mode", "enable_linear_replayssm", "enable_linear_replayssm_spec",
                 "mamba_ssm_dtype", "speculative_algorithm", "quantization", "cuda_graph_config", "tp_size"):
        assert name in fields, name
    for name in (*_r.ROUTING_OVERRIDE_ENVS, _r.CONV_DTYPE_ENV, _r.SSM_DTYPE_ENV, _r.PRESHUFFLE_OFF_ENV):
        assert hasattr(envs, name), name
    text = Glm5NextTextConfig()
    for key in HF_CONFIG:
        assert hasattr(text, key), key


@pytest.mark.parametrize("module", mono_glm53_flash.CONTRACT_MODULES)
def test_sglang_reads_resolve(module):
    report = check_module(module)
    assert report.ok, report.describe()
    assert report.checked > 0


def test_spec_import_is_cheap():
    """Importing the spec (what SGLang's launcher would do) imports none of the torch modules
    of the package."""
    code = (
        "import sys; import mono_glm53_flash.spec; "
        "print([m for m in ('mono_glm53_flash.reference', 'mono_glm53_flash.weights', 'mono_glm53_flash.quant') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
