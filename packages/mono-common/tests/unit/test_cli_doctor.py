"""`mono doctor` on this CPU machine, and the bench/check dispatch."""

import io

from mono_common import cli


def test_doctor_prints_every_section():
    out = io.StringIO()
    rc = cli.doctor(out=out)
    text = out.getvalue()
    for section in ("installed packages", "sglang 0.5.23", "GPU:", "registrations", "contract"):
        assert section in text, text
    assert "mono-common" in text
    # This machine has no GPU.
    assert "GPU: none" in text
    assert rc == (1 if "problem(s)" in text else 0)


def test_unknown_model_is_refused_with_what_is_there(capsys):
    assert cli.main(["bench", "no-such-model"]) == 2
    assert "no bench for model 'no-such-model'" in capsys.readouterr().err
