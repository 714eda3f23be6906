"""The mono pytest plugin: markers, folder auto-marking, GPU and e2e skip rules.

Load it with `-p mono_common.testing.pytest_plugin` (each package's pytest
settings do). It adds:

- markers `gpu`, `kernels`, `e2e`, `interp`, `compile`;
- auto-marking by folder: `tests/kernels/` gets `gpu` + `kernels`,
  `tests/e2e/` gets `gpu` + `e2e`, `tests/interp/` gets `interp`,
  `tests/compile/` gets `compile`;
- `gpu` tests skip cleanly when no CUDA/HIP device is visible, and fail under
  `--require-gpu` (GPU CI must never pass by skipping);
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


def _folder_marks(item: pytest.Item) -> tuple[str, ...]:
    parts = item.path.parts
    for i, part in enumerate(parts[:-1]):
        if part == "tests" and i + 1 < len(parts) - 1:
            return _FOLDER_MARKS.get(parts[i + 1], ())
    return ()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: the marks must exist before `-m` deselects. Folder names are
    # keywords too, so ask for real markers, not keywords.
    for item in items:
        for mark in _folder_marks(item):
            if item.get_closest_marker(mark) is None:
                item.add_marker(mark)


def pytest_runtest_setup(item: pytest.Item) -> None:
    config = item.config
    if item.get_closest_marker("e2e") is not None and not config.getoption("--run-e2e"):
        pytest.skip("e2e test: pass --run-e2e on a machine with GPUs and the checkpoint")
    if item.get_closest_marker("gpu") is not None and gpu_description() is None:
        if config.getoption("--require-gpu"):
            pytest.fail("--require-gpu was given but no CUDA/HIP device is visible", pytrace=False)
        pytest.skip("no GPU visible (this test needs CUDA or HIP)")
