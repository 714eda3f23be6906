"""Repeat the cases that failed on the H200 in session 4 (TP1 w2 1 row ctx 4096: wrong row;
TP8 w2 ctx 65536: NaN) with the fused launch, reporting per launch the NUMERICS failures and
the first scratch buffer (stage order) that differs from a rerun or holds a non-finite value.
`--no-maxnreg` launches without layer.launch_options' maxnreg (bisects that option).
Runs with whichever sources PYTHONPATH names (this tree or HEAD's copy in old_head/).

PYTHONPATH=packages/mono-common/src:packages/mono-glm53/src python3 \
    packages/mono-glm53/bench/diag_session4.py [--no-maxnreg] [--reps 4]
"""

import argparse
import json
import sys

import torch
from diag_nan import first_bad  # this folder is sys.path[0] when run as a script

from mono_glm53.config import REAL
from mono_glm53.kernels import harness
from mono_glm53.kernels import layer as layer_mod
from mono_glm53.kernels.numerics import failures
from mono_glm53.weights import make_weights

ORDER = ("resid1", "hn", "qkva", "ikw", "qn", "qb", "iq", "qabs", "iq8", "iwt", "scores", "topk", "part",
         "ml", "attn", "ov", "op", "res_out", "h2", "lg", "gu", "inter", "out")


def snapshot(k):
    return {n: getattr(k, n).clone() for n in ORDER}


def first_diff(a, b):
    for n in ORDER:
        x, y = a[n], b[n]
        if x.is_floating_point():
            bad = ~torch.isfinite(x.float()).all() or ~torch.isfinite(y.float()).all()
            if bool(bad) or not torch.equal(x, y):
                return n
        elif not torch.equal(x, y):
            return n
    return None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-maxnreg", action="store_true")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--cases", default="tp1:2:1:4096,tp8:2:2:65536,tp8:2:1:4096")
    ap.add_argument("--modes", default="fused", help="comma list of fused, fused+delay, staged")
    a = ap.parse_args(argv)
    if a.no_maxnreg and hasattr(layer_mod, "launch_options"):
        layer_mod.launch_options = lambda device: {}
    res = []
    w = {}
    for spec in a.cases.split(","):
        sname, width, rows, ctx = spec.split(":")
        width, rows, ctx = int(width), int(rows), int(ctx)
        s = REAL.tp_shard(8, 0) if sname == "tp8" else REAL
        if sname not in w:
            w.clear()
            torch.cuda.empty_cache()
            w[sname] = make_weights(s, device="cuda", seed=0)
        c = harness.build_case(s, rows, ctx, True, "cuda", seed=ctx + rows, weights=w[sname])
        r_out, r_caches = harness.reference_out(c)
        k = layer_mod.GlmLayerKernel(s, w[sname], width, max_seq_len=ctx)
        prev = {}
        for i, mode in [(i, mode) for i in range(a.reps) for mode in a.modes.split(",")]:
            kmode = "fused" if mode == "fused+delay" else mode
            k_out, k_caches = harness.kernel_out(c, k, kmode, delay=20000 if mode == "fused+delay" else 0)
            torch.cuda.synchronize()
            k.guard.check()
            m = harness.compare(c, r_out, r_caches, k_out, k_caches, k)
            snap = snapshot(k)
            row = {"case": spec, "mode": mode, "rep": i, "fails": sorted(failures(m)),
                   "first_bad": first_bad(k, rows, ctx),
                   "hidden_cos": m.get("glm53_layer.hidden.cosine_min"),
                   "first_diff_vs_prev": None if mode not in prev else first_diff(prev[mode], snap)}
            prev[mode] = snap
            print(json.dumps(row), flush=True)
            res.append(row)
        if "fused" in prev and "staged" in prev:
            n = first_diff(prev["fused"], prev["staged"])
            d = {} if n is None else {"first": n, "max_abs": float((prev["fused"][n].float() - prev["staged"][n].float()).abs().max()),
                                      "where": [list(map(int, x)) for x in (prev["fused"][n] != prev["staged"][n]).nonzero()[:8].tolist()]}
            print("FUSED_VS_STAGED", spec, json.dumps(d), flush=True)
    print("SUMMARY", sum(bool(r["fails"]) for r in res), "of", len(res), "launches fail", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
