"""Repeat one kernel case and report the first scratch buffer holding a non-finite value
(stage order), per launch mode; for the intermittent NaN seen at TP1 width 4, 3 rows, ctx 4096.

PYTHONPATH=packages/mono-common/src:packages/mono-glm53/src python3 \
    packages/mono-glm53/bench/diag_nan.py tp1 4 3 4096 4
"""

import sys

import torch

from mono_glm53.config import REAL
from mono_glm53.kernels.harness import build_case, kernel_out, reference_out
from mono_glm53.kernels.layer import GlmLayerKernel
from mono_glm53.weights import make_weights

ORDER = ("x", "res", "resid1", "hn", "qkva", "ikw", "qn", "qb", "iq", "qabs", "iq8", "iwt", "scores",
         "topk", "part", "ml", "attn", "ov", "op", "res_out", "h2", "lg", "gu", "inter", "out")


def first_bad(k, rows, n):
    for name in ORDER:
        t = getattr(k, name)
        if name == "scores":
            t = t[:rows, :n]
        if name == "topk":
            bad = ((t[:rows] >= n) | (t[:rows] < -1)).any()
        elif t.is_floating_point():
            bad = ~torch.isfinite(t.float()).all()
        else:
            continue
        if bool(bad):
            return name
    return None


def main(sname, width, rows, ctx, reps):
    width, rows, ctx, reps = int(width), int(rows), int(ctx), int(reps)
    s = REAL.tp_shard(8, 0) if sname == "tp8" else REAL
    w = make_weights(s, device="cuda", seed=0)
    c = build_case(s, rows, ctx, True, "cuda", seed=ctx + rows, weights=w)
    print("cache finite:", bool(torch.isfinite(c.caches.kv.float()).all()), flush=True)
    for i in range(reps):
        r_out, r_caches = reference_out(c)
        fin = bool(torch.isfinite(r_out.hidden.float()).all() and torch.isfinite(r_out.residual.float()).all()
                   and torch.isfinite(r_caches.kv.float()).all())
        print("reference", i, "finite:", fin, flush=True)
    for mode in ("staged", "fused", "fused+delay"):
        k = GlmLayerKernel(s, w, width, max_seq_len=ctx)
        for i in range(reps):
            kout, _ = kernel_out(c, k, "fused" if mode != "staged" else "staged",
                                 delay=20000 if mode == "fused+delay" else 0)
            k.guard.check()
            print(mode, i, "first non-finite:", first_bad(k, rows, ctx), "nslot", int(k.nslot.item()), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
