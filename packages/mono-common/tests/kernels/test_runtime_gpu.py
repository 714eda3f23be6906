"""The mono-common device runtime on a GPU: timeouts, faults, graph replay, delay races and the
simulated all-reduce."""

import functools
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from mono_common import errors
from mono_common.chain_host import Chain
from mono_common.guard_host import Guard
from mono_common.simulate_host import SimAllReduce, reference_allreduce_rmsnorm

# No module-level skip: the mono pytest plugin skips these (folder tests/kernels: marker gpu)
# without a GPU, and fails them under --require-gpu; a module skip would hide them from both.


@functools.cache
def _sms() -> int:
    """G of the tests: one program per SM, so every program is resident."""
    return torch.cuda.get_device_properties(0).multi_processor_count


DEADLINE = 0.2
MARGIN = 0.3  # host launch + synchronize + the abort fan-out


def _report_guard(n=1, deadline=DEADLINE):
    return Guard(n, device="cuda", mode="report", deadline_s=deadline)


# spin: every wait `guard.wait_ge_spin` (one thread's poll loop, the knob `handoff_spin` of
# mono-glm53's layer) instead of `guard.wait_ge`
SPIN = pytest.mark.parametrize("spin", [False, True], ids=["wait_ge", "spin"])


@SPIN
def test_program_that_never_arrives_stops_every_program_in_time(spin):
    G = _sms()
    warm = Chain(G, 3, guard=_report_guard(), spin=spin)
    warm.launch()
    warm.guard.check()  # compiled, and a good launch raises nothing
    c = Chain(G, 3, guard=_report_guard(), spin=spin)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    c.launch(stall=17)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    with pytest.raises(errors.MonoWaitTimeout) as ei:
        c.guard.check()
    w = ei.value.word
    assert (w.stage, w.rank, w.observed, w.expected) == (0, 0, G - 1, G)
    assert w.program != 17
    assert w.waited >= DEADLINE * 1e9  # nanoseconds of %globaltimer
    assert wall < DEADLINE + MARGIN, f"launch took {wall:.3f} s for a {DEADLINE} s deadline"
    assert wall >= DEADLINE * 0.9
    # Every program stopped in stage 0: nobody signalled stage 1.
    assert c.counter_values()[1] == 0
    print(f"\nstalled launch returned after {wall * 1e3:.1f} ms (deadline {DEADLINE * 1e3:.0f} ms)")


def test_fault_mode_kills_the_process_at_address_zero():
    G = _sms()
    child = os.path.join(os.path.dirname(__file__), "fault_child.py")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, child, str(G)], capture_output=True, text=True, env=dict(os.environ),
                       timeout=120)
    out = p.stdout + p.stderr
    assert "CHILD SURVIVED" not in out, out[-3000:]
    assert p.returncode == 3, out[-3000:]
    assert "illegal memory access" in out or "illegal address" in out, out[-3000:]
    # The word was written before the store to 0x0 and read back after the context died.
    assert "WORD: guarded wait timed out: stage 0, rank 0," in out, out[-3000:]
    assert f"observed {G - 1}, expected {G}" in out, out[-3000:]
    print(f"\nfault child died (rc {p.returncode}) in {time.perf_counter() - t0:.1f} s:\n"
          + "\n".join(x for x in out.splitlines() if x.startswith(("WORD", "CAUSE"))))


def _deadline_race(variant, launches=2000, deadline_us=30.0, jitter_us=3.0):
    child = os.path.join(os.path.dirname(__file__), "deadline_race_child.py")
    p = subprocess.run([sys.executable, child, str(launches), str(deadline_us), str(jitter_us), variant],
                       capture_output=True, text=True, env=dict(os.environ), timeout=600)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, (p.returncode, (p.stdout + p.stderr)[-3000:])
    r = json.loads(lines[-1][len("RESULT "):])
    print(f"\n{variant}: {r['launches']} launches x {r['consumers']} consumers: {r['ok']} reached, "
          f"{r['timeouts']} timed out, {len(r['disagree'])} programs split, {len(r['bad_words'])} bad words, "
          f"hang {r['hang']}, slowest launch {r['max_launch_ms']:.2f} ms")
    return p.returncode, r


