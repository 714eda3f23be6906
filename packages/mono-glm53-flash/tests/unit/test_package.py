"""mono-glm53-flash ships no spec yet: it must declare no SGLang entry point and stay light to import."""

import subprocess
import sys
from importlib import metadata

import mono_glm53_flash


def test_no_spec_means_no_entry_point():
    assert mono_glm53_flash.HAS_SPEC is False
    assert mono_glm53_flash.ARCHITECTURE == "Glm5NextForConditionalGeneration"
    ours = [ep for ep in metadata.entry_points(group="sglang.srt.plugins")
            if ep.dist is not None and ep.dist.metadata["Name"] == "mono-glm53-flash"]
    assert ours == []


def test_sglang_does_not_find_a_spec_for_the_architecture(monkeypatch):
    from sglang.kernels.plugin_kernels.amd import spec as amd_spec

    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    for ep in metadata.entry_points(group="sglang.srt.plugins"):
        if ep.dist is not None and ep.dist.metadata["Name"] == "mono-glm53-flash":
            ep.load()()
    found, why = amd_spec.find_spec(backend="amd", architectures=["Glm5NextForConditionalGeneration"], isa="gfx950")
    assert found is None and why


def test_version_and_distribution_agree():
    assert metadata.version("mono-glm53-flash") == mono_glm53_flash.__version__


def test_import_is_light():
    code = "import sys, mono_glm53_flash; sys.exit(1 if {'torch','triton','sglang'} & set(sys.modules) else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
