"""`python -m mono_glm53.demo`: one covered GLM-5.3 layer on the tiny config vs the reference.

Without a GPU: the kernel's staged mode under the Triton interpreter (TRITON_INTERPRET=1 is
set here before Triton loads). With a GPU: the fused persistent launch, plus its time (median
of CUDA-graph replays) beside the floor (bytes the step must read / 4.25 TB/s). Prints the
NUMERICS metrics and which bounds fail.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(prog="python -m mono_glm53.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=40)
    ap.add_argument("--no-indexer", action="store_true")
    a = ap.parse_args(argv)
    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"
    from mono_glm53.config import tiny
    from mono_glm53.kernels.harness import run_case
    from mono_glm53.kernels.numerics import NUMERICS, failures

    s = tiny()
    dev = "cuda" if gpu else "cpu"
    modes = ("fused", "staged") if gpu else ("staged",)
    print(f"GLM-5.3 tiny layer, width {a.width}, rows {a.rows}, ctx {a.ctx}, "
          f"{'indexer' if not a.no_indexer else 'no indexer'}, {dev}: {'+'.join(modes)}")
    m = run_case(s, a.width, a.rows, a.ctx, not a.no_indexer, modes=modes, device=dev,
                 nprog=None if gpu else 3)
    for k, v in m.items():
        print(f"  {k:45s} {v:.6g}   (bound {NUMERICS.get(k, '-')})")
    bad = failures(m)
    print("numerics:", "PASS" if not bad else f"FAIL {bad}")
    if gpu:
        from mono_glm53 import reference as ref
        from mono_glm53.kernels.harness import build_case, fused_time_us
        from mono_glm53.kernels.layer import GlmLayerKernel
        from mono_glm53.weights import weight_bytes

        c = build_case(s, a.rows, a.ctx, not a.no_indexer, dev)
        k = GlmLayerKernel(s, c.w, a.width, a.ctx, indexer=not a.no_indexer, device=dev)
        k.set_inputs(c.hidden, c.residual, c.inputs)
        caches = ref.LayerCaches(kv=c.caches.kv.clone(),
                                 index_k=None if c.caches.index_k is None else c.caches.index_k.clone())
        t = fused_time_us(k, caches)
        nbytes = weight_bytes(c.w, s, min(s.n_experts, a.rows * s.top_k))
        nbytes += a.rows * min(a.ctx, s.index_topk) * s.kv_cache_dim * 2
        if not a.no_indexer:
            nbytes += a.rows * a.ctx * s.index_k_token_bytes
        floor = nbytes / 4.25e12 * 1e6
        print(f"fused: {t:.2f} us, floor {floor:.3f} us ({floor / t:.1%} of floor)")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
