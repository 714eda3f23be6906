"""The `mono` command: `mono doctor`, `mono bench <model>`, `mono check <model>`.

`doctor` reports which mono packages are installed (with versions), which architectures
they register, whether SGLang's own `find_spec` finds each spec for gfx950 and sm_90, per
model, ISA and TP size the widths a server started as the model's README shows would route
to the kernel, or every reason it would not (SGLang's startup checks, through
`mono_common.serving`), the contract status of every module that reads SGLang, and the GPU
seen. Its exit status: 0 when everything was checked and nothing is wrong, 1 when a check
found a problem (a model whose kernel no server would reach counts), 2 when a check could
not run (no supported SGLang, a package that does not import). What SGLang and its
dependencies print or warn while doctor imports them (AWQ, GGUF, "Cannot detect CUDA
architecture.") is kept out of the report: `--verbose` prints it after.

`bench` and `check` dispatch to the model package's `mono.bench` / `mono.check` entry
point, so a model package adds its own without touching mono-common. Any command that
needs a module this environment lacks (torch, triton, sglang) ends with one line saying
which, not a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import sys
import tempfile
import warnings
from importlib import metadata

from mono_common.__about__ import __version__
from mono_common.sglang_compat import installed_sglang_version, sglang_problem

ISAS = ("gfx950", "sm_90")
PLUGIN_GROUP = "sglang.srt.plugins"
EXIT_OK, EXIT_PROBLEM, EXIT_UNCHECKED = 0, 1, 2
SGLANG_READS = (
    "sglang.kernels.plugin_kernels.amd.spec.find_spec",
    "sglang.kernels.plugin_kernels.amd.spec.BACKEND",
    "sglang.kernels.plugin_kernels.amd.spec.MONOKERNEL_API_VERSION",
    "sglang.kernels.plugin_kernels.amd.spec._REGISTRY",
)


def mono_distributions() -> list[tuple[str, str]]:
    """(name, version) of every installed mono-* distribution, sorted by name."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.startswith("mono-"):
            found[name] = dist.version
    return sorted(found.items())


def mono_entry_points(group: str = PLUGIN_GROUP) -> list[metadata.EntryPoint]:
    """The entry points of `group` that mono distributions declare."""
    return [
        ep for ep in metadata.entry_points(group=group)
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


def _flush_real_streams() -> None:
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or missing stream holds nothing
            pass
    for handler in logging.getLogger().handlers:
        handler.flush()


@contextlib.contextmanager
def captured_output():
    """Hold back what third-party code prints, logs or warns inside the block.

    Yields a list that holds the captured lines once the block ends. Both the Python
    streams and file descriptors 1 and 2 are redirected, so output of C extensions and of
    logging handlers bound to the real stderr is caught too."""
    lines: list[str] = []
    py_out, py_err = io.StringIO(), io.StringIO()
    saved_fds = []
    tmp = tempfile.TemporaryFile(mode="w+b")
    _flush_real_streams()
    for fd in (1, 2):
        try:
            saved_fds.append((fd, os.dup(fd)))
            os.dup2(tmp.fileno(), fd)
        except OSError:  # no such descriptor (embedded interpreters): Python streams only
            pass
    try:
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_err):
            warnings.simplefilter("always")
            yield lines
    finally:
        _flush_real_streams()
        for fd, copy in saved_fds:
            os.dup2(copy, fd)
            os.close(copy)
        tmp.seek(0)
        raw = tmp.read().decode(errors="replace")
        tmp.close()
        for text in (py_out.getvalue(), py_err.getvalue(), raw):
            lines += [ln for ln in text.splitlines() if ln.strip()]
        lines += [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]


