"""H200 session 5: the layer kernel with every buffer fenced by poisoned bands
(`harness.fenced_case`), at real shapes, fused and staged: an out-of-bounds read shows up as
NaN in the metrics, a write as a changed band. Usage: diag_fenced.py [sname:width:rows:ctx,...]"""

import sys
import time

import diag_cases

from mono_glm53.kernels.harness import fenced_case
from mono_glm53.kernels.numerics import failures

spec = sys.argv[1] if len(sys.argv) > 1 else "tp8:2:2:1000,tp8:2:2:4096,tp8:2:2:65536,tp8:2:1:65536,tp8:8:7:4096,tp8:4:4:65536,tp1:2:2:4096,tp1:2:1:1000"
for case, s, w, width, rows, ctx in diag_cases.cases(spec):
    t = time.time()
    try:
        m, bad = fenced_case(s, width, rows, ctx, True, modes=("fused", "staged", "fused"), device="cuda",
                             seed=ctx + rows, weights=w)
        print(f"FENCED {case}: failures {failures(m)} bands {bad} ({time.time() - t:.1f}s)", flush=True)
    except Exception as e:  # noqa: BLE001 - a diagnostic: report and go on
        print(f"FENCED {case}: EXCEPTION {type(e).__name__}: {e}", flush=True)
        break
