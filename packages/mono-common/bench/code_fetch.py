"""What instruction fetch costs a persistent kernel on one GPU: straight-line code run once.

A monokernel runs each stage's code once a launch, and between launches a weight stream larger
than the L2 passes through it. This times a kernel of S KB of straight-line SASS (4 independent
FFMA chains of S / 64 steps, every constant an immediate so nothing folds) on one program per
resident slot (132 x 4 warps on an H200) by %globaltimer stamps (last program's end minus the
first one's start), in six cache states, each the median of 22 launches:

  warm     right after the same kernel (its code in the SM instruction caches and the L2)
  l2       after two other straight kernels of 128 KB (instruction caches evicted, L2 kept)
  rstream  after a 256 MB read (the L2 turned over by reads, as a layer's weights do)
  wflush   after a 256 MB write
  rplain   after a 256 MB read by plain loads of a Triton kernel (`_stream`)
  rfirst   the same read with eviction_policy="evict_first" (sm_90: an L2 evict_first cache
           hint on every load), whether such weight reads leave the code in the L2

The code sizes are those the SASS holds (16 bytes an instruction); the cubin is larger (line
tables). sm_90 only (%globaltimer); a compile of the 128 KB kernel takes ~40 s of one core, so
the kernels compile in parallel processes first.

--roles: whether an SM that runs the same small code every launch keeps it warm through a
layer's weight stream. A layer-shaped kernel (`_staged`): ROLE_STAGES stages of 16 KB of
straight code each, different code a stage, a grid hand-off (`entries.grid_handoff`) after
each, every program also requesting STREAM_KB of a 1 GB buffer into the L2 a stage (the L2
turned over as a layer's weights turn it over, by `prefetch_range` as the layer requests its
weights: queued ahead of the instruction fetches; 0: no stream). Two forms of the same binary:
  all    every program runs every stage's code (128 KB an SM a launch, as the layer's ~300 KB)
  roles  stage s's code runs only on the SMs with %smid % ROLE_STAGES == s, the others pass
         its hand-off (16 KB an SM, the same code on the same SM every launch)
each timed warm (launches back to back) and after a 256 MB read between launches (rplain).
If `roles` stays near its warm time where `all` does not, pinning a stage's code to SMs that
run nothing else would turn the layer's cold fetch (~0.3 us a KB in the layer, results README)
into warm code.

--prewarm: whether running a stage's code before its hand-off warms it. The roles form without
a stream (`_staged_called`): each stage's code a called function (`_chains_call`: Triton calls
take scalars, so it loads its seeds and adds into the program's output row), timed inlined
(`_staged`), called, and called with the next stage's SMs running that stage's code dry (the
same code addresses, nothing stored) before each hand-off; warm and after a 256 MB read.
Session 35 (H100): the dry run changed nothing (23.90 vs 24.02 us warm), so an SM does not keep
16 KB of straight code from one run to the next.

Run: PYTHONPATH=packages/mono-common/src python3 packages/mono-common/bench/code_fetch.py --out DIR [--roles | --prewarm]
Prints one line per (size, state), or per (form, stream, state), and writes DIR/code_fetch.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys

import triton
import triton.language as tl

from mono_common.stages.entries import grid_handoff
from mono_common.stages.prefetch import prefetch_range

NPROG = 132
STEPS = (0, 256, 1024, 2048)  # 0, 16, 64, 128 KB
EVICTORS = ((2048, 100000), (2048, 200000))  # (steps, salt): 128 KB each, other code
FLUSH_BYTES = 256 << 20
SAMPLES, SKIP = 25, 3


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _chains(a, b, c, d, N: tl.constexpr, SALT: tl.constexpr):
    """N steps of 4 independent FFMA chains, every constant an immediate (SALT: other code)."""
    for i in tl.static_range(N):
        a = a * (1.0 + (i + SALT) * 1e-7) + 0.25
        b = b * (1.0 - (i + SALT) * 1e-7) + 0.5
        c = c * (1.0 + (i + SALT) * 2e-7) - 0.25
        d = d * (1.0 - (i + SALT) * 2e-7) - 0.5
    return a, b, c, d


@triton.jit
def _seeds(x_ptr):
    a = tl.load(x_ptr + tl.arange(0, 128))
    return a, a + 1.0, a + 2.0, a + 3.0


@triton.jit
def _finish(o_ptr, t_ptr, pid, t0, a, b, c, d):
    """The chains' sum stored (so nothing is dropped), then the program's start and end stamps."""
    tl.store(o_ptr + pid * 128 + tl.arange(0, 128), a + b + c + d)
    t1 = _now()
    tl.store(t_ptr + pid * 2, t0)
    tl.store(t_ptr + pid * 2 + 1, t1)


@triton.jit
def _straight(x_ptr, o_ptr, t_ptr, N: tl.constexpr, SALT: tl.constexpr):
    pid = tl.program_id(0)
    t0 = _now()
    a, b, c, d = _seeds(x_ptr)
    a, b, c, d = _chains(a, b, c, d, N, SALT)
    _finish(o_ptr, t_ptr, pid, t0, a, b, c, d)


ROLE_STAGES, ROLE_STEPS = 8, 256  # 8 stages of 16 KB each
STREAM_KB = (0, 64)  # a program's requests a stage: 0, or 132 x 64 KB = 8.4 MB a stage (67 MB a launch)
STREAM_BYTES = 1 << 30


@triton.jit
def _staged(x_ptr, o_ptr, t_ptr, bar_ptr, base, src_ptr, nsrc, NST: tl.constexpr, N: tl.constexpr,
            ROLES: tl.constexpr, SKB: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    t0 = _now()
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    a, b, c, d = _seeds(x_ptr)
    for s in tl.static_range(NST):
        if SKB > 0:
            # this stage's part of the stream (a new part each stage and launch), requested into
            # the L2 by every program as the layer requests its weights: queued ahead of the
            # instruction fetches, nothing waited for
            part = ((base // nprog + s).to(tl.int64) * nprog * (SKB * 1024)) % nsrc
            prefetch_range(pid, nprog, src_ptr + part, nprog * SKB * 1024, True)
        if ROLES:
            if sm % NST == s:
                a, b, c, d = _chains(a, b, c, d, N, s * 100000)
        else:
            a, b, c, d = _chains(a, b, c, d, N, s * 100000)
        grid_handoff(bar_ptr, base + (s + 1) * nprog)
    _finish(o_ptr, t_ptr, pid, t0, a, b, c, d)


@triton.jit(noinline=True)
def _chains_call(x_ptr, o_ptr, pid, live, N: tl.constexpr, SALT: tl.constexpr):
    """One stage as a called function (Triton passes a called function scalars only): the
    chains from the seeds at x_ptr, added into the program's row of o_ptr unless the call is
    dry (live 0: the same code addresses run, nothing stored; live is a runtime value, so
    nothing folds)."""
    a, b, c, d = _seeds(x_ptr)
    a, b, c, d = _chains(a, b, c, d, N, SALT)
    lane = tl.arange(0, 128)
    p = o_ptr + pid * 128 + lane
    tl.store(p, tl.load(p) + a + b + c + d, mask=lane < live * 128)


@triton.jit
def _staged_called(x_ptr, o_ptr, t_ptr, bar_ptr, base, live, NST: tl.constexpr, N: tl.constexpr,
                   PREWARM: tl.constexpr):
    """`_staged`'s roles form (no stream) with each stage's code a called function: stage s on
    the SMs with %smid % NST == s. PREWARM: before each hand-off, the SMs of the next stage
    run its code dry (live 0), so their instruction caches hold it when its hand-off passes."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    t0 = _now()
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    for s in tl.static_range(NST):
        if sm % NST == s:
            _chains_call(x_ptr, o_ptr, pid, live, N, s * 100000)
        if PREWARM:
            if s + 1 < NST:
                if sm % NST == s + 1:
                    _chains_call(x_ptr, o_ptr, pid, live * 0, N, (s + 1) * 100000)
        grid_handoff(bar_ptr, base + (s + 1) * nprog)
    t1 = _now()
    tl.store(t_ptr + pid * 2, t0)
    tl.store(t_ptr + pid * 2 + 1, t1)