class _Doctor:
    """Builds the doctor report: its lines, the problems found and the checks that could not run."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.problems: list[str] = []
        self.unchecked: list[str] = []
        self.packages: dict[str, object] = {}

    def p(self, *parts: object) -> None:
        self.lines.append(" ".join(str(x) for x in parts))

    def run(self) -> None:
        self.p(f"mono doctor (mono-common {__version__})")
        self.p("")
        eps = {ep.dist.metadata["Name"]: ep for ep in mono_entry_points()}
        self.installed(eps)
        sgl = installed_sglang_version()
        problem = sglang_problem()
        self.p(f"sglang {sgl or 'not installed'}: {'supported' if problem is None else problem}")
        self.p(f"torch {_module_version('torch')}, triton {_module_version('triton')}")
        self.p(f"GPU: {gpu_seen()}")
        self.p("")
        if problem is not None:
            self.unchecked.append(f"registrations, routes and contract not checked: {problem}")
            for section in ("registrations", "routes", "contract"):
                self.p(f"{section}: not checked ({problem})")
            self.p("")
            return
        self.registrations(eps)
        self.routes()
        self.contract()

    def installed(self, eps: dict) -> None:
        rows = []
        for name, version in mono_distributions():
            try:
                module = importlib.import_module(name.replace("-", "_"))
            except Exception as exc:  # noqa: BLE001 - a broken install is reported, not raised
                self.unchecked.append(f"{name} does not import: {type(exc).__name__}: {exc}")
                rows.append([name, version, "?", "does not import"])
                continue
            self.packages[name] = module
            arch = getattr(module, "ARCHITECTURE", "-")
            ep = eps.get(name)
            spec = ep.name if ep else ("none: no spec yet, SGLang serves it on its own path" if arch != "-" else "-")
            rows.append([name, version, arch, spec])
        self.p("installed packages")
        self.p(_table(rows, ["package", "version", "architecture", "sglang entry point"]) if rows else "  none")
        self.p("")

    def registrations(self, eps: dict) -> None:
        self.p("registrations (through each entry point into SGLang's registry)")
        if not eps:
            self.p("  no mono package declares an entry point")
            self.p("")
            return
        from sglang.kernels.plugin_kernels.amd import spec as amd_spec

        rows = []
        for name, ep in sorted(eps.items()):
            try:
                ep.load()()
            except Exception as exc:  # noqa: BLE001
                self.problems.append(f"{ep.name} failed to register: {type(exc).__name__}: {exc}")
                rows.append([ep.name, "-", f"register failed: {exc}"] + ["-"] * len(ISAS))
                continue
            arch = getattr(self.packages.get(name), "ARCHITECTURE", None)
            path = amd_spec._REGISTRY.get(amd_spec.BACKEND, {}).get(arch, "not registered")
            found = []
            for isa in ISAS:
                spec, why = amd_spec.find_spec(backend=amd_spec.BACKEND, architectures=[arch], isa=isa)
                found.append("found" if spec is not None else f"not found: {why}")
            if all(f != "found" for f in found):
                self.problems.append(f"SGLang finds no spec of {name} ({arch}) on {' or '.join(ISAS)}")
            rows.append([ep.name, arch, path] + found)
        self.p(_table(rows, ["entry point", "architecture", "spec path"] + [f"find_spec {i}" for i in ISAS]))
        self.p("")

    def routes(self) -> None:
        from mono_common.serving import routes

        self.p("what a server would route to each kernel (SGLang's startup checks on the command each")
        self.p("model's README shows, per ISA and TP size, with this shell's environment variables)")
        setups = mono_entry_points("mono.serving")
        if not setups:
            self.p("  no mono package declares a mono.serving setup")
        spec_dists = {ep.dist.metadata["Name"] for ep in mono_entry_points()}
        for dist in sorted(spec_dists - {ep.dist.metadata["Name"] for ep in setups}):
            self.problems.append(f"{dist} registers a spec but declares no mono.serving setup to check")
        for ep in sorted(setups, key=lambda e: e.name):
            dist = ep.dist.metadata["Name"]
            try:
                setup = ep.load()()
                found = routes(setup)
            except Exception as exc:  # noqa: BLE001 - a check that cannot run is reported
                self.unchecked.append(f"{dist}: routes not checked: {type(exc).__name__}: {exc}")
                self.p(f"{dist}: not checked ({type(exc).__name__}: {exc})")
                continue
            self.p(f"{dist}: {' '.join(setup.command())}")
            rows = [[r.isa, str(r.tp) if r.tp else "-",
                     ", ".join(map(str, r.widths)) if r.routed else "none (refused)"] for r in found]
            self.p(_table(rows, ["isa", "tp", "widths routed to the kernel"]))
            # a reason every refused route shares is said once
            refused = [r for r in found if r.reasons]
            shared = [x for x in refused[0].reasons if all(x in r.reasons for r in refused)] if refused else []
            if shared:
                where = "every ISA and TP size" if len(refused) == len(found) else "every refused row"
                self.p(f"  why not, on {where}:")
                self.p("\n".join(f"    - {reason}" for reason in shared))
            for r in refused:
                own = [x for x in r.reasons if x not in shared]
                if own:
                    self.p(f"  why not, {r.isa}{f' TP {r.tp}' if r.tp else ''}:")
                    self.p("\n".join(f"    - {reason}" for reason in own))
            if not any(r.routed for r in found):
                self.problems.append(f"{dist}: SGLang would route no server to its kernel on any ISA or TP size")
        self.p("")

    def contract(self) -> None:
        from mono_common.contract import check_modules

        self.p("contract (SGLANG_READS resolved against the installed SGLang)")
        modules = ["mono_common.cli", "mono_common.serving"]
        for module in self.packages.values():
            modules += list(getattr(module, "CONTRACT_MODULES", ()))
        for report in check_modules(modules):
            if not report.ok:
                self.problems.append(report.describe())
            self.p(("  ok    " if report.ok else "  FAIL  ") + report.describe())
        self.p("")

    def verdict(self) -> tuple[int, list[str]]:
        """The exit status and the closing lines (the last one is a one-line verdict)."""
        lines = []
        for title, items in (("problem(s)", self.problems), ("check(s) could not run", self.unchecked)):
            if items:
                lines.append(f"{len(items)} {title}:")
                lines += [f"  - {item}" for item in items]
        if self.unchecked:
            return EXIT_UNCHECKED, lines + [f"mono doctor: not everything was checked: {self.unchecked[0]}"]
        if self.problems:
            return EXIT_PROBLEM, lines + [f"mono doctor: {len(self.problems)} problem(s) found"]
        return EXIT_OK, lines + ["mono doctor: everything checked, no problem found"]


def doctor(out=None, verbose: bool = False) -> int:
    """Print the doctor report; return 0 (all checked, fine), 1 (problem found) or 2 (unchecked)."""
    out = out if out is not None else sys.stdout
    report = _Doctor()
    with captured_output() as noise:
        try:
            report.run()
        except Exception as exc:  # noqa: BLE001 - doctor reports, it does not crash
            report.unchecked.append(f"doctor stopped: {type(exc).__name__}: {exc}")
    status, closing = report.verdict()
    for line in report.lines + closing[:-1]:
        print(line, file=out)
    if noise and verbose:
        print(f"\nwhat third-party code printed or warned during the checks ({len(noise)} lines):", file=out)
        for line in noise:
            print(f"  | {line}", file=out)
    elif noise:
        print(f"({len(noise)} lines that third-party code printed or warned are not shown: "
              "mono doctor --verbose shows them)", file=out)
    print(closing[-1], file=out)
    return status


def _missing_module_line(command: str, exc: ModuleNotFoundError) -> str | None:
    """The one-line reason for a module this environment lacks, or None when the missing
    module is mono's own (a broken install: the traceback is the useful answer)."""
    missing = (exc.name or "").split(".")[0]
    if not missing or missing.startswith("mono_"):
        return None
    return (f"mono {command}: needs the Python module {missing!r}, which is not installed here; "
            f"run it in the server's environment (torch, triton and sglang installed)")


