"""The supported-SGLang range and its run-time check."""

import pytest

from mono_common import sglang_compat


def test_installed_sglang_is_supported():
    # The unit sessions run against the real sglang 0.5.23.
    assert sglang_compat.installed_sglang_version().startswith("0.5.23")
    assert sglang_compat.sglang_problem() is None
    assert sglang_compat.require_supported_sglang().startswith("0.5.23")


@pytest.mark.parametrize("version", ["0.5.22", "0.5.24", "0.6.0", "0.4.99", "1.0.0"])
def test_other_versions_are_refused_with_what_is_needed(version):
    problem = sglang_compat.sglang_problem(version)
    assert problem is not None
    assert version in problem and ">=0.5.23,<0.5.24" in problem


@pytest.mark.parametrize("version", ["0.5.23", "0.5.23.post1", "0.5.23rc1+cu130"])
def test_patch_builds_of_the_supported_release_pass(version):
    assert sglang_compat.sglang_problem(version) is None


def test_missing_sglang_says_install_it(monkeypatch):
    monkeypatch.setattr(sglang_compat, "installed_sglang_version", lambda: None)
    with pytest.raises(sglang_compat.UnsupportedSGLang, match="sglang is not installed"):
        sglang_compat.require_supported_sglang()


def test_api_version_matches_the_installed_contract():
    # Pinned: an SGLang bump that changes the monokernel API must fail loudly here.
    from sglang.kernels.plugin_kernels.amd.spec import MONOKERNEL_API_VERSION

    assert MONOKERNEL_API_VERSION == sglang_compat.MONOKERNEL_API_VERSION == 1
