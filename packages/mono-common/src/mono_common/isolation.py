"""Proves, inside a bare venv holding only mono-common and ONE model package, that it stands alone.

Run by the `isolated(<pkg>)` nox session after it installs the two wheels:
`python -m mono_common.isolation <dist> [--entry-point NAME]`. It checks that
the package's own `sglang.srt.plugins` entry point is there (or that none is
declared when the package has no spec yet), that no sibling's entry point or
module is present, that importing the package and loading its entry point
imports neither torch, triton nor sglang, and that registering without
SGLang fails with a message that says what is needed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata

MODEL_DISTS = {
    "mono-glm53": "mono_glm53",
    "mono-glm53-flash": "mono_glm53_flash",
    "mono-deepseek-v41": "mono_deepseek_v41",
}
HEAVY = ("torch", "triton", "sglang")
PLUGIN_GROUP = "sglang.srt.plugins"


def _heavy_loaded() -> list[str]:
    return sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)


def run_checks(dist: str, entry_point: str | None) -> list[str]:
    """Every isolation failure for `dist`, as messages (empty when isolated)."""
    failures: list[str] = []
    if dist not in MODEL_DISTS:
        return [f"{dist!r} is not a model package ({sorted(MODEL_DISTS)})"]
    module = MODEL_DISTS[dist]

    installed = sorted(
        d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].startswith("mono-")
    )
    if installed != sorted(["mono-common", dist]):
        failures.append(f"installed mono distributions are {installed}, expected mono-common and {dist}")
    for heavy in HEAVY:
        try:
            metadata.version(heavy)
            failures.append(f"{heavy} is installed in the bare venv: the check proves nothing")
        except metadata.PackageNotFoundError:
            pass

    eps = list(metadata.entry_points(group=PLUGIN_GROUP))
    ours = [ep for ep in eps if ep.dist is not None and ep.dist.metadata["Name"] == dist]
    others = [ep for ep in eps if ep not in ours]
    if entry_point is None:
        if ours:
            failures.append(f"{dist} has no spec yet but declares entry points {[e.name for e in ours]}")
    else:
        if [e.name for e in ours] != [entry_point]:
            failures.append(f"{dist} should declare exactly the entry point {entry_point!r}, has {[e.name for e in ours]}")
    if others:
        failures.append(f"entry points of other distributions are present: {[e.name for e in others]}")

    for sibling_dist, sibling in MODEL_DISTS.items():
        if sibling_dist == dist:
            continue
        try:
            importlib.import_module(sibling)
            failures.append(f"sibling package {sibling} imports in the {dist} venv")
        except ModuleNotFoundError:
            pass

    before = _heavy_loaded()
    try:
        importlib.import_module(module)
    except ImportError as exc:
        failures.append(f"{module} does not import: {exc}")
        return failures
    importlib.import_module("mono_common")
    for ep in ours:
        func = ep.load()
        loaded = [m for m in _heavy_loaded() if m not in before]
        if loaded:
            failures.append(f"loading entry point {ep.name} imported {loaded}")
        try:
            func()
            failures.append(f"entry point {ep.name} registered although sglang is absent")
        except Exception as exc:  # noqa: BLE001 - any failure must name what is needed
            if "sglang" not in str(exc):
                failures.append(f"entry point {ep.name} failed without naming sglang: {exc!r}")
    loaded = [m for m in _heavy_loaded() if m not in before]
    if loaded:
        failures.append(f"importing {module} imported {loaded}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dist")
    parser.add_argument("--entry-point", default=None, help="the entry point name the package must declare")
    args = parser.parse_args(argv)
    failures = run_checks(args.dist, args.entry_point)
    for f in failures:
        print(f"FAIL: {f}")
    if not failures:
        print(f"{args.dist}: isolated (entry point: {args.entry_point or 'none, no spec yet'}; "
              "siblings absent; no torch, triton or sglang imported)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
