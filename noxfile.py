"""Sessions of the mono monorepo, one family per package.

CPU sessions (what `nox -s tests` and CI run): `lint`, `unit(<pkg>)`,
`isolated(<model pkg>)`, `interp(<pkg>)`, `compile(<pkg>)`, `dist(<pkg>)`. GPU
sessions, off by default: `kernels(<pkg>)`, `e2e(<pkg>)`, `bench(<model>)`.
`demo` is the main job.

One package: `nox -t <pkg>` runs every CPU session of it (and passes on a machine
without a GPU); `nox -t <pkg>-gpu` runs its GPU tests (`kernels`, which fail
without a GPU); `nox -t <pkg>-e2e` its served-model tests (GPUs, the checkpoint
and sglang). Tags are exact names, so `mono-glm53` never selects
`mono-glm53-flash`.

sglang 0.5.23 with its dependencies (torch 2.14.1, triton 3.8; ~8 minutes and
~11 GB) is installed ONCE into a shared base environment
(`$MONO_BASE_ENV`, default ~/.cache/mono/base-sglang-0.5.23); every session
venv that needs it sees it through a .pth file, so sessions install only
the mono packages themselves. `isolated` venvs see nothing of it.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import subprocess
import sys

import nox
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent
PKGS = ["mono-common", "mono-deepseek-v41", "mono-glm53", "mono-glm53-flash"]
MODELS = PKGS[1:]
BASE = pathlib.Path(os.environ.get("MONO_BASE_ENV", "~/.cache/mono/base-sglang-0.5.23")).expanduser()
# Everything the CPU test sessions need from PyPI, installed once into BASE.
BASE_REQUIREMENTS = [
    "sglang==0.5.23",
    "pytest>=8",
    "pytest-xdist>=3.5",
    "hatchling>=1.27",
    "editables>=0.5",
    "build>=1.2",
    "matplotlib>=3.8",
]
# amd-aiter is a pure-Python ROCm JIT wheel whose shuffle_weight the layout tests
# compare against. It is downloaded, never installed: installed, its __init__
# raises RuntimeError without ROCm, which breaks `import sglang.srt.layers.quantization`.
AITER = "amd-aiter==0.1.7.post2.dev18"
AITER_DIR = BASE.parent / "aiter-wheel"
REPORTS = ROOT / ".nox-reports"

nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"


def _pkg_dir(pkg: str) -> pathlib.Path:
    return ROOT / "packages" / pkg


def _has_tests(pkg: str, kind: str) -> bool:
    return any((_pkg_dir(pkg) / "tests" / kind).glob("test_*.py"))


def _params(pkgs: list[str], kind: str = "") -> list:
    """One param per package, tagged `<pkg>` (CPU sessions) or `<pkg>-<kind>` (GPU ones), so
    `nox -t <pkg>` selects exactly what a machine without a GPU can run."""
    return [nox.param(p, id=p, tags=[f"{p}-{kind}" if kind else p]) for p in pkgs]


def _entry_point(pkg: str) -> str | None:
    data = tomllib.loads((_pkg_dir(pkg) / "pyproject.toml").read_text())
    eps = data.get("project", {}).get("entry-points", {}).get("sglang.srt.plugins", {})
    if len(eps) > 1:
        raise ValueError(f"{pkg} declares {len(eps)} sglang.srt.plugins entry points; one is allowed")
    return next(iter(eps), None)


def _base_python() -> pathlib.Path:
    return BASE / "bin" / "python"


def ensure_base(session: nox.Session) -> None:
    """Create or update the shared base environment holding sglang (once per machine)."""
    stamp = "\n".join(BASE_REQUIREMENTS + [AITER, sys.version.split()[0]])
    marker = BASE / ".mono-base-ready"
    if marker.exists() and marker.read_text() == stamp:
        return
    BASE.parent.mkdir(parents=True, exist_ok=True)
    with open(BASE.parent / f".{BASE.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and marker.read_text() == stamp:
            return
        session.log(f"installing the shared base environment at {BASE} (sglang: ~8 minutes once)")
        if not _base_python().exists():
            subprocess.run([sys.executable, "-m", "venv", str(BASE)], check=True)
        pip = [str(_base_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + BASE_REQUIREMENTS, check=True)
        subprocess.run([str(_base_python()), "-m", "pip", "uninstall", "-q", "-y", "amd-aiter"], check=False)
        subprocess.run([str(_base_python()), "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                        "-d", str(AITER_DIR), AITER], check=True)
        marker.write_text(stamp)


def aiter_wheel() -> pathlib.Path:
    wheels = sorted(AITER_DIR.glob("amd_aiter-*.whl"))
    if not wheels:
        raise RuntimeError(f"no amd-aiter wheel in {AITER_DIR}: delete {BASE / '.mono-base-ready'} and rerun")
    return wheels[-1]


def link_base(session: nox.Session) -> None:
    """Make the session venv see the base environment's packages through a .pth file."""
    ensure_base(session)
    code = "import sys, sysconfig; print(sysconfig.get_paths()['purelib']); print('%d.%d' % sys.version_info[:2])"
    mine = session.run("python", "-c", code, silent=True).split()
    theirs = subprocess.run([str(_base_python()), "-c", code], check=True, capture_output=True, text=True).stdout.split()
    if mine[1] != theirs[1]:
        session.error(f"the session runs Python {mine[1]} but the base environment is {theirs[1]}: run nox with Python {theirs[1]}")
    pathlib.Path(mine[0], "mono-base.pth").write_text(theirs[0] + "\n")


