"""The read-only HBM ceiling of this GPU, measured in the same run as what is compared with it.

A Triton kernel sums a large buffer (default 2 GiB, far past the L2) with `nprog` programs, each
keeping BLOCK int32 (16 KB at 4096) in flight per loop step; the ceiling is bytes over the
median graph-replay time. A copy moves read + write and was measured well below this on the
H200 (facts.md), so floors use this read ceiling.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _read_sum(ptr, n, out_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.int32)
    offs = tl.arange(0, BLOCK)
    for o in range(pid * BLOCK, n, nprog * BLOCK):
        acc += tl.load(ptr + o + offs, mask=o + offs < n, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def read_ceiling_tbs(nbytes: int = 2 << 30, nprog: int | None = None, block: int = 4096,
                     replays: int = 20, device="cuda") -> float:
    """TB/s of a read-only stream over `nbytes` (int32 sum, `block` words a step a program)."""
    import torch

    from mono_common.graph_timing import graph_median_us

    dev = torch.device(device)
    if nprog is None:
        nprog = 2 * torch.cuda.get_device_properties(dev).multi_processor_count
    buf = torch.randint(0, 7, (nbytes // 4,), dtype=torch.int32, device=dev)
    out = torch.empty(nprog, dtype=torch.int32, device=dev)
    def step(buf=buf):
        _read_sum[(nprog,)](buf, buf.numel(), out, BLOCK=block, num_warps=8)

    us = graph_median_us(step, 1, replays, warmup=3)
    return nbytes / us / 1e6
