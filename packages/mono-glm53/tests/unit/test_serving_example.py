"""The serving command the READMEs show is one SGLang 0.5.23 starts with mono-glm53's kernel.

Both the root README and this package's README hold the command `mono_glm53.serving`
describes (and `mono doctor` checks). A child process runs SGLang's whole startup resolution
on that exact command line, the spec's startup checks included, with the model path pointed
at a folder holding the FP8 checkpoint's config.json (no checkpoint download here) and the
GPU facts of an H200 (serving_resolve_child.py); it must resolve without a refusal, to the
values `serving.server_args` states, with decode graphs captured at every width the kernel
serves. The gfx950 side runs SGLang's startup check on the same resolved arguments.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import sys
import types

import pytest
from sglang.kernels.plugin_kernels.amd import spec as amd_spec
from sglang.srt.kernel_plugins.amd import binding

from mono_glm53 import ARCHITECTURE, serving
from mono_glm53.plugin import SPEC_PATH
from mono_glm53.spec import WIDTHS_BY_TP

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[3]
READMES = [ROOT / "README.md", ROOT / "packages" / "mono-glm53" / "README.md"]
LAUNCH = "python -m sglang.launch_server"


def readme_commands(path: pathlib.Path) -> list[list[str]]:
    """Every `python -m sglang.launch_server ...` command in a README, line continuations joined."""
    text = path.read_text().replace("\\\n", " ")
    return [shlex.split(line[line.index(LAUNCH):])[3:] for line in text.splitlines() if LAUNCH in line]


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_readme_serves_the_command_doctor_checks(readme):
    commands = readme_commands(readme)
    assert commands, f"{readme} shows no {LAUNCH} command"
    for args in commands:
        assert args[:2] == ["--model-path", serving.MODEL_PATH], args
        assert tuple(args[2:]) == serving.LAUNCH_ARGS, args


def _clean_env() -> dict:
    # the startup checks read mono's and SGLang's variables: a test shell's must not leak in
    return {k: v for k, v in os.environ.items() if not k.startswith(("MONO_", "SGLANG_"))}


def test_sglang_starts_the_readme_command_with_the_kernel_on_h200(tmp_path):
    serving.hf_config().save_pretrained(tmp_path)
    args = readme_commands(ROOT / "README.md")[0]
    args[1] = str(tmp_path)
    out = subprocess.run([sys.executable, str(HERE / "serving_resolve_child.py"), "sm_90", *args],
                         capture_output=True, text=True, env=_clean_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"], result["error"]
    resolved = result["resolved"]
    for key, want in serving.server_args(8).items():
        if key != "model_path":
            assert resolved[key] == want, (key, resolved[key], want)
    decode = resolved["cuda_graph_config"]["decode"]
    assert decode["backend"] == "full"
    assert set(WIDTHS_BY_TP["sm_90"][8]) <= set(decode["bs"]), decode["bs"]  # every width is captured
    assert "monokernel cannot run" not in out.stderr


@pytest.mark.parametrize("isa", sorted(WIDTHS_BY_TP))
def test_the_resolved_readme_server_passes_the_startup_check_on_both_isas(isa, monkeypatch):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    amd_spec.register(backend="amd", architecture=ARCHITECTURE, path=SPEC_PATH)
    for name in list(os.environ):
        if name.startswith(("MONO_", "SGLANG_")):
            monkeypatch.delenv(name)
    from mono_common.serving import server_config

    cfg = server_config(serving.setup(), 8)
    model_config = types.SimpleNamespace(hf_config=serving.hf_config(), dtype="bfloat16")
    spec, reasons = binding.monokernel_disable_reasons(cfg=cfg, model_config=model_config, isa=isa)
    assert spec is not None and reasons == []
