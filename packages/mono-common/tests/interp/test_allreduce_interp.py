"""The one-shot all-reduce + residual + RMSNorm arithmetic under the interpreter, phase by phase
(push, reduce, norm as three launches), on simulated ranks."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from mono_common import errors  # noqa: E402
from mono_common.guard_host import CLOCK_ITER, Guard  # noqa: E402
from mono_common.simulate_host import SimAllReduce, reference_allreduce_rmsnorm  # noqa: E402


def _sim(R, M, W, dtype, P=2, BLOCK_N=64, polls=50):
    g = Guard(R, device="cpu", mode="report", clock=CLOCK_ITER, deadline_s=polls / 1e6)
    return SimAllReduce(R, M, W, P=P, BLOCK_N=BLOCK_N, dtype=dtype, guard=g)


def _data(R, M, W, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    parts = torch.randn(R, M, W, generator=gen).to(dtype)
    resid = torch.randn(M, W, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(W, generator=gen)).to(dtype)
    return parts, resid, w


@pytest.mark.parametrize("R,M", [(2, 1), (4, 3), (3, 2)])
def test_fp32_sum_and_residual_bitwise_equal_to_torch(R, M):
    W = 256
    sim = _sim(R, M, W, torch.float32)
    for step in range(2):  # two epochs: both halves of the double buffer, flags never reset
        parts, resid, w = _data(R, M, W, torch.float32, seed=10 * R + step)
        ro, out = sim.run(parts, resid.expand(R, M, W).contiguous(), w, 1e-5, staged=True)
        sim.guard.check(synchronize=False)
        ref_resid, ref_out = reference_allreduce_rmsnorm(parts, resid, w, 1e-5)
        for r in range(R):
            assert torch.equal(ro[r], ref_resid), f"rank {r} step {step}: residual differs from torch"
            assert torch.equal(out[r], out[0]), f"rank {r} step {step}: output bits differ between ranks"
        torch.testing.assert_close(out[0], ref_out, rtol=1e-5, atol=1e-5)
    assert sim.flags[0].min().item() == 2 and sim.flags[0].max().item() == 2


def test_bf16_ranks_agree_and_match_torch():
    R, M, W = 4, 2, 256
    sim = _sim(R, M, W, torch.bfloat16)
    parts, resid, w = _data(R, M, W, torch.bfloat16, seed=1)
    ro, out = sim.run(parts, resid.expand(R, M, W).contiguous(), w, 1e-5, staged=True)
    sim.guard.check(synchronize=False)
    ref_resid, ref_out = reference_allreduce_rmsnorm(parts, resid, w, 1e-5)
    for r in range(1, R):
        assert torch.equal(ro[r], ro[0]) and torch.equal(out[r], out[0])
    # The interpreter converts fp32 -> bf16 by truncation (the GPU rounds to nearest), so allow
    # two bf16 ulps here; the GPU test checks bitwise equality with torch.
    torch.testing.assert_close(ro[0].float(), ref_resid.float(), rtol=2 ** -6, atol=1e-6)
    torch.testing.assert_close(out[0].float(), ref_out.float(), rtol=2 ** -6, atol=2 ** -6)


def test_negative_zero_partials_survive_the_sum():
    R, M, W = 2, 1, 64
    sim = _sim(R, M, W, torch.float32, P=1)
    parts = torch.full((R, M, W), -0.0)
    resid = torch.full((R, M, W), -0.0)
    ro, _ = sim.run(parts, resid, torch.ones(W), 1e-5, staged=True)
    ref, _ = reference_allreduce_rmsnorm(parts, resid[0], torch.ones(W), 1e-5)
    assert torch.equal(torch.signbit(ro[0]), torch.signbit(ref))


def test_missing_peer_push_times_out_names_lane_and_aborts_all_ranks():
    R, M, W = 4, 1, 128
    sim = _sim(R, M, W, torch.float32, P=1, BLOCK_N=64, polls=30)
    parts, resid, w = _data(R, M, W, torch.float32, seed=3)
    # Rank 2's only program never runs (in any phase): nobody receives its partial.
    sim.run(parts, resid.expand(R, M, W).contiguous(), w, 1e-5, staged=True, stall=(2, 0), stage=5)
    words = [errors.decode(x) for x in sim.guard.words()]
    assert words[0].code == errors.CODE_TIMEOUT
    assert (words[0].stage, words[0].program, words[0].lane, words[0].observed, words[0].expected) == (5, 0, 2, 0, 1)
    assert words[2] is None
    for r in (1, 3):
        assert words[r].code == errors.CODE_ABORTED and words[r].origin == 0
    assert sim.guard.abort[:, 0].tolist() == [1, 1, 1, 1]
    with pytest.raises(errors.MonoWaitTimeout, match="rank 0, program 0: observed 0, expected 1 \\(lane 2"):
        sim.guard.check(synchronize=False)


import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mono_common.device.allreduce import allreduce_push, allreduce_sum  # noqa: E402
from mono_common.device.epochs import epoch_begin  # noqa: E402


@triton.jit
def _sum_kernel(part_ptr, out_ptr, M, epochs_ptr, mbox_tab, flag_tab, abort_ptr, abort_tab, err_ptr,
                deadline, P: tl.constexpr, W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                R: tl.constexpr, RP2: tl.constexpr, CLOCK: tl.constexpr, PHASE: tl.constexpr):
    pid = tl.program_id(0)
    rank = pid // P
    program = pid % P
    if PHASE == 1:
        e = epoch_begin(epochs_ptr + pid)
        allreduce_push(part_ptr + rank * M * W, W, M, e, mbox_tab, flag_tab, rank, program, P,
                       W, BLOCK_N, BLOCK_M, R, RP2, False)
    else:
        e = tl.load(epochs_ptr + pid)
        allreduce_sum(out_ptr + rank * M * W, W, M, e, mbox_tab, flag_tab, abort_ptr + rank * 2, abort_tab,
                      err_ptr + rank * 16, rank, program, P, 0, deadline, W, BLOCK_N, BLOCK_M, R, RP2, R,
                      CLOCK, 0, False, tl.float32)


@pytest.mark.parametrize("R,M", [(2, 1), (3, 4)])
def test_plain_sum_is_the_rank_order_fp32_sum_on_every_rank(R, M):
    """allreduce_sum (no residual, no norm): every rank stores the fp32 sum of the pushed
    partials in rank order 0..R-1; two launches in a row use both mailbox halves. fp32
    partials: the interpreter truncates fp32 -> bf16, so the bf16 rounding is checked on the
    H200 (mono-glm53's TP tests)."""
    W, P = 128, 2
    sim = _sim(R, M, W, torch.float32, P=P, BLOCK_N=64)
    g = sim.guard
    out = torch.zeros(R, M, W, dtype=torch.float32)
    for seed in (5, 6):
        parts = torch.randn(R, M, W, generator=torch.Generator().manual_seed(seed))
        for phase in (1, 2):
            _sum_kernel[(R * P,)](parts, out, M, sim.epochs, sim.mbox_tab, sim.flag_tab, g.abort, g.abort_tab,
                                  g.errors, g.deadline, P=P, W=W, BLOCK_N=64, BLOCK_M=sim.BLOCK_M, R=R,
                                  RP2=sim.RP2, CLOCK=g.clock, PHASE=phase)
        g.check()
        acc = parts[0].float()
        for q in range(1, R):
            acc = acc + parts[q].float()
        for r in range(R):
            assert torch.equal(out[r], acc), (seed, r)
