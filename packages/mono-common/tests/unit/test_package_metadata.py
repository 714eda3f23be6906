"""What a Python index user sees of each package: the licence files in the repository and in
every package folder (so in every sdist and wheel; the `dist` nox session checks the built
files with `twine check --strict`), classifiers, project URLs, the supported Python and
SGLang versions, and READMEs an index page can show (no machine-local paths, no link that
only resolves inside the repository, the package's CPU and GPU commands)."""

from __future__ import annotations

import pathlib
import re

import pytest
import tomllib

from mono_common.sglang_compat import SUPPORTED_SGLANG

ROOT = pathlib.Path(__file__).resolve().parents[4]
PKGS = ["mono-common", "mono-deepseek-v41", "mono-glm53", "mono-glm53-flash"]
LOCAL_PATHS = ("/work/", "/root/", "/home/", "~/.cache", "/tmp/", "C:\\")


def project(pkg: str) -> dict:
    return tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text())["project"]


def test_the_repository_carries_the_apache_2_licence_and_a_notice():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    for section in ("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "4. Redistribution.",
                    "9. Accepting Warranty or Additional Liability.", "END OF TERMS AND CONDITIONS",
                    "APPENDIX: How to apply the Apache License to your work."):
        assert section in text, section
    notice = (ROOT / "NOTICE").read_text()
    assert "Apache License, Version 2.0" in notice and "SGLang" in notice


@pytest.mark.parametrize("pkg", PKGS)
def test_every_package_ships_the_licence_files(pkg):
    meta = project(pkg)
    assert meta["license"] == "Apache-2.0"
    assert meta["license-files"] == ["LICENSE", "NOTICE"]
    for name in ("LICENSE", "NOTICE"):
        copy = ROOT / "packages" / pkg / name
        assert copy.read_bytes() == (ROOT / name).read_bytes(), f"{copy} differs from the repository's {name}"


@pytest.mark.parametrize("pkg", PKGS)
def test_classifiers_and_versions_agree(pkg):
    meta = project(pkg)
    classifiers = meta["classifiers"]
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    assert "Operating System :: POSIX :: Linux" in classifiers
    low = tuple(int(x) for x in re.fullmatch(r">=(\d+)\.(\d+)", meta["requires-python"]).groups())
    minors = sorted(int(c.rsplit(".", 1)[1]) for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert minors and minors[0] == low[1] and 11 in minors, minors  # 3.11 is what the tests run on
    supported = ".".join(map(str, SUPPORTED_SGLANG[0]))
    assert f"SGLang {supported}" in meta["description"], meta["description"]


def test_project_urls_share_one_repository_and_point_into_each_package():
    bases = set()
    for pkg in PKGS:
        urls = project(pkg)["urls"]
        base = urls["Homepage"]
        bases.add(base)
        assert urls["Source"] == f"{base}/tree/main/packages/{pkg}"
        assert urls["Changelog"] == f"{base}/blob/main/packages/{pkg}/CHANGELOG.md"
        assert urls["Documentation"] == f"{base}/blob/main/packages/{pkg}/README.md"
        assert urls["Issues"] == f"{base}/issues"
    assert len(bases) == 1 and next(iter(bases)).startswith("https://"), bases


@pytest.mark.parametrize("pkg", PKGS)
def test_the_readme_an_index_shows_has_no_local_path_and_only_absolute_links(pkg):
    text = (ROOT / "packages" / pkg / "README.md").read_text()
    for local in LOCAL_PATHS:
        assert local not in text, f"{pkg}/README.md holds a machine-local path ({local})"
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        assert target.startswith(("https://", "http://", "#")), f"{pkg}/README.md links {target!r}"
    assert project(pkg)["urls"]["Source"] in text, "the README names where its relative paths live"


@pytest.mark.parametrize("pkg", PKGS)
def test_the_readme_gives_the_cpu_and_gpu_commands(pkg):
    text = (ROOT / "packages" / pkg / "README.md").read_text()
    assert f"nox -t {pkg}`" in text or f"nox -t {pkg} " in text
    if any((ROOT / "packages" / pkg / "tests" / "kernels").glob("test_*.py")):
        assert f"nox -t {pkg}-gpu" in text
