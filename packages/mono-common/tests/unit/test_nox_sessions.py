"""The noxfile's per-package commands: `nox -t <pkg>` is every CPU session of that package and
nothing a machine without a GPU cannot run; `nox -t <pkg>-gpu` its GPU tests, which fail (not
skip) without a GPU; CI's `tests` runs every CPU session, `dist` (twine check) included."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[4]
PKGS = ["mono-common", "mono-deepseek-v41", "mono-glm53", "mono-glm53-flash"]
MODELS = PKGS[1:]


def nox_python() -> str:
    python = os.environ.get("MONO_NOX_PYTHON") or shutil.which("python3")
    probe = subprocess.run([python, "-m", "nox", "--version"], capture_output=True, text=True)
    assert probe.returncode == 0, (f"nox is not importable by {python}: install it (python3 -m pip install "
                                   "nox) or set MONO_NOX_PYTHON to the Python that runs nox")
    return python


def selected(*args: str) -> list[dict]:
    out = subprocess.run([nox_python(), "-m", "nox", "-l", "--json", *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def has_tests(pkg: str, kind: str) -> bool:
    return any((ROOT / "packages" / pkg / "tests" / kind).glob("test_*.py"))


@pytest.mark.parametrize("pkg", PKGS)
def test_one_command_selects_every_cpu_session_of_a_package_and_no_gpu_one(pkg):
    sessions = selected("-t", pkg)
    names = {s["name"] for s in sessions}
    want = {"unit", "dist"} | ({"isolated"} if pkg in MODELS else set())
    want |= {kind for kind in ("interp", "compile") if has_tests(pkg, kind)}
    assert names == want, names
    assert all(s["call_spec"] == {"pkg": pkg} for s in sessions), sessions
    assert all("cpu" in s["tags"] and "gpu" not in s["tags"] for s in sessions), sessions


@pytest.mark.parametrize("pkg", [p for p in PKGS if has_tests(p, "kernels")])
def test_the_gpu_command_selects_the_gpu_tests_alone(pkg):
    sessions = selected("-t", f"{pkg}-gpu")
    assert [s["session"] for s in sessions] == [f"kernels({pkg})"]
    assert "gpu" in sessions[0]["tags"]


def _session_source(name: str) -> str:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.unparse(fn)


@pytest.mark.parametrize("name", ["kernels", "e2e"])
def test_gpu_sessions_run_pytest_with_require_gpu(name):
    assert "'--require-gpu'" in _session_source(name)


def test_require_gpu_fails_a_run_without_a_gpu():
    """What `kernels(mono-common)` runs, on this CPU machine: it must fail, not pass by skipping."""
    env = dict(os.environ, MONO_FORCE_NO_GPU="1")
    out = subprocess.run([sys.executable, "-m", "pytest", "tests/kernels", "-q", "--require-gpu", "-p",
                          "no:cacheprovider"], capture_output=True, text=True, env=env,
                         cwd=ROOT / "packages" / "mono-common", timeout=600)
    assert out.returncode != 0, out.stdout[-2000:]
    assert "--require-gpu was given but no CUDA/HIP device is visible" in out.stdout + out.stderr


def test_ci_runs_every_cpu_session_and_the_twine_check():
    tests = _session_source("tests")
    for family in ("lint", "unit(", "isolated(", "interp(", "compile(", "dist("):
        assert family in tests, family
    dist = _session_source("dist")
    assert "'twine', 'check', '--strict'" in dist
    assert "nox -s tests" in (ROOT / ".ci" / "run").read_text()
