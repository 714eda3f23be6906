"""`mono bench stages`: each library stage alone on the GPU, against the read ceiling.

For every stage, shape and row count it prints (and writes as JSON + PNG): the median time of a
stage (graph replays of one launch running the stage over L weight sets rotated through more
than 3x the L2, divided by L), with and without a grid hand-off after each set, the byte floor
(bytes the stage must read over the read ceiling measured in this run) and the fraction of the
ceiling reached. Variants (tile shapes, split-K vs stream-K, prefetch) run side by side.

    mono bench stages --out results/ [--rows 1,2,8] [--shapes 2624x6144,...] [--variants ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

GEMV_SHAPES = ((2624, 6144), (6144, 2048), (4096, 2048), (2048, 2048))
# name -> GemvPlan.make keywords
GEMV_VARIANTS = {
    "k64": dict(bn=64, span=False, num_warps=4),                 # the layer's tile before the library
    "s128x": dict(bn=128, span=True, num_warps=4),               # stream-K, x @ w^T, bf16 MMA
    "s128f": dict(bn=128, span=True, num_warps=4, dot=2),        # stream-K, swap-AB e4m3 MMA
    "s128fq": dict(bn=128, span=True, num_warps=4, dot=2, xq=True),  # + x quantised by its producer
    "s128fqp": dict(bn=128, span=True, num_warps=4, dot=2, xq=True, pre=True),  # + register prefetch
    "s256fq": dict(bn=256, span=True, num_warps=8, dot=2, xq=True),
    "s256fq4": dict(bn=256, span=True, num_warps=4, dot=2, xq=True),
}
ROTATE_BYTES = 256 << 20  # > 3x the H200's 60 MB L2 (and MI355X's 4 MB L2 x 8 XCDs + 256 MB MALL)


def _random_fp8_bits(torch, shape, device, gen):
    """Random e4m3 weights (finite codes only) as uint8."""
    v = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 64
    return v.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def bench_gemv(torch, dev, nprog, ceiling, shapes, rows_list, variants, replays, check=True):
    from mono_common.graph_timing import graph_median_us
    from mono_common.ref.fp8 import per_token_group_quant
    from mono_common.ref.gemv import block_fp8_gemv
    from mono_common.stages.gemv_host import alloc_out, launch_gemv, run_gemv

    gen = torch.Generator(device=dev).manual_seed(0)
    res = []
    for n, k in shapes:
        L = max(4, -(-ROTATE_BYTES // (n * k)))
        w = _random_fp8_bits(torch, (L, n, k), dev, gen)
        s = torch.rand((L, -(-n // 128), k // 128), generator=gen, device=dev) * 1e-3 + 1e-4
        nbytes = n * k + s[0].numel() * 4
        floor_us = nbytes / ceiling / 1e6
        for rows in rows_list:
            x = torch.randn((rows, k), generator=gen, device=dev).to(torch.bfloat16)
            # the reference on the CPU (fp64): a CUDA-side reference is not what is being checked
            ref = block_fp8_gemv(x.cpu(), w[0].cpu(), s[0].cpu()).double() if check else None
            for name in variants:
                plan, xq = variant_plan(name, n, k, rows, nprog)
                t0 = time.time()
                row = dict(stage="gemv_fp8", shape=f"{n}x{k}", rows=rows, variant=name, nprog=nprog,
                           BN=plan.BN, KS=plan.KS, PER=plan.PER, span=plan.span, pre=plan.pre,
                           warps=plan.num_warps, dot=plan.dot, xq=xq, L=L, bytes=nbytes, floor_us=floor_us)
                try:
                    xs = xqv = None
                    if xq:
                        q, xs = per_token_group_quant(x, 128)
                        xqv, xs = q.to(torch.bfloat16), xs.contiguous()
                    if check:
                        got = run_gemv(plan, xqv if xq else x, w[:1], s[:1], xs=xs)[0]
                        err = ((got.double().cpu() - ref).norm() / ref.norm()).item()
                        row["rel_err"] = err
                        if not err < (1e-3 if plan.dot == 2 else 1e-6):
                            row["error"] = f"relative error {err:.3g} vs the fp64 reference"
                    out = alloc_out(plan, L, dev)
                    bar = torch.zeros(2, dtype=torch.int32, device=dev)
                    for tag, b in (("bar", True), ("nobar", False)):
                        def step(plan=plan, xin=xqv if xq else x, w=w, s=s, out=out, bar=bar, b=b, xs=xs):
                            launch_gemv(plan, xin, w, s, out, bar, barrier=b, xs=xs)

                        us = graph_median_us(step, 1, replays, warmup=3) / L
                        row[f"us_{tag}"] = us
                        row[f"frac_{tag}"] = floor_us / us
                except Exception as e:  # a variant that fails to build is reported, not fatal
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                row["seconds"] = round(time.time() - t0, 1)
                res.append(row)
                _print_row(row)
        del w, s
        torch.cuda.empty_cache()
    return res


def variant_plan(name: str, n: int, k: int, rows: int, nprog: int):
    """(GemvPlan, whether x comes pre-quantised) of GEMV_VARIANTS[name]. The grid: `nprog`
    (2 programs per SM) at 4 warps, half at 8 (255 registers a thread fit once per SM)."""
    from mono_common.stages.gemv_host import GemvPlan

    kw = dict(GEMV_VARIANTS[name])
    xq = kw.pop("xq", False)
    grid = nprog // 2 if kw.get("num_warps", 4) == 8 else nprog
    return GemvPlan.make(n, k, rows, grid, **kw), xq


def _warm_one(job):
    """Compile one (shape, rows, variant) in a worker process, both hand-off forms (Triton's
    disk cache then serves the timing process)."""
    import torch

    from mono_common.stages.gemv_host import alloc_out, launch_gemv

    n, k, rows, name, nprog = job
    plan, xq = variant_plan(name, n, k, rows, nprog)
    w = torch.zeros((1, n, k), dtype=torch.uint8, device="cuda")
    s = torch.ones((1, -(-n // 128), k // 128), device="cuda")
    x = torch.zeros((rows, k), dtype=torch.bfloat16, device="cuda")
    xs = torch.ones((rows, k // 128), device="cuda") if xq else None
    out = alloc_out(plan, 1, "cuda")
    for b in (False, True):
        launch_gemv(plan, x, w, s, out, barrier=b, xs=xs)
    torch.cuda.synchronize()
    return job


def warm(shapes, rows_list, variants, nprog, jobs):
    """Compile every variant in `jobs` worker processes at once (compiles dominate otherwise)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    todo = [(n, k, r, v, nprog) for n, k in shapes for r in rows_list for v in variants]
    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
        for f in cf.as_completed([ex.submit(_warm_one, j) for j in todo]):
            try:
                f.result()
            except Exception as e:  # the timing pass reports it per variant
                print(f"warm-up compile failed: {type(e).__name__}: {str(e)[:200]}", flush=True)


