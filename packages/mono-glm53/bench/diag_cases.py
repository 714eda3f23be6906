"""Case lists of the session-5 H200 diagnostics: "sname:width:rows:ctx,..." (sname tp8 = one
TP8 rank's shard, tp1 = the whole layer), each with random weights made once per shape."""

import torch

from mono_glm53.config import REAL
from mono_glm53.weights import make_weights


def cases(spec: str):
    """Yield (case text, shape, weights, width, rows, ctx) for every case of `spec` on the GPU;
    one shape's weights are kept while its cases run, then freed."""
    held = {}
    for case in spec.split(","):
        sname, width, rows, ctx = case.split(":")
        if sname not in held:
            held.clear()
            torch.cuda.empty_cache()
            s = REAL.tp_shard(8, 0) if sname == "tp8" else REAL
            held[sname] = (s, make_weights(s, device="cuda", seed=0))
        s, w = held[sname]
        yield case, s, w, int(width), int(rows), int(ctx)