def test_waits_at_the_deadline_decide_as_one_program():
    """Producers signal at the deadline +- 3 us in 132 programs x 2000 launches: in every
    consumer program all 8 warps return the same verdict, its error word agrees with it, and no
    launch hangs (each is watched for 10 s in a child process)."""
    rc, r = _deadline_race("program")
    assert rc == 0 and not r["hang"], r
    assert r["disagree"] == [], r["disagree"]
    assert r["bad_words"] == [], r["bad_words"]
    # the jitter must straddle the deadline, or the race was never run
    assert r["ok"] > 0 and r["timeouts"] > 0, r


def test_the_deadline_race_catches_a_wait_with_a_per_thread_clock():
    """The same race on mono-common 0.1.4's wait (each thread its own clock): it must show a
    split program, a wrong error word or a hang, or the test above proves nothing."""
    rc, r = _deadline_race("legacy")
    assert r["hang"] or r["disagree"] or r["bad_words"], r


@SPIN
def test_10000_graph_replays_keep_counters_without_reset(spin):
    G = _sms()
    c = Chain(G, 4, guard=_report_guard(deadline=2.0), spin=spin)
    c.launch()  # compile + first epoch outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph, stream=s):
            c.launch()
    torch.cuda.synchronize()
    n = 10_000
    for _ in range(n):
        graph.replay()
    torch.cuda.synchronize()
    c.guard.check()
    # Capture does not run the kernel: 1 eager launch + n replays.
    assert c.counter_values() == [(n + 1) * G] * 4
    bad, epochs = c.bad_and_epochs()
    assert bad == [0] * G
    assert epochs == [n + 1] * G


def _wrap32(x):
    return (x + 2 ** 31) % 2 ** 32 - 2 ** 31


def test_epoch_counters_wrap_safely():
    G = _sms()
    c = Chain(G, 2, guard=_report_guard())
    start = 2 ** 31 - 3  # epochs and counters cross the int32 wrap in the next launches
    c.epochs.fill_(_wrap32(start))
    c.counters[:, 0].fill_(_wrap32(start * G))
    for _ in range(6):
        c.launch()
    c.guard.check()
    bad, epochs = c.bad_and_epochs()
    assert bad == [0] * G
    assert epochs == [_wrap32(start + 6)] * G
    assert c.counter_values() == [_wrap32((start + 6) * G)] * 2


@SPIN
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_program_delays_change_no_chain_result(seed, spin):
    G = _sms()
    c = Chain(G, 4, guard=_report_guard(deadline=2.0), spin=spin)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for launch in range(1, 4):
        c.delays.copy_(torch.randint(0, 30_000, (G * 4,), generator=gen))  # up to 30 us, ns
        c.launch(delay=True)
        c.guard.check()
        assert c.counter_values() == [launch * G] * 4
        assert c.bad_and_epochs() == ([0] * G, [launch] * G)


