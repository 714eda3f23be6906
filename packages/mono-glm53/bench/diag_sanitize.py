"""H200 session 6: a few fresh kernel objects, each launched fused twice on one case, for
running under compute-sanitizer (synccheck / racecheck / memcheck). MONO_DIAG_LAST=1
(experiment patch) stops each fused launch after stage 1. Usage: diag_sanitize.py N sname:width:rows:ctx"""

import sys

import diag_cases
import torch

from mono_glm53.kernels.harness import build_case
from mono_glm53.kernels.layer import GlmLayerKernel
from mono_glm53.reference import LayerCaches

for case, s, w, width, rows, ctx in diag_cases.cases(sys.argv[2]):
    c = build_case(s, rows, ctx, True, "cuda", seed=ctx + rows, weights=w)
    for i in range(int(sys.argv[1])):
        k = GlmLayerKernel(s, w, width, max_seq_len=ctx, indexer=True, device="cuda")
        k.set_inputs(c.hidden, c.residual, c.inputs)
        for j in range(2):
            k.launch(LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone()), "fused")
            torch.cuda.synchronize()
            print(f"SANITIZE {case} obj {i} launch {j} done", flush=True)
        k.guard.check()
        del k
