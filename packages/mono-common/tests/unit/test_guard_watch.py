"""The guard watcher logs an error word once, as soon as a launch has written it."""

import logging

import pytest

from mono_common import errors, guard_watch


def _word(code, stage, rank, program, origin, state=errors.STATE_COMPLETE):
    w = [0] * errors.NSLOTS
    w[errors.STATE], w[errors.CODE], w[errors.STAGE] = state, code, stage
    w[errors.RANK], w[errors.PROGRAM], w[errors.ORIGIN] = rank, program, origin
    w[errors.OBSERVED], w[errors.EXPECTED] = 3, 4
    return w


def test_a_written_word_is_logged_once_with_rank_stage_and_program(caplog, monkeypatch):
    torch = pytest.importorskip("torch")
    from mono_common.guard_host import Guard

    monkeypatch.setattr(guard_watch, "_WATCHED", {})
    monkeypatch.setattr(guard_watch, "_run", lambda: None)  # no thread: passes run by hand
    g = Guard(1, device="cpu", mode="report", deadline_s=1.0, stage_names={12: "mla"})
    guard_watch.watch(g, "mono-glm53 TP rank 1 of 2")
    guard_watch.watch(g, "again")  # one registration per guard
    assert guard_watch.poll_once() == []  # nothing written yet
    g.errors[0] = torch.tensor(_word(errors.CODE_TIMEOUT, 12, 1, 5, 1, state=errors.STATE_CLAIMED))
    assert guard_watch.poll_once() == []  # claimed, still being written
    g.errors[0] = torch.tensor(_word(errors.CODE_TIMEOUT, 12, 1, 5, 1))
    with caplog.at_level(logging.ERROR, logger="mono_common.guard"):
        lines = guard_watch.poll_once()
    assert len(lines) == 1 and lines[0].startswith("mono-glm53 TP rank 1 of 2: guarded wait timed out")
    assert "stage 12 (mla), rank 1, program 5" in lines[0]
    assert lines[0] in caplog.text
    assert guard_watch.poll_once() == []  # logged once


def test_a_rank_stopped_by_another_names_the_origin(monkeypatch):
    torch = pytest.importorskip("torch")
    from mono_common.guard_host import Guard

    monkeypatch.setattr(guard_watch, "_WATCHED", {})
    monkeypatch.setattr(guard_watch, "_run", lambda: None)
    g = Guard(2, device="cpu", mode="report", deadline_s=1.0)
    guard_watch.watch(g, "rank 0")
    g.errors[0] = torch.tensor(_word(errors.CODE_ABORTED, 16, 0, 7, 1))
    (line,) = guard_watch.poll_once()
    assert "stopped on the abort flag raised by rank 1: stage 16, rank 0, program 7" in line