def install_editable(session: nox.Session, *pkgs: str) -> None:
    args = []
    for p in dict.fromkeys(("mono-common",) + pkgs):
        args += ["-e", str(_pkg_dir(p))]
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                "--disable-pip-version-check", *args)


def package_tests(session: nox.Session, pkg: str, kind: str, *extra: str) -> None:
    """Venv seeing the base env, the package installed editable, then its tests/<kind>."""
    link_base(session)
    install_editable(session, pkg)
    run_pytest(session, pkg, kind, *extra)


def run_pytest(session: nox.Session, pkg: str, kind: str, *extra: str) -> None:
    REPORTS.mkdir(exist_ok=True)
    report = REPORTS / f"{kind}-{pkg}.xml"
    session.chdir(_pkg_dir(pkg))
    # exit 5 (no test collected) fails the session: a session that tests nothing is a bug.
    session.run("python", "-m", "pytest", f"tests/{kind}", "-q", "-rs", f"--junitxml={report}",
                *extra, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the repo, and proof that the no-sibling-import rule fires."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    models = {"mono-glm53": "mono_glm53", "mono-glm53-flash": "mono_glm53_flash",
              "mono-deepseek-v41": "mono_deepseek_v41"}
    for pkg, own in models.items():
        siblings = [m for m in models.values() if m != own]
        probe = f"import {siblings[0]}\nfrom {siblings[1]} import ARCHITECTURE\n"
        fake = f"packages/{pkg}/src/{own}/_lint_probe.py"
        result = subprocess.run(["ruff", "check", "--stdin-filename", fake, "--select", "TID251", "-"],
                                input=probe, capture_output=True, text=True, cwd=ROOT,
                                env={**os.environ, "PATH": session.bin + os.pathsep + os.environ["PATH"]})
        if result.returncode == 0 or result.stdout.count("TID251") < 2:
            session.error(f"the banned sibling import rule did not fire in {pkg}:\n{result.stdout}{result.stderr}")
    session.log("sibling-import rule fires in every model package")


@nox.session(tags=["cpu"])
@nox.parametrize("pkg", _params(PKGS))
def unit(session: nox.Session, pkg: str) -> None:
    """CPU unit tests of one package against the real sglang 0.5.23."""
    link_base(session)
    install_editable(session, pkg)
    session.env["MONO_AITER_WHEEL"] = str(aiter_wheel())
    session.env["MONO_NOX_PYTHON"] = sys.executable  # the tests that list this noxfile's sessions
    run_pytest(session, pkg, "unit")


