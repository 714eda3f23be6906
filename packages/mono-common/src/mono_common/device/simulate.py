"""Single-GPU simulation of R tensor-parallel ranks for the all-reduce and abort protocols.

The grid is split into R groups of P programs; group r plays rank r with its own mailbox,
flags, scratch, abort flag and error word, each in its own allocation, reached only through
address tables exactly as real peers are (mono_common.peer builds the same tables from
pools shared by IPC handles). On one H200 this exercises the push/flag/sum/norm protocol and the abort
propagation between "ranks" that a several-GPU machine would run.

`sim_allreduce_kernel` can leave one program out (it never arrives) and can delay programs, for
the fault and race tests. The host driver is mono_common.simulate_host.SimAllReduce.
"""

import triton
import triton.language as tl

from mono_common.device.allreduce import allreduce_rmsnorm
from mono_common.device.epochs import epoch_begin
from mono_common.device.timer import sleep_ticks


@triton.jit
def sim_allreduce_kernel(part_ptr, resid_ptr, resid_out_ptr, out_ptr, w_ptr, M, eps,
                         epochs_ptr, mbox_tab, flag_tab, ssq_ptr, ssq_cnt_ptr,
                         abort_ptr, abort_tab, err_ptr, deadline,
                         stall_pid, delays_ptr,
                         P: tl.constexpr, W: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_M: tl.constexpr, R: tl.constexpr, RP2: tl.constexpr,
                         CLOCK: tl.constexpr, FAULT: tl.constexpr, SYS: tl.constexpr,
                         PHASES: tl.constexpr, DELAY: tl.constexpr, STAGE: tl.constexpr):
    pid = tl.program_id(0)
    rank = pid // P
    program = pid % P
    NBLK: tl.constexpr = W // BLOCK_N
    if pid == stall_pid:
        return
    # Staged runs (the interpreter) start a new epoch only in the launch that pushes.
    if PHASES & 1:
        e = epoch_begin(epochs_ptr + pid)
    else:
        e = tl.load(epochs_ptr + pid)
    if DELAY:
        sleep_ticks(tl.load(delays_ptr + pid), CLOCK)
    off = rank * M * W
    allreduce_rmsnorm(part_ptr + off, W, resid_ptr + off, W, resid_out_ptr + off, W,
                      out_ptr + off, W, w_ptr, M, eps, e,
                      mbox_tab, flag_tab, ssq_ptr + rank * (BLOCK_M * NBLK), ssq_cnt_ptr + rank * 32,
                      abort_ptr + rank * 2, abort_tab, err_ptr + rank * 16, rank, program, P,
                      STAGE, deadline,
                      W, BLOCK_N, BLOCK_M, R, RP2, R, CLOCK, FAULT, SYS, PHASES)
