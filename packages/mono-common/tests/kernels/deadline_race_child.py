"""Run by test_runtime_gpu in a subprocess (a hung launch must not take the test process with
it): guarded waits whose producers signal right at the deadline, plus or minus jitter.

G consumer programs (8 warps each) each wait on a counter of their own, with an abort flag and
an error word of their own (so one consumer's timeout stops no other), while G producer
programs each sleep the deadline plus a random jitter and then signal their consumer's counter.
Every thread of a consumer stores the verdict it holds; a program whose warps disagree, or whose
error word disagrees with its verdict, is a failure. Each launch is watched: one not done within
WATCHDOG_S is a hang (the process prints HANG and exits 4).

argv: launches, deadline in us, jitter in us, "program" (guard.wait_ge) or "legacy" (the wait
as it was before issue 21: each thread its own clock; kept to show the test sees that bug).
Prints one JSON line: RESULT {...}.
"""

import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

from mono_common import errors
from mono_common.device.guard import fail, poll, signal, wait_ge
from mono_common.device.timer import elapsed, now, sleep_ticks
from mono_common.guard_host import CLOCK_GLOBALTIMER

NT = 256  # threads of a consumer: 8 warps of 32
WATCHDOG_S = 10.0


@triton.jit
def _legacy_wait_ge(cnt_ptr, target, abort_ptr, abort_tab, err_ptr, rank, program, stage, deadline,
                    CLOCK: tl.constexpr):
    # mono-common 0.1.4's wait_ge: the deadline read per thread (each warp its own verdict)
    lane = tl.arange(0, 2)
    ptrs = tl.where(lane == 0, cnt_ptr, abort_ptr)
    start = now(CLOCK)
    v = poll(ptrs, False)
    cur = tl.sum(tl.where(lane == 0, v, 0), 0)
    ab = tl.sum(tl.where(lane == 1, v, 0), 0)
    iters = 0
    waited = tl.full([], 0, tl.int64)
    while ((cur - target) < 0) & (ab == 0) & (waited < deadline):
        v = poll(ptrs, False)
        cur = tl.sum(tl.where(lane == 0, v, 0), 0)
        ab = tl.sum(tl.where(lane == 1, v, 0), 0)
        iters += 1
        waited = elapsed(start, iters, CLOCK)
    ok = ((cur - target) >= 0) & (ab == 0)
    if not ok:
        fail(ab, cur, target, 0, waited, 0, abort_tab, err_ptr, rank, program, stage, 1, 0)
    tl.debug_barrier()
    return ok


@triton.jit
def race_kernel(cnt_ptr, abort_ptr, abort_tab, err_ptr, delay_ptr, out_ptr, target, deadline,
                G: tl.constexpr, NT: tl.constexpr, CLOCK: tl.constexpr, LEGACY: tl.constexpr):
    pid = tl.program_id(0)
    if pid < G:
        if LEGACY:
            ok = _legacy_wait_ge(cnt_ptr + pid * 32, target, abort_ptr + 2 * pid, abort_tab + pid,
                                 err_ptr + 16 * pid, pid, pid, 0, deadline, CLOCK)
        else:
            ok = wait_ge(cnt_ptr + pid * 32, target, abort_ptr + 2 * pid, abort_tab + pid, err_ptr + 16 * pid,
                         pid, pid, 0, deadline, 1, CLOCK, 0, False)
        # every thread stores the verdict it holds: one element per thread of the program
        tl.store(out_ptr + pid * NT + tl.arange(0, NT), tl.zeros([NT], tl.int32) + ok.to(tl.int32))
    else:
        c = pid - G
        sleep_ticks(tl.load(delay_ptr + c), CLOCK)
        signal(cnt_ptr + c * 32, 1, False)


def main(launches: int, deadline_us: float, jitter_us: float, variant: str) -> dict:
    G = torch.cuda.get_device_properties(0).multi_processor_count
    dev = "cuda"
    cnt = torch.zeros(G * 32, dtype=torch.int32, device=dev)
    abort = torch.zeros(G, 2, dtype=torch.int32, device=dev)
    abort_tab = torch.tensor([abort[c].data_ptr() for c in range(G)], dtype=torch.int64, device=dev)
    errs = torch.zeros(G, errors.NSLOTS, dtype=torch.int64, pin_memory=True)
    delays = torch.zeros(G, dtype=torch.int64, device=dev)
    out = torch.zeros(G, NT, dtype=torch.int32, device=dev)
    deadline = int(deadline_us * 1000)  # %globaltimer ticks are nanoseconds
    gen = torch.Generator().manual_seed(21)
    stats = dict(variant=variant, launches=0, consumers=G, ok=0, timeouts=0, disagree=[], bad_words=[],
                 hang=False, max_launch_ms=0.0)
    for launch in range(1, launches + 1):
        jitter = (torch.rand(G, generator=gen) * 2 - 1) * jitter_us * 1000
        delays.copy_((deadline + jitter).round().long())
        out.fill_(-1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        race_kernel[(2 * G,)](cnt, abort, abort_tab, errs, delays, out, launch, deadline,
                              G=G, NT=NT, CLOCK=CLOCK_GLOBALTIMER, LEGACY=variant == "legacy", num_warps=8)
        done = torch.cuda.Event()
        done.record()
        while not done.query():
            if time.perf_counter() - t0 > WATCHDOG_S:
                stats["hang"] = True
                print("HANG at launch", launch, flush=True)
                print("RESULT " + json.dumps(stats), flush=True)
                os._exit(4)
            time.sleep(0.0005)
        stats["max_launch_ms"] = max(stats["max_launch_ms"], (time.perf_counter() - t0) * 1e3)
        stats["launches"] = launch
        views = out.cpu()
        words = errs.tolist()
        for c in range(G):
            row = views[c]
            first = int(row[0])
            if not bool((row == first).all()) or first not in (0, 1):
                stats["disagree"].append((launch, c, sorted(set(row.tolist()))))
                continue
            w = errors.decode(words[c])
            if first == 1:
                stats["ok"] += 1
                if w is not None:
                    stats["bad_words"].append((launch, c, "ok but a word", w.describe()))
            else:
                stats["timeouts"] += 1
                if w is None or not w.complete or w.code != errors.CODE_TIMEOUT or w.expected != launch:
                    stats["bad_words"].append((launch, c, "stopped", None if w is None else w.describe()))
        # late producers have signalled by now (the launch is over): every counter is at `launch`
        abort.zero_()
        errs.zero_()
    stats["disagree"] = stats["disagree"][:20]
    stats["bad_words"] = stats["bad_words"][:20]
    return stats


if __name__ == "__main__":
    launches, deadline_us, jitter_us, variant = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    print("RESULT " + json.dumps(main(launches, deadline_us, jitter_us, variant)), flush=True)