@nox.session(tags=["cpu"])
@nox.parametrize("pkg", _params(MODELS))
def isolated(session: nox.Session, pkg: str) -> None:
    """Wheels of mono-common and ONE model package in a bare venv: no siblings, no torch/sglang."""
    ensure_base(session)
    wheels = pathlib.Path(session.create_tmp()) / "wheels"
    if wheels.exists():
        for old in wheels.iterdir():
            old.unlink()
    for p in ("mono-common", pkg):
        session.run(str(_base_python()), "-m", "build", "--wheel", "--no-isolation", "--outdir", str(wheels),
                    str(_pkg_dir(p)), external=True, silent=True)
    session.run("python", "-m", "pip", "uninstall", "-q", "-y", *PKGS, success_codes=[0, 1])
    session.run("python", "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels),
                "--disable-pip-version-check", pkg)
    ep = _entry_point(pkg)
    session.run("python", "-m", "mono_common.isolation", pkg, *(["--entry-point", ep] if ep else []))
    session.run("python", "-c", CLI_WITHOUT_HEAVY, _model_key(pkg))


def _model_key(pkg: str) -> str:
    """The model's short name in `mono bench/check <model>` (mono-glm53 -> glm53)."""
    return pkg.removeprefix("mono-")


# Run in the bare venv of `isolated` (no torch, triton or sglang): every `mono` path a user
# can take ends with a one-line reason and a non-zero status, never a traceback.
CLI_WITHOUT_HEAVY = r"""
import subprocess, sys
from importlib import metadata
model = sys.argv[1]
cases = [(["doctor"], "stdout", "mono doctor: not everything was checked: registrations, routes and contract "
                                "not checked: sglang is not installed")]
for group in ("bench", "check"):
    if any(ep.name == model for ep in metadata.entry_points(group="mono." + group)):
        cases += [([group, model], "stderr", "mono %s %s: needs the Python module" % (group, model)),
                  ([group, model, "--help"], "stderr", "mono %s %s: needs the Python module" % (group, model))]
bad = []
for args, stream, start in cases:
    r = subprocess.run(["mono", *args], capture_output=True, text=True)
    text = getattr(r, stream).strip().splitlines()
    if r.returncode == 0 or "Traceback" in r.stdout + r.stderr or not text or not text[-1].startswith(start):
        bad.append("mono %s: status %d, last line %r" % (" ".join(args), r.returncode, text[-1:] or ""))
    if stream == "stderr" and len(text) != 1:
        bad.append("mono %s: %d lines on stderr, not one" % (" ".join(args), len(text)))
print("\n".join(bad) or "every mono command ends with a one-line reason here (%d checked)" % len(cases))
sys.exit(1 if bad else 0)
"""


@nox.session(tags=["cpu"])
@nox.parametrize("pkg", _params(PKGS))
def dist(session: nox.Session, pkg: str) -> None:
    """The sdist and the wheel built from it, as an index gets them: `twine check --strict`, the
    repository's LICENSE and NOTICE in both, the metadata an index shows."""
    ensure_base(session)
    session.install("twine>=6.1")
    out = pathlib.Path(session.create_tmp()) / "dist"
    if out.exists():
        for old in out.iterdir():
            old.unlink()
    # no --sdist/--wheel: build makes the sdist, then the wheel FROM it (so the sdist is complete)
    session.run(str(_base_python()), "-m", "build", "--no-isolation", "--outdir", str(out),
                str(_pkg_dir(pkg)), external=True, silent=True)
    files = sorted(str(f) for f in out.iterdir())
    session.run("twine", "check", "--strict", *files)
    problems = dist_problems(pkg, [pathlib.Path(f) for f in files])
    if problems:
        session.error("\n".join(problems))
    session.log(f"{pkg}: sdist and wheel carry LICENSE, NOTICE and the index metadata")


