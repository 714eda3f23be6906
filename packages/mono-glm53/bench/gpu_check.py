"""One H200 session for the GLM-5.3 layer kernel: correctness matrix, then timing.

Phase 1 runs one worker process per kernel variant in parallel (Triton compiles each variant
in its own process, sharing the on-disk cache): fused (and, for width 2, staged) vs the
reference at ctx 1000 / 4096 / 65536, random per-program delays, pad rows, and (TP8 width 2)
1000 graph replays with changing inputs. Phase 2 times the fused launch, the staged
per-stage times and the unfused reference, and runs `mono bench glm53` with the mono path.

PYTHONPATH=packages/mono-common/src:packages/mono-glm53/src python3 packages/mono-glm53/bench/gpu_check.py OUT
"""

import json
import os
import subprocess
import sys
import time

import torch


def shape(name):
    from mono_glm53.config import REAL, REAL_INTERLEAVED

    return {"tp8": REAL.tp_shard(8, 0), "tp1": REAL, "tp8i": REAL_INTERLEAVED.tp_shard(8, 0)}[name]


def worker(sname, width, staged, graph, out):
    from mono_glm53.kernels.harness import graph_replay_check, run_case
    from mono_glm53.kernels.numerics import failures
    from mono_glm53.weights import make_weights

    s = shape(sname)
    w = make_weights(s, device="cuda", seed=0)
    log = open(out, "a")
    for ctx in (1000, 4096, 65536):
        for rows in sorted({width, max(1, width - 1)}):
            modes = ["fused"]
            if staged and rows == width:
                modes.append("staged")
            if ctx == 4096 and rows == width:
                modes.append("fused+delay")
            t = time.time()
            try:
                m = run_case(s, width, rows, ctx, True, modes=tuple(modes), device="cuda",
                             seed=ctx + rows, delay=20000, weights=w)
                rec = dict(shape=sname, width=width, rows=rows, ctx=ctx, modes=modes,
                           secs=round(time.time() - t, 1), fail={k: v for k, v in failures(m).items()},
                           metrics=m)
            except Exception as exc:
                rec = dict(shape=sname, width=width, rows=rows, ctx=ctx, error=repr(exc)[:2000])
            print(json.dumps(rec), file=log, flush=True)
    if sname.startswith("tp8") and width == 2:
        try:
            m = run_case(s, width, width, 4096, False, modes=("fused", "staged"), device="cuda",
                         seed=5, weights=w)
            print(json.dumps(dict(shape=sname, width=width, ctx=4096, indexer=False,
                                  fail=failures(m), metrics=m)), file=log, flush=True)
        except Exception as exc:
            print(json.dumps(dict(shape=sname, indexer=False, error=repr(exc)[:2000])), file=log, flush=True)
    if graph:
        try:
            r = graph_replay_check(s, width, 4096, replays=1000, weights=w)
            print(json.dumps(dict(shape=sname, width=width, graph=r)), file=log, flush=True)
        except Exception as exc:
            print(json.dumps(dict(shape=sname, graph_error=repr(exc)[:2000])), file=log, flush=True)


def timing(out_dir):
    from mono_glm53 import reference as ref
    from mono_glm53.kernels.harness import build_case, fused_time_us, stage_times_us
    from mono_glm53.kernels.layer import GlmLayerKernel

    res = []
    for sname in ("tp8", "tp1"):
        s = shape(sname)
        from mono_glm53.weights import make_weights
        w = make_weights(s, device="cuda", seed=0)
        for ctx in (4096, 65536):
            c = build_case(s, 2, ctx, True, "cuda", seed=1, weights=w)
            for width in (2, 4, 8):
                cc = build_case(s, width, ctx, True, "cuda", seed=1, weights=w) if width > 2 else c
                k = GlmLayerKernel(s, w, width, max_seq_len=ctx, device="cuda")
                caches = ref.LayerCaches(kv=cc.caches.kv.clone(), index_k=cc.caches.index_k.clone())
                for rows in ((1, 2) if width == 2 else (width,)):
                    k.set_inputs(cc.hidden[:rows], cc.residual[:rows], _sub(cc.inputs, rows))
                    t = fused_time_us(k, caches)
                    row = dict(shape=sname, ctx=ctx, width=width, rows=rows, fused_us=round(t, 2))
                    if width == 2 and rows == 1:
                        row["stages_us"] = {a: round(b, 2) for a, b in stage_times_us(k, caches).items()}
                    res.append(row)
                    print(json.dumps(row), flush=True)
        del w
        torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(out_dir, "timing.json"), "w"), indent=1)


def _sub(inp, n):
    from mono_glm53.reference import DecodeInputs

    return DecodeInputs(positions=inp.positions[:n], seq_lens=inp.seq_lens[:n],
                        req_pool_indices=inp.req_pool_indices[:n], out_cache_loc=inp.out_cache_loc[:n],
                        req_to_token=inp.req_to_token, max_seq_len=inp.max_seq_len)


def main():
    out = sys.argv[1]
    phase = sys.argv[2] if len(sys.argv) > 2 else "all"
    os.makedirs(out, exist_ok=True)
    if len(sys.argv) > 3 and sys.argv[2] == "worker":
        _, _, _, sname, width, staged, graph = sys.argv
        worker(sname, int(width), staged == "1", graph == "1", os.path.join(out, f"w_{sname}_{width}.jsonl"))
        return
    t0 = time.time()
    budget = float(os.environ.get("GPU_CHECK_PHASE1_S", "260"))
    if phase in ("all", "check"):
        jobs = [("tp8", 2, 1, 1), ("tp8", 4, 0, 0), ("tp8", 8, 0, 0), ("tp8i", 2, 1, 0),
                ("tp1", 2, 1, 0), ("tp1", 4, 0, 0), ("tp1", 8, 0, 0)]
        procs = []
        for sname, width, staged, graph in jobs:
            lf = open(os.path.join(out, f"w_{sname}_{width}.log"), "w")
            procs.append(subprocess.Popen([sys.executable, __file__, out, "worker", sname, str(width),
                                           str(staged), str(graph)], stdout=lf, stderr=subprocess.STDOUT))
        for p in procs:
            left = budget - (time.time() - t0)
            try:
                p.wait(timeout=max(1, left))
            except subprocess.TimeoutExpired:
                p.kill()
        print(f"phase 1 done in {time.time() - t0:.0f}s", flush=True)
        for f in sorted(os.listdir(out)):
            if f.endswith(".jsonl"):
                for line in open(os.path.join(out, f)):
                    d = json.loads(line)
                    d.pop("metrics", None) if not d.get("fail") else None
                    print(json.dumps(d)[:600])
            elif f.endswith(".log"):
                txt = open(os.path.join(out, f)).read()
                if "Error" in txt or "error" in txt:
                    print(f, txt[-1500:])
    if phase in ("all", "time"):
        timing(out)
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
