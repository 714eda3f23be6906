"""Epochs: monotonic launch numbers kept in device memory, so graph replays need no reset.

Each program owns one int32 epoch slot and bumps it itself at the start of every launch
(`epoch_begin`), so every program of a launch agrees on the epoch without any host argument and
a captured CUDA graph replays correctly. Counters only grow: a stage counter that N signals
feed per launch reaches `epoch * N` at epoch `epoch` (`target`).

Wrap: counters, epochs and targets are int32 and wrap modulo 2**32 (at N = 264 programs the
targets `epoch * N` pass 2**31 after 2**31 / 264 = 8.1 M launches, about an hour of serving a
75-layer model; the epoch itself after 2**31 launches). They never need to be read as true
integers: `wait_ge` decides `cnt - target >= 0` in int32, which is the true comparison whenever
the true difference lies in [-2**31, 2**31). For an epoch counter it lies in [-N, 0] at every
wait: launches of one stream run one after another, so when a program of launch e waits, every
earlier launch has finished (the counter holds at least (e - 1) * N) and launch e adds at most
N (it holds at most e * N). Any N < 2**31 is therefore exact at every launch count. Triton's
integer add, sub and mul carry no no-overflow flag, so LLVM cannot rewrite `cnt - target < 0`
as `cnt < target` (tests/compile checks the emitted compare; tests/kernels and mono-glm53's
layer tests run launches across the wraps of the targets and of the epoch).
"""

import triton
import triton.language as tl


@triton.jit
def epoch_begin(epoch_slot_ptr):
    """Advance and return this program's epoch (1 on the first launch after zeroing).

    Every thread of the program reads the slot; one thread writes it back. Without the barrier
    a warp scheduled late could read the already-advanced value: its epoch, and so every wait
    target, would be one launch ahead of its siblings', it would keep polling while they went
    on, and the program's barriers would pair up across different code (seen on the H200: the
    first fused launch of a fresh mono-glm53 layer read shared memory its lagging warps had not
    filled yet, then crashed on garbage addresses)."""
    e = tl.load(epoch_slot_ptr) + 1
    tl.debug_barrier()
    tl.store(epoch_slot_ptr, e)
    return e


@triton.jit
def target(epoch, per_epoch):
    """The value a counter fed `per_epoch` times per launch holds once launch `epoch` is done."""
    return epoch * per_epoch


@triton.jit
def parity(epoch):
    """0 or 1: which half of a double buffer launch `epoch` uses."""
    return epoch & 1
