"""Benchmark of the mono-common device runtime on one GPU.

  stage hand-off: a chain kernel (mono_common.device.chain) over G programs, CHECK off; one
    stage = every program releases the stage counter and acquire-polls it until all G arrived.
    Cost per hand-off = (t(nstage=1 + K) - t(nstage=1)) / K, each a median of CUDA-graph replays.
  simulated one-shot all-reduce + residual + RMSNorm: R simulated ranks x 16 programs on one
    GPU (mono_common.simulate_host.SimAllReduce), M = 1..8 rows of a 6144-wide bf16 activation;
    the median time of one launch (graph replay), beside an empty launch of the same kind.
    All R ranks share one GPU, so this is the protocol's cost with peer traffic over local HBM,
    not NVLink: it bounds the in-kernel work, not the cross-GPU latency.

Run: PYTHONPATH=packages/mono-common/src python3 packages/mono-common/bench/bench_runtime.py --out DIR
Prints a table and writes DIR/bench_runtime.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _graph_median_us(fn, launches_per_graph=20, replays=60):
    """Median microseconds of one fn() call, timed as CUDA-graph replays of `launches_per_graph` calls."""
    from mono_common.graph_timing import graph_median_us

    return graph_median_us(fn, launches_per_graph, replays)


def bench_handoff(G, K=100):
    from mono_common.chain_host import Chain
    from mono_common.guard_host import Guard

    # One chain per stage count: every launch of a chain must run all its stages, since each
    # stage counter is expected to grow by G per epoch.
    c1 = Chain(G, 1, guard=Guard(1, mode="report", deadline_s=2.0), check=False)
    ck = Chain(G, K + 1, guard=Guard(1, mode="report", deadline_s=2.0), check=False)
    t1 = _graph_median_us(lambda: c1.launch())
    tk = _graph_median_us(lambda: ck.launch())
    c1.guard.check()
    ck.guard.check()
    return dict(G=G, launch_1stage_us=t1, launch_stages=K + 1, launch_many_us=tk, handoff_us=(tk - t1) / K)


def bench_allreduce(R, M, W=6144):
    import torch

    from mono_common.guard_host import Guard
    from mono_common.simulate_host import SimAllReduce

    sim = SimAllReduce(R, M, W, P=16, BLOCK_N=128, num_warps=8, guard=Guard(R, mode="report", deadline_s=2.0))
    gen = torch.Generator(device="cpu").manual_seed(R * 10 + M)
    parts = torch.randn(R, M, W, generator=gen).bfloat16().cuda()
    resid = torch.randn(R, M, W, generator=gen).bfloat16().cuda()
    w = torch.randn(W, generator=gen).bfloat16().cuda()
    t = _graph_median_us(lambda: sim.run(parts, resid, w))
    sim.guard.check()
    return dict(R=R, M=M, W=W, programs=R * 16, allreduce_us=t)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8")
    args = ap.parse_args(argv)
    import torch
    import triton

    dev = torch.cuda.get_device_properties(0)
    sms = dev.multi_processor_count
    res = dict(command=" ".join([os.path.basename(sys.executable)] + sys.argv), device=dev.name, sms=sms,
               torch=torch.__version__, triton=triton.__version__, time=time.strftime("%Y-%m-%d %H:%M:%S"),
               handoff=[], allreduce=[])
    print(f"# {res['device']} ({sms} SMs), torch {res['torch']}, triton {res['triton']}")
    print("\n## stage hand-off (release + acquire of one counter across the grid), medians of graph replays")
    print(f"{'programs':>8} {'1-stage launch us':>18} {'101-stage launch us':>20} {'per hand-off us':>16}")
    for G in (sms, 2 * sms):
        r = bench_handoff(G)
        res["handoff"].append(r)
        print(f"{G:>8} {r['launch_1stage_us']:>18.2f} {r['launch_many_us']:>20.2f} {r['handoff_us']:>16.3f}")
    print("\n## simulated one-shot all-reduce + residual + RMSNorm, 6144 bf16, one launch (graph replay median)")
    ranks = [int(x) for x in args.ranks.split(",")]
    rows = [int(x) for x in args.rows.split(",")]
    print(f"{'rows':>4} " + " ".join(f"{'R=' + str(R) + ' us':>10}" for R in ranks))
    for M in rows:
        line = []
        for R in ranks:
            r = bench_allreduce(R, M)
            res["allreduce"].append(r)
            line.append(f"{r['allreduce_us']:>10.2f}")
        print(f"{M:>4} " + " ".join(line))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_runtime.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\nwrote {os.path.join(args.out, 'bench_runtime.json')}")


if __name__ == "__main__":
    main()