def _data(R, M, W, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    parts = torch.randn(R, M, W, generator=gen).bfloat16().cuda()
    resid = torch.randn(M, W, generator=gen).bfloat16().cuda()
    w = (1 + 0.1 * torch.randn(W, generator=gen)).bfloat16().cuda()
    return parts, resid, w


def _sim(R, M, deadline=2.0):
    return SimAllReduce(R, M, 6144, P=16, BLOCK_N=128, num_warps=8, guard=_report_guard(R, deadline))


@pytest.mark.parametrize("R", [2, 4, 8])
@pytest.mark.parametrize("M", [1, 3, 8])
def test_simulated_allreduce_bitwise_on_every_rank_and_equal_to_torch(R, M):
    sim = _sim(R, M)
    for step in range(3):  # epochs 1..3: both mailbox halves, flags never reset
        parts, resid, w = _data(R, M, 6144, seed=100 * R + 10 * M + step)
        ro, out = sim.run(parts, resid.expand(R, M, 6144).contiguous(), w, 1e-5)
        sim.guard.check()
        ref_resid, ref_out = reference_allreduce_rmsnorm(parts, resid, w, 1e-5)
        for r in range(R):
            assert torch.equal(ro[r], ref_resid), f"rank {r}: residual differs from the torch fp32 sum"
            assert torch.equal(out[r], out[0]), f"rank {r}: output bits differ from rank 0"
        # rsqrt and the sum of squares round differently from torch's: one bf16 ulp.
        torch.testing.assert_close(out[0].float(), ref_out.float(), rtol=2 ** -7, atol=2 ** -7)


def test_simulated_allreduce_random_delays_change_no_bit():
    R, M = 8, 4
    parts, resid, w = _data(R, M, 6144, seed=7)
    resid_r = resid.expand(R, M, 6144).contiguous()
    base = _sim(R, M)
    ro0, out0 = [t.clone() for t in base.run(parts, resid_r, w)]
    base.guard.check()
    sim = _sim(R, M)
    gen = torch.Generator(device="cpu").manual_seed(3)
    for _ in range(4):
        sim.delays.copy_(torch.randint(0, 50_000, (R * 16,), generator=gen))
        ro, out = sim.run(parts, resid_r, w, delay=True)
        sim.guard.check()
        assert torch.equal(ro, ro0) and torch.equal(out, out0)


def test_simulated_allreduce_in_a_cuda_graph_with_fresh_inputs():
    R, M = 4, 2
    sim = _sim(R, M)
    parts, resid, w = _data(R, M, 6144, seed=11)
    resid_r = resid.expand(R, M, 6144).contiguous()
    sim.run(parts, resid_r, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        sim.run(parts, resid_r, w)
    for step in range(20):
        p2, r2, _ = _data(R, M, 6144, seed=1000 + step)
        parts.copy_(p2)
        resid_r.copy_(r2.expand(R, M, 6144))
        graph.replay()
        torch.cuda.synchronize()
        sim.guard.check()
        ref_resid, _ = reference_allreduce_rmsnorm(p2, r2, w, 1e-5)
        for r in range(R):
            assert torch.equal(sim.resid_out[r], ref_resid), f"replay {step} rank {r}"


def test_simulated_rank_that_never_arrives_stops_every_rank_in_time():
    R, M = 8, 2
    warm = _sim(R, M, deadline=DEADLINE)
    parts, resid, w = _data(R, M, 6144, seed=5)
    resid_r = resid.expand(R, M, 6144).contiguous()
    warm.run(parts, resid_r, w, stage=10)  # same constexprs: the timed launch compiles nothing
    warm.guard.check()
    sim = _sim(R, M, deadline=DEADLINE)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    sim.run(parts, resid_r, w, stall=(3, 2), stage=10)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    words = [errors.decode(x) for x in sim.guard.words()]
    assert all(wd is not None for wd in words), "every simulated rank must record why it stopped"
    origin = int(sim.guard.abort[0, 0].item()) - 1
    assert (sim.guard.abort[:, 0] == origin + 1).all(), "one origin, seen by every rank"
    first = words[origin]
    assert first.code == errors.CODE_TIMEOUT, words
    # Either a flag wait for the blocks rank 3's program 2 never pushed (stage 10, lane 3) or
    # a norm wait for its never-written sums of squares (stage 11) expired first.
    if first.stage == 10:
        assert (first.lane, first.observed, first.expected) == (3, 0, 1), first
    else:
        assert first.stage == 11 and first.observed < first.expected, first
    for wd in words:
        assert wd.code == errors.CODE_TIMEOUT or wd.origin == origin
    print("\n" + "\n".join(wd.describe() for wd in words))
    assert wall < DEADLINE + MARGIN, f"{wall:.3f} s"
    assert (sim.guard.abort[:, 0] > 0).all()
    with pytest.raises(errors.MonoWaitTimeout):
        sim.guard.check()


def test_every_warp_of_a_program_sees_the_same_epoch():
    G = _sms()
    # 8 warps a program, 200 launches: each thread stores the epoch it computed; a warp that read
    # the slot after its program's writer advanced it would hold the next launch's number.
    import triton
    import triton.language as tl

    from mono_common.device.epochs import epoch_begin

    @triton.jit
    def view(epochs_ptr, out_ptr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        e = epoch_begin(epochs_ptr + pid)
        tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), tl.zeros([BLOCK], tl.int32) + e)

    block = 2048
    epochs = torch.zeros(G, dtype=torch.int32, device="cuda")
    out = torch.zeros(G, block, dtype=torch.int32, device="cuda")
    wrong = []
    for launch in range(1, 201):
        view[(G,)](epochs, out, BLOCK=block, num_warps=8)
        got = out.eq(launch).all(dim=1)
        if not bool(got.all()):
            wrong.append((launch, int((~got).sum())))
    assert wrong == [], f"(launch, programs whose warps disagreed): {wrong[:10]}"
    assert epochs.eq(200).all()
