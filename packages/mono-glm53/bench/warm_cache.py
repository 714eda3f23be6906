"""Fill the Triton cache with every layer-kernel variant the GPU suite and the bench launch, one
process per variant in parallel (a compile takes 10-30 s of one CPU core; the suite compiles
them one after another). Each process launches its variant once (fused, and every stage of the
staged mode where the suite runs it), so the cache keys are the launches' own.

PYTHONPATH=packages/mono-common/src:packages/mono-glm53/src TRITON_CACHE_DIR=... python3 \
    packages/mono-glm53/bench/warm_cache.py [--jobs 12] [--shapes tp8,tp8i | --variants tp8:2,tp8:8] \
    [--knobs '{"name": {"radix_loop": true}}' --knob-widths 2,8 --knob-shapes tp8,tp8i] \
    [--builds '[["tp8i", 2, {"mla_hold": 16}]]']

--builds takes a JSON list of [shape, width, knobs] (the GPU suite's `HOLD_CASES`, the knob builds
checked against the reference): each fused, and staged too at width 2.

--knobs takes the bench's JSON of named knob sets (`kernels.layer.KNOBS`): each set's fused
variant of every --knob-shapes shape (default the TP8 shard) at every --knob-widths width (the
bench's 1 row runs the width-2 build), beside the other variants, as `python3 -m
mono_glm53.bench --knobs` would compile them one by one. --shapes keeps only the suite's
variants of those shapes ("sim": the ranks side by side; empty: none, the knob sets alone).
"""

import argparse
import json
import multiprocessing as mp
import sys
import time

# (shape, width, indexer, staged too) for one rank; ("sim", worlds) for ranks side by side, one
# process for all worlds: each holds the whole layer's weights and their shards (~40 GB), and
# one process per world ran the H200 out of memory (session 7), with the TP1 processes (~20 GB)
VARIANTS = [("tp8", 2, True, True), ("tp8", 4, True, False), ("tp8", 8, True, True),
            ("tp8", 2, False, True), ("tp8i", 2, True, True), ("tp8i", 8, True, False),
            ("tp1", 2, True, True), ("tp1", 4, True, False), ("tp1", 8, True, False), ("sim", (2, 4, 8))]


def _one(v):
    """Compile (launch once) variant v; a failure is reported as a line, not raised, so one
    variant that fails (out of memory beside the others on a smaller GPU) leaves the rest."""
    try:
        return _launch(v)
    except Exception as e:  # the suite's test of this variant reports it properly
        return f"{v[:2]}: FAILED {type(e).__name__}: {str(e)[:200]}"


def _heavy(v) -> bool:
    """A variant that holds the whole layer's weights (TP1, ranks side by side: 20-40 GB)."""
    return v[0] in ("tp1", "sim")


def _launch(v):
    import torch

    from mono_glm53.config import REAL, named_shape
    from mono_glm53.weights import make_weights

    t0 = time.time()
    knobs = v[4] if len(v) > 4 else {}
    if v[0] == "sim":
        from mono_glm53.kernels.harness import run_tp_case

        full = make_weights(REAL, device="cuda", seed=0)
        for world in v[1]:
            run_tp_case(REAL, world, 2, 2, 1000, full_weights=full, seed=1)
    else:
        from mono_glm53.kernels.harness import build_case, kernel_out
        from mono_glm53.kernels.layer import GlmLayerKernel

        sname, width, indexer, staged = v[:4]
        s = named_shape(sname)
        c = build_case(s, width, 1000, indexer, "cuda", seed=1)
        k = GlmLayerKernel(s, c.w, width, max_seq_len=1000, indexer=indexer, **knobs)
        for mode in ("fused", "staged") if staged else ("fused",):
            kernel_out(c, k, mode)
        k.guard.check()
    torch.cuda.synchronize()
    return f"{v}: {time.time() - t0:.1f}s"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--knobs", default=None, metavar="JSON", help="named knob sets, as the bench's --knobs")
    ap.add_argument("--knob-widths", default="2,8", help="widths of each knob set's TP8 variant")
    ap.add_argument("--knob-shapes", default="tp8", help="shapes of each knob set's variants (tp8, tp8i)")
    ap.add_argument("--shapes", default=None,
                    help="comma list of shapes (tp8, tp8i, tp1, sim): only the suite's variants of these")
    ap.add_argument("--builds", default=None, metavar="JSON",
                    help="a list of [shape, width, knobs] (the GPU suite's HOLD_CASES): each fused, and staged "
                         "too at width 2 (as the reference tests run them)")
    ap.add_argument("--variants", default=None,
                    help="comma list of shape:width[:staged] (indexer; fused, and with ':staged' every "
                         "stage alone too) instead of the suite's and the bench's")
    a = ap.parse_args(argv)
    todo = VARIANTS
    if a.shapes is not None:
        todo = [v for v in VARIANTS if v[0] in a.shapes.split(",")]
    if a.variants:
        todo = [(v.split(":")[0], int(v.split(":")[1]), True, v.endswith(":staged")) for v in a.variants.split(",")]
    if a.builds:
        # one entry per distinct build: cases that differ only in context compile the same one
        seen = {}
        for sh, w, kn in json.loads(a.builds):
            seen.setdefault(json.dumps([sh, int(w), kn], sort_keys=True), (sh, int(w), True, int(w) == 2, kn))
        todo = todo + list(seen.values())
    if a.knobs:
        sets = json.loads(a.knobs)
        todo = todo + [(sh, int(w), True, False, sets[n]) for n in sets for w in a.knob_widths.split(",")
                       for sh in a.knob_shapes.split(",")]
    # on a GPU under 100 GB (an H100) the variants holding the whole layer run two at a time
    # after the others: all at once ran it out of memory (session 25)
    import torch

    small = torch.cuda.get_device_properties(0).total_memory < (100 << 30)
    waves = [[v for v in todo if not _heavy(v)], [v for v in todo if _heavy(v)]] if small else [todo]
    failed = 0
    for i, wave in enumerate(waves):
        if not wave:
            continue
        jobs = min(a.jobs or len(wave), 2) if small and i == 1 else (a.jobs or len(wave))
        with mp.get_context("spawn").Pool(jobs) as pool:
            for line in pool.imap_unordered(_one, wave):
                failed += "FAILED" in line
                print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
