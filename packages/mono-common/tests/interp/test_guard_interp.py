"""Guarded waits, epochs and the abort protocol under the Triton interpreter.

Programs run one after another here, so only waits that are already satisfied can pass, and a
wait on a later program must time out: both are what these tests check."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from mono_common import errors  # noqa: E402
from mono_common.chain_host import Chain  # noqa: E402
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
