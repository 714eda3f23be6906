"""GPU test of the one-thread poll hand-off (`stages.handoff.grid_handoff_spin`, a bench form,
sm_90 inline assembly): one program an SM, 4 warps each, many rounds with random per-program
delays, every program's write before its arrival read by another program's thread (not the
polling one) after the hand-off, with the poll's RMWs and with its acquire loads; and the
bench's launch of N hand-offs counts N times the grid. The interpreter cannot run the
assembly, so only a GPU checks that the barrier after thread 0's loop orders the other
threads' reads."""

import functools

import pytest
import torch
import triton
import triton.language as tl

from mono_common.device.timer import now
from mono_common.stages.handoff import grid_handoff_spin
from mono_common.stages.linked_host import launch_handoffs

# No module-level skip: the mono pytest plugin marks tests/kernels `gpu`, skips them without a
# GPU and fails them under --require-gpu.


@functools.cache
def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


@triton.jit
def _spin_rounds_kernel(bar_ptr, data_ptr, seen_ptr, delay, seed, ROUNDS: tl.constexpr, LD: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, 128)
    for r in range(ROUNDS):
        # every thread writes a word of this round, then a pseudo-random spin, then the hand-off
        tl.store(data_ptr + (r * nprog + pid) * 128 + lanes, r * 100003 + pid * 128 + lanes + seed)
        h = (pid * 1103515245 + r * 12345 + seed * 7919) & 0x7FFFFFFF
        t0 = now(0)
        while now(0) - t0 < (h % delay).to(tl.int64):
            pass
        grid_handoff_spin(bar_ptr, (r + 1) * nprog, LD)
        # every thread reads another program's words of this round (thread t: its word t)
        q = (pid + 1 + r) % nprog
        v = tl.load(data_ptr + (r * nprog + q) * 128 + lanes)
        tl.store(seen_ptr + (pid * ROUNDS + r) * 128 + lanes, v)


@pytest.mark.parametrize("ld", [False, True], ids=["rmw", "load"])
@pytest.mark.parametrize("delay", [0, 3000])
def test_spin_hand_off_orders_every_programs_writes_over_many_rounds(ld, delay):
    if torch.version.hip:
        pytest.fail("grid_handoff_spin is sm_90 inline assembly; a ROCm device cannot run it")
    G, rounds, seed = _sms(), 64, 3
    bar = torch.zeros(2, dtype=torch.int32, device="cuda")
    data = torch.full((rounds, G, 128), -7, dtype=torch.int32, device="cuda")
    seen = torch.zeros(G, rounds, 128, dtype=torch.int32, device="cuda")
    _spin_rounds_kernel[(G,)](bar, data, seen, max(delay, 1), seed, ROUNDS=rounds, LD=ld, num_warps=4,
                              launch_cooperative_grid=True)
    torch.cuda.synchronize()
    p = torch.arange(G, device="cuda")[:, None, None]
    r = torch.arange(rounds, device="cuda")[None, :, None]
    t = torch.arange(128, device="cuda")[None, None, :]
    want = r * 100003 + ((p + 1 + r) % G) * 128 + t + seed
    assert torch.equal(seen, want.to(torch.int32))
    assert bar.tolist() == [rounds * G, 0]


@pytest.mark.parametrize("ld", [False, True], ids=["rmw", "load"])
def test_spin_hand_offs_count_the_grid(ld):
    bar = torch.zeros(2, dtype=torch.int32, device="cuda")
    nprog = 2 * _sms()
    launch_handoffs(bar, 50, nprog, spin=True, ld=ld)
    assert bar.tolist() == [50 * nprog, 0]
