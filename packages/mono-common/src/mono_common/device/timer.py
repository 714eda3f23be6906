"""Device clocks for guarded waits, one per ISA, chosen by a constexpr.

`now(CLOCK)` returns a 64-bit tick count. The host turns `BuildContext.deadline_s` into ticks of the
same clock (`mono_common.guard_host.deadline_ticks`), so a kernel only ever compares tick
differences and never needs to know the clock's rate.

`now` is read by every thread for itself, so two warps of one program hold different values.
A decision that every warp of a program must take alike (a guarded wait's deadline: the wait
loop and its failure path hold barriers) uses `program_now` / `program_elapsed` instead: every
thread's reading reduced to their maximum through shared memory, one value for the program.
"""

import triton
import triton.language as tl

# Clock ids (host mirrors: mono_common.guard_host.CLOCK_*). Plain ints at module level: Triton
# reads them through the constexpr argument, not as globals.
CLOCK_GLOBALTIMER = 0  # sm_90: %globaltimer, nanoseconds
CLOCK_MEMREALTIME = 1  # gfx950: s_memrealtime, a 100 MHz constant clock
CLOCK_ITER = 2  # no clock (the interpreter, unknown ISAs): count polls against a calibrated bound


@triton.jit
def now(CLOCK: tl.constexpr):
    """Current tick count of the device clock `CLOCK` (int64); 0 for CLOCK_ITER."""
    if CLOCK == 0:
        t = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )
    elif CLOCK == 1:
        # s_memrealtime is a scalar memory op: wait for it before the value is used.
        t = tl.inline_asm_elementwise(
            "s_memrealtime $0\ns_waitcnt lgkmcnt(0)", "=s", [], dtype=tl.int64, is_pure=False, pack=1
        )
    else:
        t = tl.full([], 0, tl.int64)
    return t


# Threads of one program are at most 1024 (CUDA and ROCm): a [PROGRAM_LANES] tensor gives every
# thread at least one element of its own, so a reduction over it crosses every warp (a smaller
# one is replicated across warps and each warp would reduce only its own copy).
PROGRAM_LANES = tl.constexpr(1024)


@triton.jit
def program_now(CLOCK: tl.constexpr):
    """The clock as ONE value for the whole program: the maximum of every thread's reading,
    exchanged through shared memory (a barrier), so every warp holds the same tick count and
    takes the same branch on it. 0 for CLOCK_ITER."""
    t = now(CLOCK)
    if CLOCK != 2:
        t = tl.max(tl.full([PROGRAM_LANES], 0, tl.int64) + t, 0)
    return t


@triton.jit
def program_elapsed(start, iters, CLOCK: tl.constexpr):
    """`elapsed` from `program_now` readings: the same value in every warp of the program
    (`start` must be a `program_now` reading; for CLOCK_ITER the uniform poll count)."""
    if CLOCK == 2:
        e = iters.to(tl.int64)
    else:
        e = program_now(CLOCK) - start
    return e


@triton.jit
def elapsed(start, iters, CLOCK: tl.constexpr):
    """Ticks since `start`; for CLOCK_ITER the poll count `iters` stands in for time."""
    if CLOCK == 2:
        e = iters.to(tl.int64)
    else:
        e = now(CLOCK) - start
    return e


@triton.jit
def sleep_ticks(ticks, CLOCK: tl.constexpr):
    """Busy-wait about `ticks` of clock CLOCK (test delays); a no-op for CLOCK_ITER."""
    if CLOCK != 2:
        t0 = now(CLOCK)
        t = now(CLOCK) - t0
        while t < ticks:
            t = now(CLOCK) - t0
