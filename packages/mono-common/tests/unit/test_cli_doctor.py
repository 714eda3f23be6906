"""The `mono` command on this CPU machine: doctor's report, verdict and exit status, what it
keeps out of its report, and the bench/check dispatch without torch or sglang.

A fake model distribution (dist-info, entry points, a MonoSpec whose startup check refuses
every server) is put on the path of a subprocess, so doctor runs over entry points exactly as
it does over an installed model package.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap

import pytest

from mono_common import cli

NOISE = ("Only CUDA, HIP and XPU support AWQ", "support GGUF", "Cannot detect CUDA architecture", "fake third-party")

# A module blocker: importing any of these fails as it does where they are not installed.
BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = set(sys.argv.pop(1).split(","))
    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, Blocker())
    for m in [m for m in sys.modules if m.split(".")[0] in BLOCKED]:
        del sys.modules[m]
    from mono_common.cli import main
    sys.exit(main(sys.argv[1:]))
""")

FAKE_MODULE = textwrap.dedent('''
    """A fake mono model: its spec's startup check refuses every server, naming the fix."""
    ARCHITECTURE = "FakeForCausalLM"
    CONTRACT_MODULES = ()

    def register():
        from sglang.kernels.plugin_kernels.amd.spec import register as reg
        reg(backend="amd", architecture=ARCHITECTURE, path="fake_mono_model.spec:SPEC")

    def setup():
        from mono_common.serving import ServingSetup
        import types
        return ServingSetup(model="fake", architecture=ARCHITECTURE, model_path="org/Fake",
                            launch_args=("--tp", "8", "--enable-amd-monokernel"),
                            server_args=lambda tp: {"tp_size": tp, "enable_amd_monokernel": True},
                            hf_config=lambda: types.SimpleNamespace(architectures=[ARCHITECTURE]))

    def bench(argv):
        import torch  # noqa: F401 - what a real benchmark needs first
        return 0
''')

FAKE_SPEC = textwrap.dedent('''
    # what third-party modules do on import: print, write to fd 2, warn, log
    import logging, os, warnings
    print("fake third-party: printed on import")
    os.write(2, b"fake third-party: written to fd 2\\n")
    warnings.warn("fake third-party: Only CUDA supports FAKE currently.", UserWarning)
    logging.getLogger("fake.lib").warning("fake third-party: Cannot detect the architecture.")

    from sglang.kernels.plugin_kernels.amd.spec import (
        MONOKERNEL_API_VERSION, DeviceLimits, MonoSpec, Numerics, NumericsKind, Requirements)

    SPEC = MonoSpec(
        name="fake", devices={"sm_90": DeviceLimits(widths=(2,), tp_sizes=(8,), resident_blocks=1)},
        features=frozenset(), requires=Requirements(),
        numerics=Numerics(kind=NumericsKind.TOLERANCE, bounds={"layer.out.cosine": 0.9}),
        model_disable_reasons=lambda m, h, c: [], build=lambda m, h, c: None,
        api_version=MONOKERNEL_API_VERSION,
        config_disable_reasons=lambda cfg, hf: ["the fake kernel runs nothing: start the server with --fake-flag 1"],
    )
''')


@pytest.fixture
def fake_model(tmp_path):
    pkg = tmp_path / "fake_mono_model"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(FAKE_MODULE)
    (pkg / "spec.py").write_text(FAKE_SPEC)
    info = tmp_path / "mono_fake-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mono-fake\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\nmono_fake = fake_mono_model:register\n\n"
        "[mono.serving]\nfake = fake_mono_model:setup\n\n"
        "[mono.bench]\nfake = fake_mono_model:bench\n"
    )
    # mono-fake's import name is mono_fake: doctor imports the distribution's module by name
    (tmp_path / "mono_fake.py").write_text("from fake_mono_model import *  # noqa: F403\n")
    return tmp_path


def run_mono(args, path=None, blocked=()):
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-c", BLOCKER, ",".join(blocked) or "-", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def test_doctor_prints_every_section_and_a_verdict_that_matches_its_status():
    out = io.StringIO()
    rc = cli.doctor(out=out)
    text = out.getvalue()
    for section in ("installed packages", "sglang 0.5.23: supported", "GPU: none", "registrations",
                    "what a server would route", "contract"):
        assert section in text, text
    assert "mono-common" in text
    last = text.strip().splitlines()[-1]
    if rc == cli.EXIT_OK:
        assert last == "mono doctor: everything checked, no problem found"
    elif rc == cli.EXIT_PROBLEM:
        assert last.endswith("problem(s) found") and "problem(s):" in text
    else:
        assert rc == cli.EXIT_UNCHECKED and last.startswith("mono doctor: not everything was checked")