@triton.jit
def _stream(src_ptr, dst_ptr, n, EV: tl.constexpr, BLOCK: tl.constexpr):
    # one read of src (int32) over the whole grid, its sum kept so the loads are not dropped
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        p = src_ptr + i + tl.arange(0, BLOCK)
        if EV == 1:
            acc += tl.load(p, eviction_policy="evict_first")
        else:
            acc += tl.load(p)
    tl.store(dst_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), acc)


def _read(big, dst, ev):
    src = big.view(dst.dtype)
    _stream[(4 * NPROG,)](src, dst, src.numel(), EV=ev, BLOCK=1024, num_warps=4)


def _buffers(torch):
    x = torch.rand(128, device="cuda")
    o = torch.zeros(128 * NPROG, device="cuda")
    t = torch.zeros(2 * NPROG, dtype=torch.int64, device="cuda")
    return x, o, t


def _launch(steps, salt, x, o, t):
    _straight[(NPROG,)](x, o, t, N=steps, SALT=salt, num_warps=4)


class _Roles:
    """The `_staged` kernel's buffers and its launches: the hand-off counter only grows, so
    each launch's targets start where the last one's ended."""

    def __init__(self, torch):
        self.x, self.o, self.t = _buffers(torch)
        self.bar = torch.zeros(2, dtype=torch.int32, device="cuda")
        self.src = torch.ones(STREAM_BYTES, dtype=torch.uint8, device="cuda")
        self.launches = 0

    def launch_called(self, prewarm: bool):
        base = self.launches * ROLE_STAGES * NPROG
        _staged_called[(NPROG,)](self.x, self.o, self.t, self.bar, base, 1, NST=ROLE_STAGES, N=ROLE_STEPS,
                                 PREWARM=prewarm, num_warps=4)
        self.launches += 1

    def launch(self, roles: bool, skb: int):
        # 132 programs of 4 warps, one an SM on an idle GPU: all resident for the hand-offs
        base = self.launches * ROLE_STAGES * NPROG
        nsrc = STREAM_BYTES - NPROG * max(STREAM_KB) * 1024
        _staged[(NPROG,)](self.x, self.o, self.t, self.bar, base, self.src, nsrc,
                          NST=ROLE_STAGES, N=ROLE_STEPS, ROLES=roles, SKB=skb, num_warps=4)
        self.launches += 1