def _dispatch(group: str, model: str, argv: list[str]) -> int:
    command = group.split(".")[-1]
    eps = {ep.name: ep for ep in metadata.entry_points(group=group)}
    if model not in eps:
        have = ", ".join(sorted(eps)) or "none installed"
        print(f"mono: no {command} for model {model!r} (available: {have}); "
              f"install the model's package, e.g. pip install mono-{model}", file=sys.stderr)
        return 2
    try:
        result = eps[model].load()(argv)
    except ModuleNotFoundError as exc:
        line = _missing_module_line(f"{command} {model}", exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    return int(result or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mono", description="mono SGLang monokernel plugins")
    parser.add_argument("--version", action="version", version=f"mono-common {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    dp = sub.add_parser("doctor", help="what is installed, what a server would route to each kernel and why not; "
                                       "exit 0 ok, 1 problem found, 2 a check could not run")
    dp.add_argument("--verbose", action="store_true", help="also print what third-party code printed or warned")
    for name, text in (("bench", "time a covered layer (GPU)"),
                       ("check", "a model's layer against its reference on the tiny config, with the NUMERICS table")):
        sp = sub.add_parser(name, help=text, add_help=False)
        sp.add_argument("model")
        sp.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "doctor":
        status = doctor(verbose=args.verbose)
        # A compiled module SGLang imports warns once more while the interpreter shuts down
        # ("builtin type swigvarlink has no __module__ attribute"), after the report and past
        # any warnings filter: the report is complete, so stderr is closed for the shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        return status
    return _dispatch(f"mono.{args.command}", args.model, args.rest)


if __name__ == "__main__":
    raise SystemExit(main())
