"""One rank process of test_peer_processes_gpu.py (run by mono_common.testing.ranks).

usage: python peer_rank_child.py RANK WORLD OUT CASE

Allocates peer buffers with `mono_common.peer.allocate` over a gloo group (CUDA IPC handles
exchanged as in serving), builds this rank's Guard on the peer abort flag, and runs a one-shot
all-reduce kernel (mono_common.device.allreduce, the layer kernel's own) with the peers'
tables. CASE "allreduce": three launches, each rank's output against the fp32 rank-order sum.
CASE "fault": a good launch (compiles), then rank 1's program 0 never pushes; rank 1 waits
with a short deadline, the others with a long one: every rank must stop when rank 1 does.
"""

import hashlib
import sys
import time

import torch
import triton
import triton.language as tl

from mono_common import errors, peer
from mono_common.device.allreduce import allreduce_push, allreduce_sum
from mono_common.device.epochs import epoch_begin
from mono_common.guard_host import Guard, deadline_ticks
from mono_common.testing import ranks

M, W, BLOCK_N, BLOCK_M, P = 2, 2048, 256, 2, 8
SHORT_S, LONG_S = 0.3, 10.0


# rank, deadline and the stalled program are read from memory (`scal`, int64 [3]): as Python
# ints Triton would specialise on their values (1, multiples of 16, int32 range) and compile
# another variant inside the timed launch
@triton.jit
def _allreduce_kernel(part_ptr, out_ptr, M, epoch_ptr, mbox_tab, flag_tab, abort_ptr, abort_tab, err_ptr, scal,
                      W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, R: tl.constexpr,
                      RP2: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rank = tl.load(scal).to(tl.int32)
    deadline = tl.load(scal + 1)
    stall_pid = tl.load(scal + 2).to(tl.int32)
    e = epoch_begin(epoch_ptr + pid)
    if pid != stall_pid:
        allreduce_push(part_ptr, W, M, e, mbox_tab, flag_tab, rank, pid, nprog, W, BLOCK_N, BLOCK_M, R, RP2, True)
    allreduce_sum(out_ptr, W, M, e, mbox_tab, flag_tab, abort_ptr, abort_tab, err_ptr, rank, pid, nprog, 7,
                  deadline, W, BLOCK_N, BLOCK_M, R, RP2, R, CLOCK, FAULT, True, tl.bfloat16)


def _part(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(M, W, generator=g).to(torch.bfloat16)


def main():
    rank, world, out, (case,) = ranks.child_args()
    torch.cuda.set_device(0)
    group = ranks.init_group(rank, world)
    rp2 = max(2, 1 << (world - 1).bit_length())
    nblk = W // BLOCK_N
    requests = [("mbox", 2 * world * BLOCK_M * W * 2, "data"), ("flags", world * nblk * 4, "flags"),
                peer.ABORT_REGION]
    bufs = peer.allocate(requests, group=group, device="cuda:0")
    guard = Guard(world, device="cuda:0", mode="report", deadline_s=LONG_S, abort=peer.abort_args(bufs))
    part = _part(rank).cuda()
    expect = _part(0).float()
    for q in range(1, world):
        expect = expect + _part(q).float()
    expect = expect.to(torch.bfloat16).cuda()
    result = {"rank": rank, "tables": {n: bufs.table[n].tolist() for n in ("mbox", "flags")},
              "local": {n: bufs.local[n].data_ptr() for n in ("mbox", "flags")}}
    epochs = torch.zeros(P, dtype=torch.int32, device="cuda")
    o = torch.zeros(M, W, dtype=torch.bfloat16, device="cuda")

    def launch(deadline_s, stall):
        abort, abort_tab, err = guard.args(rank)
        scal = torch.tensor([rank, deadline_ticks(deadline_s, guard.clock), stall], dtype=torch.int64, device="cuda")
        _allreduce_kernel[(P,)](part, o, M, epochs, bufs.table["mbox"], bufs.table["flags"], abort, abort_tab, err,
                                scal, W=W, BLOCK_N=BLOCK_N, BLOCK_M=BLOCK_M, R=world, RP2=rp2, CLOCK=guard.clock,
                                FAULT=guard.fault)

    if case == "allreduce":
        digests, worst = [], 0.0
        for _ in range(3):  # both mailbox halves, then the first again
            torch.distributed.barrier(group)
            launch(LONG_S, -1)
            torch.cuda.synchronize()
            guard.check()
            worst = max(worst, float((o.float() - expect.float()).abs().max()))
            digests.append(hashlib.sha256(o.cpu().view(torch.int16).numpy().tobytes()).hexdigest())
        result.update(max_abs=worst, digests=digests)
    elif case == "fault":
        launch(LONG_S, -1)  # compiles; a good launch
        torch.cuda.synchronize()
        guard.check()
        torch.distributed.barrier(group)
        t0 = time.monotonic()
        launch(SHORT_S if rank == 1 else LONG_S, 0 if rank == 1 else -1)
        torch.cuda.synchronize()
        result["wall_s"] = time.monotonic() - t0
        try:
            guard.check(synchronize=False)
            result["stopped"] = False
        except errors.MonoDeviceError as e:
            w = e.word
            result.update(stopped=True, message=str(e), code=w.code, stage=w.stage, word_rank=w.rank,
                          origin=w.origin, flag=int(guard.abort[0, 0].item()))
    else:
        raise SystemExit(f"unknown case {case!r}")
    torch.distributed.barrier(group)  # no rank frees its pool while a peer may still read it
    ranks.write_result(out, result)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