def test_doctor_without_sglang_could_not_check_and_says_so(monkeypatch):
    monkeypatch.setattr(cli, "installed_sglang_version", lambda: None)
    monkeypatch.setattr(cli, "sglang_problem", lambda: "sglang is not installed: install sglang >=0.5.23,<0.5.24")
    out = io.StringIO()
    assert cli.doctor(out=out) == cli.EXIT_UNCHECKED
    text = out.getvalue()
    assert "no problem found" not in text
    assert text.strip().splitlines()[-1].startswith("mono doctor: not everything was checked: registrations")
    assert "sglang is not installed" in text.strip().splitlines()[-1]


def test_doctor_states_every_refusal_of_a_model_fails_and_keeps_third_party_output_out(fake_model):
    result = run_mono(["doctor"], path=fake_model)
    out = result.stdout
    assert result.returncode == cli.EXIT_PROBLEM, out + result.stderr
    # SGLang's imports warn (AWQ, GGUF) and log ("Cannot detect CUDA architecture."): none of
    # it reaches the report or the terminal
    for noise in NOISE:
        assert noise not in out and noise not in result.stderr, noise
    assert result.stderr == ""
    held = re.search(r"\((\d+) lines that third-party code printed or warned are not shown", out)
    assert held and int(held.group(1)) >= 4, out  # at least the fake spec's four
    assert "mono-fake: python -m sglang.launch_server --model-path org/Fake --tp 8 --enable-amd-monokernel" in out
    # the ISA the spec lacks, in SGLang's words, and the TP size it lists, refused in the spec's
    assert "gfx950  -   none (refused)" in out and "sm_90   8   none (refused)" in out
    assert "has no spec for ['FakeForCausalLM'] on gfx950" in out
    assert out.count("the fake kernel runs nothing: start the server with --fake-flag 1") == 1
    assert "mono-fake: SGLang would route no server to its kernel" in out
    assert out.strip().splitlines()[-1] == "mono doctor: 1 problem(s) found"


def test_captured_output_holds_prints_warnings_and_fd_writes():
    # (log records reach stderr through a handler, so fd 2 covers them; under pytest its own
    # handler takes them, which is why the subprocess test above checks a logged line)
    import warnings

    with cli.captured_output() as noise:
        print("printed")
        os.write(2, b"written to fd 2\n")
        warnings.warn("a warning", UserWarning, stacklevel=1)
    text = "\n".join(noise)
    for want in ("printed", "written to fd 2", "UserWarning: a warning"):
        assert want in text, noise


def test_doctor_verbose_shows_what_it_held_back(monkeypatch):
    def noisy_run(self):
        print("third-party chatter")
        self.p("report line")

    monkeypatch.setattr(cli._Doctor, "run", noisy_run)
    quiet, loud = io.StringIO(), io.StringIO()
    cli.doctor(out=quiet)
    cli.doctor(out=loud, verbose=True)
    assert "third-party chatter" not in quiet.getvalue() and "report line" in quiet.getvalue()
    assert "1 lines that third-party code printed or warned are not shown" in quiet.getvalue()
    assert "  | third-party chatter" in loud.getvalue()


def test_doctor_without_sglang_importable_ends_with_one_line(fake_model):
    # sglang's distribution metadata is present but the package does not import: the
    # registration is a problem, and the last line says so.
    result = run_mono(["doctor"], path=fake_model, blocked=("sglang",))
    assert result.returncode in (cli.EXIT_PROBLEM, cli.EXIT_UNCHECKED), result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("mono doctor:")


@pytest.mark.parametrize("args", [["bench", "fake"], ["bench", "fake", "--help"]])
def test_bench_without_torch_ends_with_one_line(fake_model, args):
    result = run_mono(args, path=fake_model, blocked=("torch",))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == ["mono bench fake: needs the Python module 'torch', which is not installed here; "
                     "run it in the server's environment (torch, triton and sglang installed)"]


def test_unknown_model_is_refused_with_what_is_there(capsys):
    assert cli.main(["bench", "no-such-model"]) == 2
    assert "no bench for model 'no-such-model'" in capsys.readouterr().err
    assert cli.main(["check", "no-such-model"]) == 2
    assert "no check for model 'no-such-model'" in capsys.readouterr().err
