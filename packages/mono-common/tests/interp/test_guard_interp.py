"""Guarded waits, epochs and the abort protocol under the Triton interpreter.

Programs run one after another here, so only waits that are already satisfied can pass, and a
wait on a later program must time out: both are what these tests check."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mono_common import errors  # noqa: E402
from mono_common.chain_host import Chain  # noqa: E402
from mono_common.device.guard import wait_ge  # noqa: E402
from mono_common.guard_host import CLOCK_ITER, Guard  # noqa: E402


def _guard(n=1, polls=50):
    # CLOCK_ITER: the deadline is a poll count (deadline_s * ITER_PER_S).
    return Guard(n, device="cpu", mode="report", clock=CLOCK_ITER, deadline_s=polls / 1e6)


def test_satisfied_chain_advances_epochs_without_reset():
    c = Chain(1, 3, guard=_guard())
    for launch in range(1, 4):
        c.launch()
        c.guard.check()
        assert c.counter_values() == [launch] * 3
        assert c.bad_and_epochs() == ([0], [launch])


def test_wait_on_a_later_program_times_out_and_raises_abort():
    c = Chain(3, 2, guard=_guard(polls=40))
    c.launch()
    # Program 0 waits for programs 1 and 2, which have not run yet: only its own signal counted.
    with pytest.raises(errors.MonoWaitTimeout) as ei:
        c.guard.check()
    w = ei.value.word
    assert (w.code, w.stage, w.rank, w.program, w.observed, w.expected) == (errors.CODE_TIMEOUT, 0, 0, 0, 1, 3)
    assert w.waited == 40  # polls, the iteration clock's ticks
    assert c.guard.abort[0, 0].item() == 1  # rank 0 + 1
    # Programs 1 and 2 saw the flag at once and stopped in stage 0: no stage-1 signal exists.
    assert c.counter_values() == [3, 0]


def test_program_that_never_arrives_names_the_stage():
    c = Chain(2, 2, guard=_guard())
    c.launch(stall=1)
    with pytest.raises(errors.MonoWaitTimeout, match="stage 0, rank 0, program 0: observed 1, expected 2"):
        c.guard.check()


def test_abort_already_raised_stops_a_satisfiable_wait():
    g = _guard()
    g.abort[0, 0] = 3  # rank 2 raised it
    c = Chain(1, 1, guard=g)
    c.launch()
    with pytest.raises(errors.MonoAborted, match="raised by rank 2"):
        g.check()
    assert c.bad_and_epochs()[0] == [0]


@triton.jit
def _wait_kernel(cnt_ptr, target, abort_ptr, abort_tab, err_ptr, out_ptr, deadline, CLOCK: tl.constexpr):
    ok = wait_ge(cnt_ptr, target, abort_ptr, abort_tab, err_ptr, 0, 0, 5, deadline, 1, CLOCK, 0, False)
    tl.store(out_ptr, ok.to(tl.int32))


def _wrap32(x):
    return (x + 2 ** 31) % 2 ** 32 - 2 ** 31


def _wait(counter, target, polls=20):
    g = _guard(polls=polls)
    cnt = torch.tensor([_wrap32(counter)], dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    _wait_kernel[(1,)](cnt, target, g.abort[0], g.abort_tab, g.errors[0], out, g.deadline, CLOCK=g.clock)
    return int(out.item()), g


@pytest.mark.parametrize("target", [2 ** 31 + 3, _wrap32(2 ** 31 + 3)])
def test_wait_compares_modulo_2_32_whatever_the_target_width(target):
    # A target past 2**31, passed as int64 (a 64-bit epoch times nprog) or already wrapped to
    # int32, against an int32 counter that wrapped: the comparison is the counter's own width.
    # Comparing in int64 saw the wrapped counter as 2**32 behind and timed out.
    ok, g = _wait(2 ** 31 + 5, target)
    assert ok == 1
    g.check()
    ok, g = _wait(2 ** 31 + 2, target)  # one signal short
    assert ok == 0
    with pytest.raises(errors.MonoWaitTimeout) as ei:
        g.check()
    w = ei.value.word
    assert (w.observed, w.expected, w.waited) == (_wrap32(2 ** 31 + 2), _wrap32(2 ** 31 + 3), 20)
    assert w.stamp == 20  # the iteration clock's ticks at the stop: the poll count


def test_chain_runs_through_the_epoch_and_target_wraps():
    # One program (the interpreter runs programs one after another): its epoch and its targets
    # cross 2**31 in these launches.
    c = Chain(1, 2, guard=_guard())
    start = 2 ** 31 - 2
    c.epochs.fill_(_wrap32(start))
    c.counters[:, 0].fill_(_wrap32(start))
    for n in range(1, 5):
        c.launch()
        c.guard.check()
        assert c.bad_and_epochs() == ([0], [_wrap32(start + n)])
        assert c.counter_values() == [_wrap32(start + n)] * 2


@triton.jit
def _flag_kernel(cnt_ptr, flag_ptr, target, abort_ptr, abort_tab, err_ptr, out_ptr, deadline, CLOCK: tl.constexpr):
    from mono_common.device.guard import arrive_flag, wait_flag

    pid = tl.program_id(0)
    last = arrive_flag(cnt_ptr, flag_ptr, target, False)
    ok = tl.full([], 1, tl.int1)
    if last == 0:
        ok = wait_flag(flag_ptr, target, abort_ptr, abort_tab, err_ptr, 0, pid, 7, deadline, 1, CLOCK, 0, False)
    tl.store(out_ptr + 2 * pid, last.to(tl.int32))
    tl.store(out_ptr + 2 * pid + 1, ok.to(tl.int32))


def _flag(programs, counter, flag, target, polls=20, abort=0):
    g = _guard(polls=polls)
    g.abort[0, 0] = abort
    cnt = torch.tensor([_wrap32(counter), 0], dtype=torch.int32)
    fl = torch.tensor([_wrap32(flag), 0], dtype=torch.int32)
    out = torch.zeros(2 * programs, dtype=torch.int32)
    _flag_kernel[(programs,)](cnt, fl, target, g.abort[0], g.abort_tab, g.errors[0], out, g.deadline, CLOCK=g.clock)
    return out.view(programs, 2).tolist(), int(cnt[0]), int(fl[0]), g


@pytest.mark.parametrize("target", [2 ** 31 + 3, _wrap32(2 ** 31 + 3)])
def test_flag_hand_off_last_arrival_publishes_modulo_2_32(target):
    # one program short of the target (which crosses 2**31, passed wide or wrapped): this
    # program's arrival is the last, it publishes the target and does not wait
    res, cnt, fl, g = _flag(1, 2 ** 31 + 2, 2 ** 31 + 3 - 7, target)
    g.check()
    assert res == [[1, 1]] and cnt == fl == _wrap32(2 ** 31 + 3)


def test_flag_hand_off_waits_for_the_later_programs_and_names_the_stage():
    # 3 programs one after another: program 0 arrives first and waits for a flag that only
    # program 2's arrival publishes; it times out, raises the abort flag, and program 1 stops
    # on it; program 2 still arrives last and publishes
    res, cnt, fl, g = _flag(3, 0, 0, 3, polls=30)
    assert res == [[0, 0], [0, 0], [1, 1]] and cnt == fl == 3
    with pytest.raises(errors.MonoWaitTimeout) as ei:
        g.check()
    w = ei.value.word
    assert (w.code, w.stage, w.program, w.observed, w.expected, w.waited) == (errors.CODE_TIMEOUT, 7, 0, 0, 3, 30)


def test_flag_hand_off_sees_a_published_flag_and_stops_on_abort():
    # the flag already holds the target (a later arrival published it): the wait passes
    res, cnt, fl, g = _flag(1, 0, 5, 5)
    g.check()
    assert res == [[0, 1]] and cnt == 1
    # the abort flag raised by rank 1 stops a wait that cannot pass
    res, _, _, g = _flag(1, 0, 0, 5, abort=2)
    assert res == [[0, 0]]
    with pytest.raises(errors.MonoAborted, match="raised by rank 1"):
        g.check()
