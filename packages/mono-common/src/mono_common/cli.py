"""The `mono` command: `mono doctor`, `mono bench <model>`, `mono check <model>`.

`doctor` reports which mono packages are installed (with versions), which
architectures they register, whether SGLang's own `find_spec` finds each
spec for gfx950 and sm_90, the contract status of every module that reads
SGLang, and the GPU seen. `bench` and `check` dispatch to the model
package's `mono.bench` / `mono.check` entry point, so a model package adds
its own without touching mono-common.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata

from mono_common.__about__ import __version__
from mono_common.sglang_compat import installed_sglang_version, sglang_problem

ISAS = ("gfx950", "sm_90")
PLUGIN_GROUP = "sglang.srt.plugins"
SGLANG_READS = (
    "sglang.kernels.plugin_kernels.amd.spec.find_spec",
    "sglang.kernels.plugin_kernels.amd.spec.BACKEND",
    "sglang.kernels.plugin_kernels.amd.spec.MONOKERNEL_API_VERSION",
)


def mono_distributions() -> list[tuple[str, str]]:
    """(name, version) of every installed mono-* distribution, sorted by name."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.startswith("mono-"):
            found[name] = dist.version
    return sorted(found.items())


def mono_entry_points() -> list[metadata.EntryPoint]:
    """The `sglang.srt.plugins` entry points that mono distributions declare."""
    return [
        ep for ep in metadata.entry_points(group=PLUGIN_GROUP)
        if ep.dist is not None and ep.dist.metadata["Name"].startswith("mono-")
    ]


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _module_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def gpu_seen() -> str:
    """The GPU torch sees, with its ISA, or 'none'."""
    try:
        import torch
    except ImportError:
        return "none (torch is not installed)"
    try:
        if not torch.cuda.is_available():
            return "none"
        props = torch.cuda.get_device_properties(0)
        if getattr(torch.version, "hip", None):
            isa = props.gcnArchName.split(":")[0]
        else:
            isa = f"sm_{props.major}{props.minor}"
        return f"{props.name} ({isa}, {props.multi_processor_count} SMs/CUs), {torch.cuda.device_count()} visible"
    except Exception as exc:  # noqa: BLE001 - report a broken driver instead of crashing
        return f"none (CUDA/HIP error: {exc})"


def doctor(out=sys.stdout) -> int:
    """Print the doctor report; return 1 when something a user relies on is broken."""
    problems: list[str] = []
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"mono doctor (mono-common {__version__})")
    p("")
    dists = mono_distributions()
    eps = {ep.dist.metadata["Name"]: ep for ep in mono_entry_points()}
    rows = []
    packages = {}
    for name, version in dists:
        module_name = name.replace("-", "_")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{name} does not import: {exc!r}")
            rows.append([name, version, "?", "does not import"])
            continue
        packages[name] = module
        arch = getattr(module, "ARCHITECTURE", "-")
        ep = eps.get(name)
        rows.append([name, version, arch, ep.name if ep else ("none (no spec yet)" if arch != "-" else "-")])
    p("installed packages")
    p(_table(rows, ["package", "version", "architecture", "sglang entry point"]) if rows else "  none")
    p("")
    sgl = installed_sglang_version()
    problem = sglang_problem()
    p(f"sglang {sgl or 'not installed'}: {'supported' if problem is None else problem}")
    p(f"torch {_module_version('torch')}, triton {_module_version('triton')}")
    p(f"GPU: {gpu_seen()}")
    p("")

    p("registrations (through each entry point into SGLang's registry)")
    if problem is not None:
        p(f"  not checked: {problem}")
    elif not eps:
        p("  no mono package declares an entry point")
    else:
        from sglang.kernels.plugin_kernels.amd import spec as amd_spec

        reg_rows = []
        for name, ep in sorted(eps.items()):
            try:
                ep.load()()
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{ep.name} failed to register: {exc!r}")
                reg_rows.append([ep.name, "-", f"register failed: {exc}"] + ["-"] * len(ISAS))
                continue
            arch = getattr(packages.get(name), "ARCHITECTURE", None)
            path = amd_spec._REGISTRY.get(amd_spec.BACKEND, {}).get(arch, "not registered")
            found = []
            for isa in ISAS:
                spec, why = amd_spec.find_spec(backend=amd_spec.BACKEND, architectures=[arch], isa=isa)
                if spec is None:
                    problems.append(f"find_spec({arch}, {isa}): {why}")
                found.append("found" if spec is not None else f"NOT FOUND: {why}")
            reg_rows.append([ep.name, arch, path] + found)
        p(_table(reg_rows, ["entry point", "architecture", "spec path"] + [f"find_spec {i}" for i in ISAS]))
    p("")

    p("contract (SGLANG_READS resolved against the installed SGLang)")
    if problem is not None:
        p(f"  not checked: {problem}")
    else:
        from mono_common.contract import check_modules

        modules = ["mono_common.cli"]
        for module in packages.values():
            modules += list(getattr(module, "CONTRACT_MODULES", ()))
        for report in check_modules(modules):
            if not report.ok:
                problems.append(report.describe())
            p(("  ok    " if report.ok else "  FAIL  ") + report.describe())
    p("")
    if problems:
        p(f"{len(problems)} problem(s):")
        for item in problems:
            p(f"  - {item}")
        return 1
    p("no problems found")
    return 0


def _dispatch(group: str, model: str, argv: list[str]) -> int:
    eps = {ep.name: ep for ep in metadata.entry_points(group=group)}
    if model not in eps:
        have = ", ".join(sorted(eps)) or "none installed"
        print(f"mono: no {group.split('.')[-1]} for model {model!r} (available: {have}); "
              f"install the model's package, e.g. pip install mono-{model}", file=sys.stderr)
        return 2
    result = eps[model].load()(argv)
    return int(result or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mono", description="mono SGLang monokernel plugins")
    parser.add_argument("--version", action="version", version=f"mono-common {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="what is installed, which specs SGLang finds, contract status, GPU")
    for name, text in (("bench", "time a covered layer (GPU)"), ("check", "run a model's check mode")):
        sp = sub.add_parser(name, help=text, add_help=False)
        sp.add_argument("model")
        sp.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    return _dispatch(f"mono.{args.command}", args.model, args.rest)


if __name__ == "__main__":
    raise SystemExit(main())
