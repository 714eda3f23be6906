"""mono-glm53-flash ships no spec yet: it must declare no SGLang entry point and stay light to import."""

from mono_common.testing.package_checks import assert_specless_package


def test_specless_package_registers_nothing_and_imports_light():
    assert_specless_package("mono-glm53-flash", "mono_glm53_flash", "Glm5NextForConditionalGeneration")
