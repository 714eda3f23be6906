"""kernels.stamps.summarize: per-stage span, busy and hand-off times from per-program stamps."""

import pytest

from mono_glm53.kernels.stamps import summarize

NAMES = ("a", "b", "c")


def _row(start, arrive, go, end):
    # entries: [unused, start, arrive1, go1, arrive2, go2, end, unused]
    r = [0] * (2 * len(NAMES) + 2)
    r[1] = start
    for s, (a, g) in enumerate(zip(arrive, go), start=1):
        r[2 * s], r[2 * s + 1] = a, g
    r[2 * len(NAMES)] = end
    return r


def test_spans_busy_and_handoffs_of_two_programs():
    rows = [_row(0, (1000, 5000), (3000, 6000), 9000),
            _row(500, (2000, 5500), (3200, 6100), 7000)]
    out = summarize(rows, NAMES)
    assert out["a"] == pytest.approx({"span": 2.0, "busy_max": 1.5, "busy_med": 1.25})
    assert out["b"]["span"] == pytest.approx(2.5) and out["b"]["handoff"] == pytest.approx(1.0)
    assert out["b"]["busy_max"] == pytest.approx(2.3)
    assert out["c"]["handoff"] == pytest.approx(0.5) and out["c"]["span"] == pytest.approx(3.0)
    assert out["total"]["span"] == pytest.approx(9.0)


def test_ticks_are_scaled_to_microseconds():
    rows = [_row(0, (100, 200), (110, 210), 300)]
    assert summarize(rows, NAMES, ns_per_tick=10.0)["total"]["span"] == pytest.approx(3.0)


def test_unwritten_or_misshapen_stamps_are_refused():
    with pytest.raises(ValueError, match="precedes its start"):
        summarize([_row(5000, (1, 2), (3, 4), 5)], NAMES)
    with pytest.raises(ValueError, match="rows of 8 entries"):
        summarize([[0] * 7], NAMES)


def test_a_folded_hand_off_reports_no_hand_off_and_an_empty_stage():
    """A hand-off the launch did not run (`layer.folded_handoffs`: both its stamps one clock
    reading) has no hand-off entry; the others keep theirs."""
    import dataclasses

    from mono_glm53.config import tiny
    from mono_glm53.kernels.layer import folded_handoffs, make_plan

    rows = [_row(0, (1000, 5000), (1000, 6000), 9000),
            _row(500, (2000, 5500), (2000, 6100), 7000)]
    out = summarize(rows, NAMES, folded=(1,))
    assert "handoff" not in out["b"] and out["c"]["handoff"] == pytest.approx(0.5)
    plan = make_plan(tiny(), 2, True, 3)
    assert folded_handoffs(plan) == ()
    assert folded_handoffs(dataclasses.replace(plan, TKF=True)) == (6,)
