"""The isolation checker refuses a non-model distribution and finds an impure environment."""

from mono_common import isolation


def test_unknown_distribution_is_refused():
    assert isolation.run_checks("mono-common", None) == ["'mono-common' is not a model package "
                                                       "(['mono-deepseek-v41', 'mono-glm53', 'mono-glm53-flash'])"]


def test_this_environment_is_not_isolated():
    # The unit venv holds sglang and torch, so the checker must say the check proves nothing.
    failures = isolation.run_checks("mono-glm53-flash", None)
    assert any("sglang is installed in the bare venv" in f for f in failures), failures
    assert any("installed mono distributions are ['mono-common']" in f for f in failures), failures
    assert any("mono_glm53_flash does not import" in f for f in failures), failures
