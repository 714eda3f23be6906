"""The mono pytest plugin: markers, folder auto-marking, GPU and e2e skip rules.

Load it with `-p mono_common.testing.pytest_plugin` (each package's pytest
settings do). It adds:

- markers `gpu`, `kernels`, `e2e`, `interp`, `compile`;
- auto-marking by folder: `tests/kernels/` gets `gpu` + `kernels`,
  `tests/e2e/` gets `gpu` + `e2e`, `tests/interp/` gets `interp`,
  `tests/compile/` gets `compile`;
- `gpu` tests skip cleanly when no CUDA/HIP device is visible, and fail under
  `--require-gpu` (GPU CI must never pass by skipping): every way a GPU test can skip for
  want of a GPU turns into a failure there (this plugin's own skip, a `skipif` marker, and
  a module-level skip or `importorskip` of a module under tests/kernels or tests/e2e), and a
  run that saw no GPU exits non-zero even if no GPU test was collected;
- `e2e` tests run only with `--run-e2e` (they need a served model);
- a "kernel resources" section at the end of the run with every line a test recorded as
  `record_property("resources", text)` (tests/compile: a `print` from an xdist worker never
  reaches the terminal, a recorded property does, and it lands in the junit XML too).
"""

from __future__ import annotations

import functools
import os

import pytest

_MARKERS = {
    "gpu": "needs a CUDA or HIP device; skipped without one unless --require-gpu",
    "kernels": "runs a kernel on the GPU at real shapes (tests/kernels)",
    "e2e": "needs a real SGLang server with the checkpoint; runs only with --run-e2e",
    "interp": "runs Triton kernels under TRITON_INTERPRET=1 on the CPU (tests/interp)",
    "compile": "compiles kernels for gfx950 and sm_90 on the CPU (tests/compile)",
}

_FOLDER_MARKS = {
    "kernels": ("gpu", "kernels"),
    "e2e": ("gpu", "e2e"),
    "interp": ("interp",),
    "compile": ("compile",),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mono")
    group.addoption(
        "--require-gpu",
        action="store_true",
        default=False,
        help="fail, instead of skipping, any gpu test when no GPU is visible",
    )
    group.addoption(
        "--run-e2e",
        action="store_true",
        default=False,
        help="run e2e tests (they need GPUs, a checkpoint and a served SGLang)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, text in _MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.pluginmanager.register(_ResourceLog(), "mono-kernel-resources")


class _ResourceLog:
    """Collects the `resources` properties of the run's test reports and prints them last."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # under xdist this runs on the controller too: worker reports carry user_properties
        if report.when == "call":
            self.lines.extend(f"{report.nodeid}: {v}" for k, v in report.user_properties if k == "resources")

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.lines:
            terminalreporter.section("kernel resources")
            for line in sorted(self.lines):
                terminalreporter.write_line(line)


@functools.lru_cache(maxsize=1)
def gpu_description() -> str | None:
    """The visible GPU's name, or None. Imports torch only when a gpu test asks."""
    if os.environ.get("MONO_FORCE_NO_GPU") == "1":
        return None
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a broken driver means "no usable GPU"
        return None


def _folder_marks(item) -> tuple[str, ...]:
    parts = item.path.parts
    for i, part in enumerate(parts[:-1]):
        if part == "tests" and i + 1 < len(parts) - 1:
            return _FOLDER_MARKS.get(parts[i + 1], ())
    return ()


_NO_GPU = "--require-gpu was given but no CUDA/HIP device is visible"


def _gpu_required_but_missing(config: pytest.Config) -> bool:
    return bool(config.getoption("--require-gpu")) and gpu_description() is None


def _skip_reason(longrepr) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: the marks must exist before `-m` deselects. Folder names are
    # keywords too, so ask for real markers, not keywords.
    for item in items:
        for mark in _folder_marks(item):
            if item.get_closest_marker(mark) is None:
                item.add_marker(mark)


def _e2e_not_asked(item: pytest.Item) -> bool:
    return item.get_closest_marker("e2e") is not None and not item.config.getoption("--run-e2e")


# tryfirst: before the skipping plugin evaluates a `skipif(not torch.cuda.is_available())`
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    config = item.config
    if _e2e_not_asked(item):
        pytest.skip("e2e test: pass --run-e2e on a machine with GPUs and the checkpoint")
    if item.get_closest_marker("gpu") is not None and gpu_description() is None:
        if config.getoption("--require-gpu"):
            pytest.fail(_NO_GPU, pytrace=False)
        pytest.skip("no GPU visible (this test needs CUDA or HIP)")



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """Under --require-gpu with no GPU, a gpu test that skipped (a skipif marker evaluated
    before this plugin's setup, ...) failed: a GPU run must not pass by skipping."""
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and item.get_closest_marker("gpu") is not None and not _e2e_not_asked(item)
            and not hasattr(report, "wasxfail") and _gpu_required_but_missing(item.config)):
        report.outcome = "failed"
        report.longrepr = f"{_NO_GPU} (the test skipped: {_skip_reason(report.longrepr)})"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Under --require-gpu with no GPU, a module of a GPU folder (tests/kernels, tests/e2e) that
    skipped as a whole at import (`pytest.skip(allow_module_level=True)`, `importorskip`)
    failed."""
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and isinstance(collector, pytest.Module) and "gpu" in _folder_marks(collector)
            and _gpu_required_but_missing(collector.config)):
        report.outcome = "failed"
        report.longrepr = f"{_NO_GPU} (the module skipped: {_skip_reason(report.longrepr)})"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    """A run under --require-gpu that saw no GPU fails, even with no GPU test collected."""
    if _gpu_required_but_missing(session.config) and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"FAILED: {_NO_GPU}", red=True)
