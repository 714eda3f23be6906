"""mono-deepseek-v41 ships no spec yet: it must declare no SGLang entry point and stay light to import."""

import subprocess
import sys
from importlib import metadata

import mono_deepseek_v41


def test_no_spec_means_no_entry_point():
    assert mono_deepseek_v41.HAS_SPEC is False
    assert mono_deepseek_v41.ARCHITECTURE == "DeepseekV4ForCausalLM"
    ours = [ep for ep in metadata.entry_points(group="sglang.srt.plugins")
            if ep.dist is not None and ep.dist.metadata["Name"] == "mono-deepseek-v41"]
    assert ours == []


def test_sglang_does_not_find_a_spec_for_the_architecture(monkeypatch):
    from sglang.kernels.plugin_kernels.amd import spec as amd_spec

    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    for ep in metadata.entry_points(group="sglang.srt.plugins"):
        if ep.dist is not None and ep.dist.metadata["Name"] == "mono-deepseek-v41":
            ep.load()()
    found, why = amd_spec.find_spec(backend="amd", architectures=["DeepseekV4ForCausalLM"], isa="gfx950")
    assert found is None and why


def test_version_and_distribution_agree():
    assert metadata.version("mono-deepseek-v41") == mono_deepseek_v41.__version__


def test_import_is_light():
    code = "import sys, mono_deepseek_v41; sys.exit(1 if {'torch','triton','sglang'} & set(sys.modules) else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
