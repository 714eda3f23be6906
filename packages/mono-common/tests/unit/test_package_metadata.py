"""What a Python index user sees of each package: the licence files in the repository and in
every package folder (so in every sdist and wheel; the `dist` nox session checks the built
files with `twine check --strict`), classifiers, project URLs only under the repository address
configured in the root pyproject.toml's [tool.mono] (none while it is empty: the project has no
public address yet, issue 22), the supported Python and SGLang versions, and READMEs an index
page can show (no machine-local paths, no link that only resolves inside the repository or into
an unconfigured one, the package's CPU and GPU commands)."""

from __future__ import annotations

import pathlib
import re

import pytest
import tomllib

from mono_common.sglang_compat import SUPPORTED_SGLANG

ROOT = pathlib.Path(__file__).resolve().parents[4]
PKGS = ["mono-common", "mono-deepseek-v41", "mono-glm53", "mono-glm53-flash"]
LOCAL_PATHS = ("/work/", "/root/", "/home/", "~/.cache", "/tmp/", "C:\\")
# Real sites other than the mono repository that a README may link (none linked today).
OTHER_SITES: tuple[str, ...] = ()
URL = re.compile(r"https?://[^\s)<>\]\[`\"']+")


def project(pkg: str) -> dict:
    return tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text())["project"]


def repository() -> str:
    """The mono repository's public address, from the root pyproject.toml ("" while none is known)."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mono"]["repository"]


def under(url: str, repo: str) -> bool:
    repo = repo.rstrip("/")
    return bool(repo) and (url.rstrip("/") == repo or url.startswith(repo + "/"))


def url_problems(pkg: str, urls: dict[str, str], repo: str) -> list[str]:
    """Why a package's [project.urls] is not true of the configured repository (empty when it is)."""
    if not repo:
        return [f"{pkg}: {k} = {v!r}, but the repository has no known address ([tool.mono] repository is empty)"
                for k, v in urls.items()]
    problems = [f"{pkg}: {k} = {v!r} is not under {repo}" for k, v in urls.items() if not under(v, repo)]
    if urls.get("Homepage", "").rstrip("/") != repo.rstrip("/"):
        problems.append(f"{pkg}: Homepage is {urls.get('Homepage')!r}, not {repo}")
    if not any(f"/packages/{pkg}" in v for v in urls.values()):
        problems.append(f"{pkg}: no URL points into packages/{pkg}")
    return problems


def readme_url_problems(pkg: str, text: str, repo: str) -> list[str]:
    """Addresses in a README that are neither under the configured repository nor a known other site."""
    return [f"{pkg}/README.md names {u!r}, outside the configured repository ({repo!r}) and OTHER_SITES"
            for u in (m.rstrip(".,;:") for m in URL.findall(text)) if not under(u, repo) and not u.startswith(OTHER_SITES)]


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


def test_the_repository_address_is_written_in_one_place():
    repo = repository()
    assert isinstance(repo, str)
    assert repo == "" or (repo.startswith("https://") and not repo.endswith("/")), repo
    for pkg in PKGS:  # packages build alone and never read the root file: no second copy there
        data = tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text())
        assert "mono" not in data.get("tool", {}), f"{pkg} has its own [tool.mono]"


@pytest.mark.parametrize("pkg", PKGS)
def test_project_urls_are_under_the_configured_repository_or_absent(pkg):
    """Empty address: no package declares a URL. Set: every URL under it, Homepage it, one into the package."""
    assert not url_problems(pkg, project(pkg).get("urls", {}), repository())


def test_the_url_checks_refuse_an_address_nobody_configured():
    made_up = "https://github.com/made-up/mono"
    old = {"Homepage": made_up, "Source": f"{made_up}/tree/main/packages/mono-common", "Issues": f"{made_up}/issues"}
    assert url_problems("mono-common", old, "")  # the 0.1.5 metadata, no address configured
    assert url_problems("mono-common", old, "https://example.org/mono")  # another address configured
    assert url_problems("mono-common", {"Homepage": made_up}, made_up)  # nothing points into the package
    assert not url_problems("mono-common", old, made_up)
    assert not url_problems("mono-common", {}, "")
    readme = f"Tests ([packages/mono-common]({made_up}/tree/main/packages/mono-common)), see {made_up}."
    assert len(readme_url_problems("mono-common", readme, "")) == 2
    assert not readme_url_problems("mono-common", readme, made_up)


@pytest.mark.parametrize("pkg", PKGS)
def test_the_readme_an_index_shows_has_no_local_path_and_only_absolute_links(pkg):
    text = (ROOT / "packages" / pkg / "README.md").read_text()
    for local in LOCAL_PATHS:
        assert local not in text, f"{pkg}/README.md holds a machine-local path ({local})"
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        assert target.startswith(("https://", "http://", "#")), f"{pkg}/README.md links {target!r}"
    assert not readme_url_problems(pkg, text, repository())
    words = " ".join(text.split())
    assert f"`packages/{pkg}` folder of the mono repository" in words, "the README names where its relative paths live"


@pytest.mark.parametrize("pkg", PKGS)
def test_the_readme_gives_the_cpu_and_gpu_commands(pkg):
    text = (ROOT / "packages" / pkg / "README.md").read_text()
    assert f"nox -t {pkg}`" in text or f"nox -t {pkg} " in text
    if any((ROOT / "packages" / pkg / "tests" / "kernels").glob("test_*.py")):
        assert f"nox -t {pkg}-gpu" in text
