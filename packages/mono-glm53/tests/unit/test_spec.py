"""GLM-5.3's MonoSpec against the real SGLang 0.5.23 contract (contract.md section 4).

Registration through the plugin's register() into SGLang's registry, find_spec on
both ISAs, the pinned API version, the structure msgspec does not validate, every
Requirements key being a real ServerArgs field / envs name / attention backend / HF
config attribute, bound names, SGLANG_READS resolving, and a cheap spec import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest
from sglang.kernels.plugin_kernels.amd import spec as amd_spec
from sglang.srt.arg_groups.arg_utils import record_fields
from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
from sglang.srt.environ import envs
from sglang.srt.server_args import ServerArgs
from transformers import GlmMoeDsaConfig

from mono_common.check import BoundName
from mono_common.contract import check_module
from mono_glm53 import ARCHITECTURE, plugin
from mono_glm53.spec import SPEC, WIDTHS_BY_TP

# Modules of this package whose SGLANG_READS these tests resolve.
MODULES = (
    "mono_glm53.spec",
    "mono_glm53.refusals",
    "mono_glm53.build",
    "mono_glm53.forward",
    "mono_glm53.check",
)


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    return amd_spec._REGISTRY


def test_register_puts_the_spec_path_in_sglangs_registry(registry):
    plugin.register()
    plugin.register()  # idempotent
    assert registry["amd"][ARCHITECTURE] == "mono_glm53.spec:SPEC"


def test_entry_point_when_installed(registry):
    eps = [ep for ep in metadata.entry_points(group="sglang.srt.plugins") if ep.name == "mono_glm53"]
    if not eps:
        pytest.skip("mono-glm53 is not pip-installed here (PYTHONPATH run): no entry-point metadata")
    assert eps[0].value == "mono_glm53.plugin:register"
    eps[0].load()()
    assert registry["amd"][ARCHITECTURE] == "mono_glm53.spec:SPEC"


@pytest.mark.parametrize("isa", ["gfx950", "sm_90"])
def test_find_spec_on_both_isas(registry, isa):
    plugin.register()
    spec, why = amd_spec.find_spec(backend="amd", architectures=[ARCHITECTURE], isa=isa)
    assert why == "" and spec is SPEC


def test_other_isa_is_refused(registry):
    plugin.register()
    spec, why = amd_spec.find_spec(backend="amd", architectures=[ARCHITECTURE], isa="gfx942")
    assert spec is None and "has no spec" in why


def test_api_version_is_pinned():
    assert SPEC.api_version == amd_spec.MONOKERNEL_API_VERSION == 1


def test_devices():
    assert set(SPEC.devices) == {"gfx950", "sm_90"}
    assert SPEC.devices["gfx950"].resident_blocks == 256
    assert SPEC.devices["sm_90"].resident_blocks == 132
    for isa, limits in SPEC.devices.items():
        assert isinstance(limits.widths, tuple) and limits.widths == tuple(sorted(set(limits.widths)))
        assert all(isinstance(w, int) and w > 0 for w in limits.widths)
        assert limits.tp_sizes == tuple(sorted(WIDTHS_BY_TP[isa]))
        for widths in WIDTHS_BY_TP[isa].values():
            assert set(widths) <= set(limits.widths)


def test_features_and_metadata_are_contract_members():
    assert SPEC.features <= set(amd_spec.Feature)
    assert SPEC.unread_metadata <= set(amd_spec.StepMetadata)
    assert SPEC.load_tensor is None  # every load path works: nothing is kept at load
    assert callable(SPEC.build) and callable(SPEC.model_disable_reasons)
    assert callable(SPEC.config_disable_reasons)


def test_requirements_name_real_sglang_and_hf_fields():
    # SERVER_ARGS, ENV and HF_CONFIG are checked by config_disable_reasons alone (each
    # refusal once, naming the fix), not also given to SGLang's Requirements.
    from mono_glm53 import spec as glm_spec

    req = SPEC.requires
    assert not req.server_args and not req.env and not req.hf_config
    fields = {f.name for f in record_fields(ServerArgs)}
    assert set(glm_spec.SERVER_ARGS) <= fields
    assert all(hasattr(envs, name) for name in glm_spec.ENV)
    assert req.attention_backends <= set(ATTENTION_BACKEND_CHOICES)
    assert req.dtypes == {"bfloat16"}
    hf = GlmMoeDsaConfig()
    for key, want in glm_spec.HF_CONFIG.items():
        assert hasattr(hf, key), key
        assert getattr(hf, key) == want, (key, getattr(hf, key), want)


def test_numerics_bounds_parse_and_cover_the_check_outputs():
    assert SPEC.numerics.kind is amd_spec.NumericsKind.TOLERANCE
    parsed = [BoundName.parse(n) for n in SPEC.numerics.bounds]
    outputs = {(b.launch, b.output) for b in parsed}
    assert outputs == {("layer", "stream"), ("layer", "kv"), ("layer", "index_k")}
    for name, value in SPEC.numerics.bounds.items():
        assert 0 < value <= 1, name


@pytest.mark.parametrize("module", MODULES)
def test_sglang_reads_resolve(module):
    report = check_module(module)
    assert report.ok, report.describe()
    assert report.checked > 0


def test_binding_signatures_and_probes_are_the_ones_we_were_written_against():
    import inspect

    from sglang.srt.kernel_plugins.amd import binding

    assert list(inspect.signature(binding.install_monokernel_forward).parameters) == [
        "model",
        "hf_config",
        "capture_tail_hooks",
    ]
    assert list(inspect.signature(binding.monokernel_disable_reasons).parameters) == [
        "cfg",
        "model_config",
        "isa",
    ]
    assert set(binding._PROBES) == set(amd_spec.Feature) - {amd_spec.Feature.PARTITIONED_GPU}


def test_spec_import_is_cheap():
    """Importing the spec (what SGLang's launcher does) imports no kernel, no triton
    beyond what sglang itself pulls, and none of the package's heavy modules."""
    code = (
        "import sys; import mono_glm53.spec; "
        "heavy = [m for m in ('mono_glm53.build', 'mono_glm53.forward', 'mono_glm53.check', "
        "'mono_glm53.kernels', 'mono_glm53.reference', 'mono_glm53.weights') if m in sys.modules]; "
        "print(heavy)"
    )
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
