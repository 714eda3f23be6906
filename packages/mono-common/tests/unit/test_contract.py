"""The SGLANG_READS contract checker, against the installed SGLang."""

import sys
import types

from mono_common import contract


def test_real_names_resolve():
    assert contract.missing_names([
        "sglang.kernels.plugin_kernels.amd.spec.register",
        "sglang.kernels.plugin_kernels.amd.spec.MonoSpec",
        "sglang.kernels.plugin_kernels.amd.spec.BuildContext#deadline_s",
    ]) == ()


def test_missing_names_are_reported_exactly():
    missing = contract.missing_names([
        "sglang.kernels.plugin_kernels.amd.spec.register",
        "sglang.kernels.plugin_kernels.amd.spec.no_such_function",
        "sglang.no_such_module.thing",
        "sglang.kernels.plugin_kernels.amd.spec.BuildContext#no_such_field",
    ])
    assert missing == (
        "sglang.kernels.plugin_kernels.amd.spec.no_such_function",
        "sglang.no_such_module.thing",
        "sglang.kernels.plugin_kernels.amd.spec.BuildContext#no_such_field",
    )


def test_check_module_reports(monkeypatch):
    good = types.ModuleType("mono_fake_good")
    good.SGLANG_READS = ("sglang.kernels.plugin_kernels.amd.spec.find_spec",)
    bad = types.ModuleType("mono_fake_bad")
    bad.SGLANG_READS = ("sglang.kernels.plugin_kernels.amd.spec.gone",)
    none = types.ModuleType("mono_fake_none")
    for m in (good, bad, none):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    assert contract.check_module("mono_fake_good").ok
    report = contract.check_module("mono_fake_bad")
    assert not report.ok and report.missing == ("sglang.kernels.plugin_kernels.amd.spec.gone",)
    assert "gone" in report.describe()
    assert "no SGLANG_READS" in contract.check_module("mono_fake_none").describe()
    assert "import failed" in contract.check_module("mono_fake_absent_module").describe()


def test_own_modules_resolve():
    for name in ("mono_common.cli",):
        report = contract.check_module(name)
        assert report.ok, report.describe()