def _print_row(r):
    if "us_bar" in r:
        print(f"{r['stage']:9s} {r['shape']:>10s} rows {r['rows']} {r['variant']:7s} BN {r['BN']:3d} "
              f"KS {r['KS']:2d} PER {r['PER']:3d}  {r['us_bar']:7.2f} us ({100 * r['frac_bar']:5.1f} %)"
              f"  no hand-off {r['us_nobar']:7.2f} us ({100 * r['frac_nobar']:5.1f} %)  floor {r['floor_us']:.2f} us"
              f"  rel_err {r.get('rel_err', float('nan')):.1e} {r.get('error', '')} [{r['seconds']} s]", flush=True)
    else:
        print(f"{r['stage']:9s} {r['shape']:>10s} rows {r['rows']} {r['variant']:7s} FAILED: {r.get('error')}", flush=True)


def _plot(res, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in res if "us_bar" in r]
    labels = [f"{r['shape']}\nr{r['rows']} {r['variant']}" for r in ok]
    fig, ax = plt.subplots(figsize=(max(8, len(ok) * 0.35), 4))
    ax.bar(range(len(ok)), [100 * r["frac_bar"] for r in ok], label="with hand-off")
    ax.plot(range(len(ok)), [100 * r["frac_nobar"] for r in ok], "k.", label="no hand-off")
    ax.set_xticks(range(len(ok)), labels, rotation=90, fontsize=6)
    ax.set_ylabel("% of read ceiling")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mono bench stages", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".", help="folder for stages_bench.json / .png")
    ap.add_argument("--rows", default="1,2,8")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in GEMV_SHAPES))
    ap.add_argument("--variants", default=",".join(GEMV_VARIANTS))
    ap.add_argument("--nprog", type=int, default=0, help="programs (default 2 per SM)")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--jobs", type=int, default=0, help="compile the variants first in this many processes")
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("mono bench stages needs torch and a GPU: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("mono bench stages needs a GPU: torch sees none", file=sys.stderr)
        return 2
    from mono_common.bench.ceiling import read_ceiling_tbs

    dev = torch.device("cuda")
    nprog = a.nprog or 2 * torch.cuda.get_device_properties(dev).multi_processor_count
    t0 = time.time()
    ceiling = read_ceiling_tbs(nprog=nprog)
    print(f"read ceiling: {ceiling:.3f} TB/s ({nprog} programs x 16 KB, 2 GiB)", flush=True)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",") if s]
    rows = [int(r) for r in a.rows.split(",")]
    variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in variants if v not in GEMV_VARIANTS]
    if unknown:
        print(f"unknown GEMV variants {unknown}: choose from {sorted(GEMV_VARIANTS)}", file=sys.stderr)
        return 2
    if a.jobs:
        warm(shapes, rows, variants, nprog, a.jobs)
        print(f"compiled in {time.time() - t0:.0f} s", flush=True)
    res = bench_gemv(torch, dev, nprog, ceiling, shapes, rows, variants, a.replays,
                     check=not a.no_check)
    os.makedirs(a.out, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__,
                triton=__import__("triton").__version__, ceiling_tbs=ceiling, nprog=nprog,
                seconds=round(time.time() - t0, 1), command="mono bench stages " + " ".join(argv or sys.argv[1:]))
    with open(os.path.join(a.out, "stages_bench.json"), "w") as f:
        json.dump(dict(meta=meta, results=res), f, indent=1)
    _plot(res, os.path.join(a.out, "stages_bench.png"))
    best = {}
    for r in res:
        if "us_bar" in r:
            key = (r["shape"], r["rows"])
            if key not in best or r["us_bar"] < best[key]["us_bar"]:
                best[key] = r
    print("best per shape and rows (with hand-off):")
    for (shape, rows), r in sorted(best.items()):
        print(f"  {shape:>10s} rows {rows}: {r['variant']:7s} {r['us_bar']:.2f} us = "
              f"{100 * r['frac_bar']:.1f} % of the ceiling (floor {r['floor_us']:.2f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
