"""H200 session 5: how often does a fused launch differ from the staged launch of the same
kernel object on the same inputs, and in which stage's buffers first? Many fresh objects per
case (first launch of each, then a second one). MONO_DIAG_FENCE=1 selects the per-thread
release fence before each hand-off. Usage: diag_race.py N sname:width:rows:ctx,...
The MONO_DIAG_* switches exist only with results/h200_session5/experiment_flags.patch applied.
"""

import os
import sys
import time

import diag_cases
import torch

from mono_glm53.kernels.harness import build_case
from mono_glm53.kernels.layer import GlmLayerKernel
from mono_glm53.reference import LayerCaches

ORDER = ["resid1", "hn", "qkva", "ikw", "qn", "rope", "iwraw", "kv", "index_k", "qb", "iq", "qabs", "iq8",
         "iwt", "scores", "topk", "part", "ml", "attn", "ov", "op", "res_out", "h2", "lg", "gu", "slot_e",
         "slot_w", "nslot", "inter", "out"]


def snap(k, caches):
    d = {n: getattr(k, n).clone() for n in ORDER if hasattr(k, n)}
    d["kv"] = caches.kv.clone()
    d["index_k"] = caches.index_k.clone()
    return d


DETAIL = []


def first_diff(a, b, tag):
    for n in ORDER:
        x, y = a[n], b[n]
        if x.dtype.is_floating_point and x.element_size() > 1:
            ne = ~((x == y) | (torch.isnan(x) & torch.isnan(y)))
        else:
            ne = x != y
        if bool(ne.any()):
            idx = ne.nonzero()
            first = idx[0].tolist()
            DETAIL.append(f"{tag} {n} shape {list(x.shape)}: {int(ne.sum())} differ, first at {first}, "
                          f"last at {idx[-1].tolist()}, values {x[tuple(first)].item()} vs {y[tuple(first)].item()}")
            return n
    return None


n_obj = int(sys.argv[1])
spec = sys.argv[2]
print("fence", os.environ.get("MONO_DIAG_FENCE"), flush=True)
for case, s, w, width, rows, ctx in diag_cases.cases(spec):
    c = build_case(s, rows, ctx, True, "cuda", seed=ctx + rows, weights=w)
    t0 = time.time()
    bad1, bad2, bad3, where = 0, 0, 0, {}
    for i in range(n_obj):
        k = GlmLayerKernel(s, w, width, max_seq_len=ctx, indexer=True, device="cuda")
        k.set_inputs(c.hidden, c.residual, c.inputs)
        runs = []
        for mode in ("fused", "fused", "staged", "staged"):
            caches = LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
            k.launch(caches, mode)
            torch.cuda.synchronize()
            runs.append(snap(k, caches))
        k.guard.check()
        d1 = first_diff(runs[0], runs[2], f"{case} obj {i} fused1-vs-staged1")
        d2 = first_diff(runs[1], runs[2], f"{case} obj {i} fused2-vs-staged1")
        d3 = first_diff(runs[3], runs[2], f"{case} obj {i} staged2-vs-staged1")
        bad1 += d1 is not None
        bad2 += d2 is not None
        bad3 += d3 is not None
        for d in (d1, d2, d3):
            if d:
                where[d] = where.get(d, 0) + 1
        del k, runs
    print(f"RACE {case} fence={os.environ.get('MONO_DIAG_FENCE')}: first fused != staged {bad1}/{n_obj}, "
          f"second {bad2}/{n_obj}, staged twice {bad3}/{n_obj}, first differing buffer {where} ({time.time() - t0:.1f}s)", flush=True)
    for line in DETAIL[:8]:
        print("  DETAIL", line, flush=True)
    DETAIL.clear()