def _compile(job):
    import torch

    if job[0] == "roles":
        _Roles(torch).launch(*job[1:])
    elif job[0] == "prewarm":
        _Roles(torch).launch_called(job[1])
    else:
        _launch(*job, *_buffers(torch))
    torch.cuda.synchronize()
    return job


def _median_span(torch, launch, pre, t) -> float:
    """Median over SAMPLES (the first SKIP dropped) of one launch's span in us, last program's
    end minus first program's start from its stamps t, each launch after `launch(); pre()`."""
    spans = []
    for _ in range(SAMPLES):
        launch()
        pre()
        launch()
        torch.cuda.synchronize()
        v = t.view(NPROG, 2).cpu()
        spans.append((v[:, 1].max() - v[:, 0].min()).item() / 1e3)
    return statistics.median(spans[SKIP:])


def measure_roles(torch, out=print) -> list[dict]:
    r = _Roles(torch)
    big = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty(4 * NPROG * 1024, dtype=torch.int32, device="cuda")
    before = {"warm": lambda: None, "rplain": lambda: _read(big, dst, 0)}
    rows = []
    for skb in STREAM_KB:
        for roles in (False, True):
            for state, pre in before.items():
                span = _median_span(torch, functools.partial(r.launch, roles, skb), pre, r.t)
                row = dict(form="roles" if roles else "all", stream_kb=skb, state=state, span_us=span)
                out(f"{row['form']:5s} stream {skb:3d} KB a program a stage  {state:7s} {row['span_us']:8.2f} us")
                rows.append(row)
    return rows


def measure_prewarm(torch, out=print) -> list[dict]:
    """The roles form (no stream) inlined, with called stage code, and called with the next
    stage's dry run before each hand-off; warm and after a 256 MB read (rplain)."""
    r = _Roles(torch)
    big = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty(4 * NPROG * 1024, dtype=torch.int32, device="cuda")
    before = {"warm": lambda: None, "rplain": lambda: _read(big, dst, 0)}
    rows = []
    forms = {"roles": functools.partial(r.launch, True, 0), "called": functools.partial(r.launch_called, False),
             "called+prewarm": functools.partial(r.launch_called, True)}
    for state, pre in before.items():
        for form, launch in forms.items():
            row = dict(form=form, state=state, span_us=_median_span(torch, launch, pre, r.t))
            out(f"{row['form']:15s} {state:7s} {row['span_us']:8.2f} us")
            rows.append(row)
    return rows


def measure(torch, out=print) -> list[dict]:
    x, o, t = _buffers(torch)
    big = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty(4 * NPROG * 1024, dtype=torch.int32, device="cuda")
    before = {
        "warm": lambda: None,
        "l2": lambda: [_launch(s, salt, x, o, t) for s, salt in EVICTORS],
        "rstream": lambda: torch.sum(big.view(torch.int32), dtype=torch.int64),
        "wflush": lambda: big.fill_(1),
        "rplain": lambda: _read(big, dst, 0),
        "rfirst": lambda: _read(big, dst, 1),
    }
    rows = []
    for steps in STEPS:
        for state, pre in before.items():
            span = _median_span(torch, functools.partial(_launch, steps, 0, x, o, t), pre, t)
            r = dict(kb=steps * 64 / 1024, state=state, span_us=span)
            out(f"{r['kb']:6.0f} KB  {state:8s} {r['span_us']:8.2f} us")
            rows.append(r)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="code-fetch")
    ap.add_argument("--roles", action="store_true", help="the layer-shaped probe: stage code pinned to SMs or not")
    ap.add_argument("--prewarm", action="store_true",
                    help="the roles probe with called stage code, each stage's code run dry before its hand-off")
    a = ap.parse_args(argv)
    import multiprocessing as mp

    import torch

    if not torch.cuda.is_available() or torch.version.hip:
        print("code_fetch times sm_90 code by %globaltimer: it needs a CUDA GPU", file=sys.stderr)
        return 2
    if a.prewarm:
        jobs = [("prewarm", pw) for pw in (False, True)] + [("roles", True, 0)]
    elif a.roles:
        jobs = [("roles", roles, skb) for roles in (False, True) for skb in STREAM_KB]
    else:
        jobs = [(s, 0) for s in STEPS] + list(EVICTORS)
    with mp.get_context("spawn").Pool(len(jobs)) as pool:
        pool.map(_compile, jobs)
    if a.prewarm:
        rows = measure_prewarm(torch)
    else:
        rows = measure_roles(torch) if a.roles else measure(torch)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "code_fetch.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), triton=triton.__version__, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
