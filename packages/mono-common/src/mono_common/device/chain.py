"""A counter-linked kernel: NSTAGE stage hand-offs across the whole grid.

In every stage each program writes a value that depends on (epoch, stage, program), releases
the stage counter, waits until all G programs have released it (counter >= epoch * G), and
checks the value its neighbour wrote. It is the smallest kernel that has the shape of a fused
layer (stages linked by monotonic counters, epoch bumped by the kernel itself), so the tests
use it for timeouts, faults, graph replay and delay races, and the benchmark times one stage
hand-off with it. SPIN: every wait `guard.wait_ge_spin` (sm_90, CLOCK 0) instead of `wait_ge`.

result[2 * pid] counts neighbour values that were wrong; result[2 * pid + 1] is the epoch seen.
"""

import triton
import triton.language as tl

from mono_common.device.epochs import epoch_begin
from mono_common.device.guard import signal, wait_ge, wait_ge_spin
from mono_common.device.timer import sleep_ticks

COUNTER_STRIDE = 32  # int32 words between stage counters: one 128-byte line each


@triton.jit
def chain_value(e, s, p, G: tl.constexpr):
    return e * 1000003 + s * G + p


@triton.jit
def chain_kernel(data_ptr, cnt_ptr, epochs_ptr, result_ptr, delays_ptr, nstage,
                 abort_ptr, abort_tab, err_ptr, deadline, stall_program,
                 G: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr,
                 DELAY: tl.constexpr, CHECK: tl.constexpr, SPIN: tl.constexpr = False):
    pid = tl.program_id(0)
    if pid == stall_program:
        return
    e = epoch_begin(epochs_ptr + pid)
    bad = 0
    ok = tl.full([], 1, tl.int1)
    nb = (pid + 1) % G
    for s in range(nstage):
        if ok:
            if DELAY:
                sleep_ticks(tl.load(delays_ptr + pid * nstage + s), CLOCK)
            if CHECK:
                tl.store(data_ptr + s * G + pid, chain_value(e, s, pid, G))
            signal(cnt_ptr + s * 32, 1, False)
            if SPIN:
                ok = wait_ge_spin(cnt_ptr + s * 32, e * G, abort_ptr, abort_tab, err_ptr, 0, pid, s,
                                  deadline, 1, CLOCK, FAULT, False)
            else:
                ok = wait_ge(cnt_ptr + s * 32, e * G, abort_ptr, abort_tab, err_ptr, 0, pid, s,
                             deadline, 1, CLOCK, FAULT, False)
            if CHECK:
                if ok:
                    got = tl.load(data_ptr + s * G + nb)
                    bad += (got != chain_value(e, s, nb, G)).to(tl.int32)
    tl.store(result_ptr + 2 * pid, bad)
    tl.store(result_ptr + 2 * pid + 1, e)
