"""The monorepo's structure: a tool-only root, four hatchling packages, bounded ranges, owners."""

import pathlib
import re
import subprocess
import sys

import pytest
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[4]
PKGS = {"mono-common": "mono_common", "mono-deepseek-v41": "mono_deepseek_v41",
        "mono-glm53": "mono_glm53", "mono-glm53-flash": "mono_glm53_flash"}
MODELS = [p for p in PKGS if p != "mono-common"]


def _toml(path):
    return tomllib.loads(path.read_text())


def test_root_is_not_a_package():
    root = _toml(ROOT / "pyproject.toml")
    assert "project" not in root and "build-system" not in root
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
                             "--no-build-isolation", str(ROOT)], capture_output=True, text=True)
    assert result.returncode != 0, "installing the repository root must fail"


@pytest.mark.parametrize("dist", PKGS)
def test_each_package_is_a_hatchling_package_with_a_static_version(dist):
    folder = ROOT / "packages" / dist
    data = _toml(folder / "pyproject.toml")
    assert data["build-system"]["build-backend"] == "hatchling.build"
    assert data["project"]["name"] == dist
    assert data["project"]["dynamic"] == ["version"]
    about = folder / "src" / PKGS[dist] / "__about__.py"
    assert data["tool"]["hatch"]["version"]["path"] == f"src/{PKGS[dist]}/__about__.py"
    assert re.search(r'^__version__ = "\d+\.\d+\.\d+"$', about.read_text(), re.M)
    for doc in ("README.md", "CHANGELOG.md"):
        assert (folder / doc).is_file(), f"{dist} needs its own {doc}"
    deps = data["project"].get("dependencies", [])
    assert not any(re.match(r"(torch|triton|sglang)\b", d) for d in deps), deps


@pytest.mark.parametrize("dist", MODELS)
def test_models_need_a_bounded_mono_common_and_no_sibling(dist):
    deps = _toml(ROOT / "packages" / dist / "pyproject.toml")["project"]["dependencies"]
    common = [d for d in deps if d.startswith("mono-common")]
    assert len(common) == 1, deps
    m = re.fullmatch(r"mono-common>=([\d.]+),<([\d.]+)", common[0])
    assert m, f"{dist}: mono-common needs a lower and an upper bound: {common[0]}"
    have = re.search(r'^__version__ = "([\d.]+)"$',
                     (ROOT / "packages/mono-common/src/mono_common/__about__.py").read_text(), re.M).group(1)

    def v(x):
        return tuple(int(p) for p in x.split("."))

    assert v(m.group(1)) <= v(have) < v(m.group(2)), f"{dist} needs {common[0]}, the tree has {have}"
    assert not any(d.startswith(m) for d in deps for m in MODELS), deps


def test_entry_point_names_are_unique():
    names = []
    for dist in PKGS:
        eps = _toml(ROOT / "packages" / dist / "pyproject.toml")["project"].get("entry-points", {})
        names += list(eps.get("sglang.srt.plugins", {}))
    assert len(names) == len(set(names)) and all(n.startswith("mono_") for n in names), names


def test_codeowners_has_a_default_and_one_line_per_package():
    lines = [ln.split() for ln in (ROOT / "CODEOWNERS").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0][0] == "*" and len(lines[0]) >= 2
    for dist in PKGS:
        owned = [ln for ln in lines if ln[0] == f"/packages/{dist}/"]
        assert len(owned) == 1 and len(owned[0]) >= 2, dist
