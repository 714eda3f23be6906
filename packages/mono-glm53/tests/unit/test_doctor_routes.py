"""`mono doctor` with mono-glm53 installed: per ISA and TP size, the widths SGLang would route
to the kernel for the README's server, or every reason it would not; the root README's table
says the same."""

from __future__ import annotations

import io
import os
import pathlib
import re

import pytest
from sglang.kernels.plugin_kernels.amd import spec as amd_spec

from mono_common import cli
from mono_common.serving import routes
from mono_glm53 import ARCHITECTURE, serving
from mono_glm53.plugin import SPEC_PATH
from mono_glm53.spec import WIDTHS_BY_TP

ROOT = pathlib.Path(__file__).resolve().parents[4]


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    amd_spec.register(backend="amd", architecture=ARCHITECTURE, path=SPEC_PATH)
    for name in list(os.environ):
        if name.startswith(("MONO_", "SGLANG_")):
            monkeypatch.delenv(name)


def test_routes_are_the_widths_the_spec_serves_at_each_tp_size():
    found = {(r.isa, r.tp): r for r in routes(serving.setup())}
    assert set(found) == {(isa, tp) for isa, table in WIDTHS_BY_TP.items() for tp in table}
    for (isa, tp), r in found.items():
        assert r.routed and r.reasons == [], r
        assert r.widths == tuple(WIDTHS_BY_TP[isa][tp]), r


def test_a_refusal_in_the_environment_is_stated_once_for_every_row(monkeypatch):
    monkeypatch.setenv("MONO_GLM53_LAYER", "kernal")
    found = routes(serving.setup())
    assert found and not any(r.routed for r in found)
    for r in found:
        assert len(r.reasons) == 1 and "MONO_GLM53_LAYER=reference" in r.reasons[0], r
    out = io.StringIO()
    assert cli.doctor(out=out) == cli.EXIT_PROBLEM
    text = out.getvalue()
    assert text.count("MONO_GLM53_LAYER='kernal'") == 1, text  # said once, for every row
    assert "why not, on every ISA and TP size:" in text
    assert "mono-glm53: SGLang would route no server to its kernel" in text
    assert text.strip().splitlines()[-1] == "mono doctor: 1 problem(s) found"


def test_doctor_reports_the_routes_and_passes():
    out = io.StringIO()
    rc = cli.doctor(out=out)
    text = out.getvalue()
    assert "mono-glm53: " + " ".join(serving.setup().command()) in text
    for isa, table in WIDTHS_BY_TP.items():
        for tp, widths in table.items():
            assert re.search(rf"^{isa}\s+{tp}\s+{', '.join(map(str, widths))}$", text, re.M), (isa, tp, text)
    assert rc == cli.EXIT_OK, text
    assert text.strip().splitlines()[-1] == "mono doctor: everything checked, no problem found"


def test_the_root_readme_table_says_what_glm53_serves_today():
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| GLM-5.3 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    by_isa = {"gfx950": cells[1], "sm_90": cells[2]}
    for isa, table in WIDTHS_BY_TP.items():
        stated = {int(tp): w for tp, w in re.findall(r"TP (\d+): widths ([\d, ]*\d)", by_isa[isa])}
        assert stated == {tp: ", ".join(map(str, widths)) for tp, widths in table.items()}, (isa, by_isa[isa])
