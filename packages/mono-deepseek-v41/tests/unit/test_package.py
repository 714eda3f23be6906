"""mono-deepseek-v41 ships no spec yet: it must declare no SGLang entry point and stay light to import."""

from mono_common.testing.package_checks import assert_specless_package


def test_specless_package_registers_nothing_and_imports_light():
    assert_specless_package("mono-deepseek-v41", "mono_deepseek_v41", "DeepseekV4ForCausalLM")
