"""`mono check glm53` on a CPU: the tiny config's covered layer in staged mode under the
Triton interpreter against the reference, printing the NUMERICS table and its verdict."""

from __future__ import annotations

import os
import subprocess
import sys

from mono_glm53.kernels.numerics import NUMERICS


def test_mono_check_glm53_prints_the_numerics_table_and_passes():
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run even where a GPU is visible
    out = subprocess.run([sys.executable, "-m", "mono_common.cli", "check", "glm53"],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("GLM-5.3 tiny layer") and lines[0].endswith("cpu: staged"), lines[0]
    table = {line.split()[0]: line for line in lines if "(bound" in line}
    bounded = [name for name in NUMERICS if name in table]
    assert len(bounded) >= 10, table  # the table lists the bounded metrics with their bounds
    for name in bounded:
        assert f"(bound {NUMERICS[name]})" in table[name], table[name]
    assert lines[-1] == "numerics: PASS"
