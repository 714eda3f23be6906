"""Diagnosis: the fused launch at widths 2/4/8 with and without a pad row, eager and under a
captured CUDA graph, in report mode, so an expired wait is decoded instead of faulting."""

import os
import sys

os.environ.setdefault("MONO_GUARD_MODE", "report")

import torch  # noqa: E402

from mono_glm53.bench import _sub_inputs  # noqa: E402
from mono_glm53.config import REAL  # noqa: E402
from mono_glm53.kernels.layer import GlmLayerKernel  # noqa: E402
from mono_glm53.weights import make_caches, make_weights  # noqa: E402

s = REAL.tp_shard(8, 0)
w = make_weights(s, device="cuda", seed=1)
inp, caches = make_caches(s, 8, 4096, device="cuda", seed=1)
for width, rows in ((2, 1), (4, 3), (4, 4), (8, 5), (8, 8)):
    hid = torch.randn(rows, s.hidden, device="cuda").bfloat16()
    res = torch.randn(rows, s.hidden, device="cuda").bfloat16()
    k = GlmLayerKernel(s, w, width, max_seq_len=4096)
    k.set_inputs(hid, res, _sub_inputs(inp, rows))
    for phase in ("eager", "graph"):
        try:
            if phase == "eager":
                k.launch(caches, mode="fused")
                k.launch(caches, mode="fused")
            else:
                g = torch.cuda.CUDAGraph()
                st = torch.cuda.Stream()
                st.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(st):
                    k.launch(caches, mode="fused")
                torch.cuda.current_stream().wait_stream(st)
                with torch.cuda.graph(g):
                    k.launch(caches, mode="fused")
                for _ in range(3):
                    g.replay()
            torch.cuda.synchronize()
            k.guard.check()
            print(f"width {width} rows {rows} {phase}: ok", flush=True)
        except Exception as exc:  # noqa: BLE001 - print and go on to the next case
            print(f"width {width} rows {rows} {phase}: {type(exc).__name__}: {exc}", flush=True)
            if "CUDA" in str(exc):
                sys.exit(1)
