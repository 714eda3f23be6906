"""Registration through the real entry point into SGLang 0.5.23's real registry."""

import subprocess
import sys
from importlib import metadata

import pytest
from sglang.kernels.plugin_kernels.amd import spec as amd_spec

import mono_glm53
from mono_common import sglang_compat


@pytest.fixture
def empty_registry(monkeypatch):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    return amd_spec._REGISTRY


def _our_entry_point():
    eps = [ep for ep in metadata.entry_points(group="sglang.srt.plugins") if ep.name == "mono_glm53"]
    assert len(eps) == 1, eps
    assert eps[0].dist.metadata["Name"] == "mono-glm53"
    return eps[0]


def test_entry_point_registers_the_spec_path(empty_registry):
    _our_entry_point().load()()
    assert empty_registry == {"amd": {"GlmMoeDsaForCausalLM": "mono_glm53.spec:SPEC"}}
    # SGLang calls the entry point in every process: a second call is a no-op.
    _our_entry_point().load()()
    assert empty_registry == {"amd": {"GlmMoeDsaForCausalLM": "mono_glm53.spec:SPEC"}}


def test_a_clashing_registration_fails_loudly(empty_registry):
    amd_spec.register(backend="amd", architecture="GlmMoeDsaForCausalLM", path="other.spec:SPEC")
    with pytest.raises(ValueError, match="already has a spec for GlmMoeDsaForCausalLM"):
        _our_entry_point().load()()


def test_find_spec_finds_the_spec_for_every_isa_it_lists(empty_registry):
    _our_entry_point().load()()
    from mono_glm53.spec import SPEC

    assert set(SPEC.devices) == {"gfx950", "sm_90"}
    for isa in SPEC.devices:
        found, why = amd_spec.find_spec(backend="amd", architectures=["GlmMoeDsaForCausalLM"], isa=isa)
        assert found is SPEC, why
    found, why = amd_spec.find_spec(backend="amd", architectures=["GlmMoeDsaForCausalLM"], isa="gfx942")
    assert found is None and "gfx942" in why


def test_api_version_is_pinned():
    from mono_glm53.spec import SPEC

    assert amd_spec.MONOKERNEL_API_VERSION == 1, "SGLang bumped the monokernel API: re-check the contract"
    assert SPEC.api_version == amd_spec.MONOKERNEL_API_VERSION


def test_spec_structure_msgspec_does_not_check():
    from mono_common.check import BoundName
    from mono_glm53.spec import SPEC

    assert isinstance(SPEC, amd_spec.MonoSpec)
    for isa, limits in SPEC.devices.items():
        assert isinstance(limits, amd_spec.DeviceLimits), isa
        widths = limits.widths
        assert isinstance(widths, tuple) and widths, isa
        assert all(isinstance(w, int) and w > 0 for w in widths), widths
        assert list(widths) == sorted(set(widths)), f"{isa} widths must ascend without repeats: {widths}"
        assert isinstance(limits.tp_sizes, tuple) and all(t in (1, 2, 4, 8) for t in limits.tp_sizes)
        assert isinstance(limits.resident_blocks, int) and limits.resident_blocks > 0
    assert all(isinstance(f, amd_spec.Feature) for f in SPEC.features)
    assert all(isinstance(m, amd_spec.StepMetadata) for m in SPEC.unread_metadata)
    assert SPEC.numerics.kind is amd_spec.NumericsKind.TOLERANCE
    for name in SPEC.numerics.bounds:
        BoundName.parse(name)


def test_register_refuses_an_unsupported_sglang(monkeypatch, empty_registry):
    monkeypatch.setattr(sglang_compat, "installed_sglang_version", lambda: "0.5.24")
    with pytest.raises(sglang_compat.UnsupportedSGLang, match="sglang 0.5.24 is not supported"):
        _our_entry_point().load()()
    assert empty_registry == {}


def test_importing_the_package_and_entry_point_is_light():
    code = (
        "import sys, mono_glm53, mono_glm53.plugin;"
        "heavy=[m for m in ('torch','triton','sglang') if m in sys.modules];"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_contract_modules_resolve():
    from mono_common.contract import check_modules

    for report in check_modules(mono_glm53.CONTRACT_MODULES):
        assert report.ok, report.describe()
