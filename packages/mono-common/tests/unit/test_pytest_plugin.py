"""The pytest plugin's markers, folder marks, GPU skips, --require-gpu and --run-e2e."""

import pytest

pytest_plugins = ["pytester"]

GPU_TEST = "import pytest\n@pytest.mark.gpu\ndef test_needs_gpu():\n    assert True\n"
E2E_TEST = "def test_served():\n    assert True\n"
KERNEL_TEST = "def test_kernel():\n    assert True\n"


@pytest.fixture
def tester(pytester, monkeypatch):
    monkeypatch.setenv("MONO_FORCE_NO_GPU", "1")
    from mono_common.testing import pytest_plugin

    pytest_plugin.gpu_description.cache_clear()
    yield pytester
    pytest_plugin.gpu_description.cache_clear()


def _run(tester, *args):
    return tester.runpytest_subprocess("-p", "mono_common.testing.pytest_plugin", "--strict-markers", *args)


def test_gpu_tests_skip_without_a_gpu(tester):
    tester.makepyfile(test_g=GPU_TEST)
    _run(tester, "-rs").assert_outcomes(skipped=1)


def test_require_gpu_turns_the_skip_into_a_failure(tester):
    tester.makepyfile(test_g=GPU_TEST)
    result = _run(tester, "--require-gpu")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--require-gpu was given but no CUDA/HIP device is visible*"])


SKIPIF_TEST = (
    "import pytest\n"
    "@pytest.mark.gpu\n"
    "@pytest.mark.skipif(True, reason='needs a CUDA GPU')\n"
    "def test_needs_gpu():\n"
    "    assert True\n"
)
MODULE_SKIP_TEST = "import pytest\npytest.skip('needs a CUDA device', allow_module_level=True)\ndef test_k():\n    pass\n"


def test_require_gpu_fails_a_skipif_marker(tester):
    # the skipping plugin evaluates skipif before our setup: the skip still becomes a failure
    tester.makepyfile(test_g=SKIPIF_TEST)
    _run(tester).assert_outcomes(skipped=1)
    result = _run(tester, "--require-gpu")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--require-gpu was given but no CUDA/HIP device is visible*"])


def test_require_gpu_fails_a_module_level_skip_in_a_gpu_folder(tester):
    tester.mkpydir("tests")
    for folder in ("kernels", "unit"):
        d = tester.path / "tests" / folder
        d.mkdir()
        (d / f"test_{folder}_mod.py").write_text(MODULE_SKIP_TEST)
    _run(tester, "tests").assert_outcomes(skipped=2)
    result = _run(tester, "tests", "--require-gpu")
    # the kernels module fails; a unit module may skip for its own reasons
    result.assert_outcomes(errors=1, skipped=1)
    result.stdout.fnmatch_lines(["*no CUDA/HIP device is visible (the module skipped: *needs a CUDA device*"])
    assert result.ret != 0


def test_require_gpu_fails_a_run_without_gpu_tests(tester):
    tester.makepyfile(test_k=KERNEL_TEST)
    assert _run(tester).ret == 0
    result = _run(tester, "--require-gpu")
    result.assert_outcomes(passed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*FAILED: --require-gpu was given but no CUDA/HIP device is visible*"])


def test_folders_mark_tests(tester):
    tester.mkpydir("tests")
    for folder, body in (("kernels", KERNEL_TEST), ("e2e", E2E_TEST), ("unit", KERNEL_TEST)):
        d = tester.path / "tests" / folder
        d.mkdir()
        (d / f"test_{folder}.py").write_text(body)
    _run(tester, "tests").assert_outcomes(passed=1, skipped=2)
    _run(tester, "tests", "-m", "not gpu").assert_outcomes(passed=1, deselected=2)
    _run(tester, "tests", "-m", "kernels").assert_outcomes(skipped=1, deselected=2)


def test_e2e_runs_only_with_run_e2e(tester):
    tester.makepyfile(test_e="import pytest\n@pytest.mark.e2e\ndef test_served():\n    assert True\n")
    result = _run(tester, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*pass --run-e2e*"])
    # With --run-e2e it still needs a GPU (e2e implies a served model on GPUs).
    tester.makepyfile(test_f="import pytest\n@pytest.mark.e2e\n@pytest.mark.gpu\ndef test_g():\n    assert True\n")
    _run(tester, "--run-e2e", "--require-gpu", "test_f.py").assert_outcomes(errors=1)
    _run(tester, "--run-e2e", "test_f.py").assert_outcomes(skipped=1)


def test_markers_are_registered(tester):
    tester.makepyfile(test_m="import pytest\n@pytest.mark.interp\n@pytest.mark.compile\ndef test_x():\n    assert True\n")
    _run(tester).assert_outcomes(passed=1)


RESOURCE_TEST = (
    "import pytest\n"
    "@pytest.mark.parametrize('isa', ['sm_90', 'gfx950'])\n"
    "def test_build(isa, record_property):\n"
    "    record_property('resources', isa + ' regs=42 spills=0')\n"
)


def test_recorded_resources_are_printed_at_the_end(tester):
    tester.makepyfile(test_r=RESOURCE_TEST)
    result = _run(tester)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*kernel resources*", "*test_build?gfx950?: gfx950 regs=42 spills=0",
                                 "*test_build?sm_90?: sm_90 regs=42 spills=0"])


def test_recorded_resources_reach_the_terminal_from_xdist_workers(tester):
    pytest.importorskip("xdist")
    tester.makepyfile(test_r=RESOURCE_TEST)
    result = _run(tester, "-n", "2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*kernel resources*", "*sm_90 regs=42 spills=0"])


def test_no_section_without_recorded_resources(tester):
    tester.makepyfile(test_k=KERNEL_TEST)
    assert "kernel resources" not in _run(tester).stdout.str()
