"""GPU (H200) test of the flag hand-off (`guard.arrive_flag` / `guard.wait_flag`): one program an
SM, 4 warps each, many rounds with random per-program delays, every program's write before
its arrival read by another program after its wait. The interpreter runs programs one after
another, so only a GPU has warps that see the flag at different polls: polled on 2 lanes, each
warp left the loop on its own iteration while the deadline's clock reading holds a barrier,
and the layer kernel with `handoff_flag` hung or faulted on the H200 (session 20)."""

import functools

import pytest
import torch
import triton
import triton.language as tl

from mono_common.device.guard import arrive_flag, wait_flag
from mono_common.device.timer import now
from mono_common.guard_host import Guard

# No module-level skip: the mono pytest plugin marks tests/kernels `gpu`, skips them without a
# GPU and fails them under --require-gpu.


@functools.cache
def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


@triton.jit
def _rounds_kernel(cnt_ptr, flag_ptr, data_ptr, seen_ptr, abort_ptr, abort_tab, err_ptr, deadline, delay, seed,
                   ROUNDS: tl.constexpr, CLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for r in range(ROUNDS):
        # this round's word of this program, then a pseudo-random spin, then the hand-off
        tl.store(data_ptr + r * nprog + pid, r * 100003 + pid + seed)
        h = (pid * 1103515245 + r * 12345 + seed * 7919) & 0x7FFFFFFF
        t0 = now(CLOCK)
        while now(CLOCK) - t0 < (h % delay).to(tl.int64):
            pass
        target = (r + 1) * nprog
        last = arrive_flag(cnt_ptr, flag_ptr, target, False)
        ok = tl.full([], 1, tl.int1)
        if last == 0:
            ok = wait_flag(flag_ptr, target, abort_ptr, abort_tab, err_ptr, 0, pid, 7, deadline, 1, CLOCK, 0, False)
        # another program's word of this round, written before its arrival
        q = (pid + 1 + r) % nprog
        v = tl.load(data_ptr + r * nprog + q)
        tl.store(seen_ptr + pid * ROUNDS + r, tl.where(ok, v, -1))


@pytest.mark.parametrize("delay", [0, 3000])
def test_flag_hand_off_orders_every_programs_writes_over_many_rounds(delay):
    G, rounds, seed = _sms(), 64, 5
    g = Guard(1, device="cuda", mode="report", deadline_s=2.0)
    cnt = torch.zeros(64, dtype=torch.int32, device="cuda")
    flag = torch.zeros(64, dtype=torch.int32, device="cuda")
    data = torch.full((rounds, G), -7, dtype=torch.int32, device="cuda")
    seen = torch.zeros(G, rounds, dtype=torch.int32, device="cuda")
    _rounds_kernel[(G,)](cnt, flag, data, seen, g.abort[0], g.abort_tab, g.errors[0], g.deadline, max(delay, 1), seed,
                         ROUNDS=rounds, CLOCK=g.clock, num_warps=4)
    torch.cuda.synchronize()
    g.check()
    p = torch.arange(G, device="cuda")[:, None]
    r = torch.arange(rounds, device="cuda")[None, :]
    want = r * 100003 + (p + 1 + r) % G + seed
    assert torch.equal(seen, want.to(torch.int32))
    assert int(cnt[0]) == rounds * G and int(flag[0]) == rounds * G