def dist_problems(pkg: str, files: list[pathlib.Path]) -> list[str]:
    """What is missing from a package's sdist and wheel (empty when nothing is)."""
    import email
    import tarfile
    import zipfile

    want = {name: (ROOT / name).read_bytes() for name in ("LICENSE", "NOTICE")}
    problems = []
    wheels = [f for f in files if f.suffix == ".whl"]
    sdists = [f for f in files if f.name.endswith(".tar.gz")]
    if len(wheels) != 1 or len(sdists) != 1:
        return [f"{pkg}: expected one wheel and one sdist, got {[f.name for f in files]}"]
    with zipfile.ZipFile(wheels[0]) as whl:
        names = whl.namelist()
        for name, data in want.items():
            hits = [n for n in names if n.endswith(f".dist-info/licenses/{name}")]
            if not hits or whl.read(hits[0]) != data:
                problems.append(f"{wheels[0].name}: no {name} identical to the repository's in .dist-info/licenses/")
        meta = email.message_from_bytes(whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))))
    # The repository's address lives in the root pyproject.toml's [tool.mono] only (empty while
    # the project has none, issue 22): no Project-URL until it is set, then only under it.
    repository = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mono"]["repository"].rstrip("/")
    required = ("License-Expression", "Classifier", "Requires-Python", "Summary") + (("Project-URL",) if repository else ())
    for field in required:
        if not meta.get_all(field):
            problems.append(f"{wheels[0].name}: METADATA has no {field}")
    for entry in meta.get_all("Project-URL") or []:
        url = entry.split(",", 1)[-1].strip()
        if not repository or not (url == repository or url.startswith(repository + "/")):
            problems.append(f"{wheels[0].name}: Project-URL {entry!r} is not under the repository address "
                            f"{repository!r} ([tool.mono] in the root pyproject.toml)")
    with tarfile.open(sdists[0]) as sdist:
        members = {m.name.split("/", 1)[-1]: m for m in sdist.getmembers()}
        for name, data in want.items():
            if name not in members or sdist.extractfile(members[name]).read() != data:
                problems.append(f"{sdists[0].name}: no {name} identical to the repository's")
    return problems


@nox.session(tags=["cpu"])
@nox.parametrize("pkg", _params([p for p in PKGS if _has_tests(p, "interp")]))
def interp(session: nox.Session, pkg: str) -> None:
    """Kernels in staged mode under the Triton interpreter, at tiny shapes, against the reference."""
    session.env["TRITON_INTERPRET"] = "1"
    package_tests(session, pkg, "interp")


@nox.session(name="compile", tags=["cpu"])
@nox.parametrize("pkg", _params([p for p in PKGS if _has_tests(p, "compile")]))
def compile_(session: nox.Session, pkg: str) -> None:
    """Every kernel variant compiled for gfx950 and sm_90 on the CPU, with resource budgets."""
    # Two workers: a GLM-5.3 layer variant takes about a minute to compile on a cold cache.
    package_tests(session, pkg, "compile", "-s", "-n", "2")


@nox.session(default=False, tags=["gpu"])
@nox.parametrize("pkg", _params([p for p in PKGS if _has_tests(p, "kernels")], "gpu"))
def kernels(session: nox.Session, pkg: str) -> None:
    """GPU tests at real shapes (needs a GPU; fails rather than skips without one)."""
    package_tests(session, pkg, "kernels", "--require-gpu")


@nox.session(default=False, tags=["gpu"])
@nox.parametrize("pkg", _params([p for p in MODELS if _has_tests(p, "e2e")], "e2e"))
def e2e(session: nox.Session, pkg: str) -> None:
    """Served-model tests (GPUs, checkpoint and a launched SGLang server)."""
    package_tests(session, pkg, "e2e", "--run-e2e", "--require-gpu")


@nox.session(default=False, tags=["gpu"])
@nox.parametrize("model", [nox.param("glm53", id="glm53")])
def bench(session: nox.Session, model: str) -> None:
    """`mono bench <model>` on the GPU: unfused path, monokernel, floor; JSON and PNG."""
    link_base(session)
    install_editable(session, "mono-glm53")
    session.run("mono", "bench", model, *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: `mono doctor`, then one covered GLM-5.3 layer on the tiny config."""
    link_base(session)
    install_editable(session, "mono-glm53")
    # 1: doctor found a problem (it says which); the demo still runs. 2: a check could not run.
    session.run("mono", "doctor", success_codes=[0, 1])
    demo_module = _pkg_dir("mono-glm53") / "src" / "mono_glm53" / "demo.py"
    if demo_module.exists():
        session.run("python", "-m", "mono_glm53.demo", *session.posargs)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Every CPU session: lint, unit, isolated, interp, compile and dist for every package."""
    if REPORTS.exists():
        for old in REPORTS.glob("*.xml"):
            old.unlink()
    session.notify("lint")
    for pkg in PKGS:
        session.notify(f"unit({pkg})")
    for pkg in MODELS:
        session.notify(f"isolated({pkg})")
    for pkg in PKGS:
        if _has_tests(pkg, "interp"):
            session.notify(f"interp({pkg})")
        if _has_tests(pkg, "compile"):
            session.notify(f"compile({pkg})")
    for pkg in PKGS:
        session.notify(f"dist({pkg})")
