"""Host side of the guard: mode switch, clocks, deadlines, buffers and the check (CPU)."""

import pytest

from mono_common import errors, guard_host


def test_mode_default_env_and_invalid(monkeypatch):
    monkeypatch.delenv(guard_host.MODE_ENV, raising=False)
    assert guard_host.resolve_mode() == "fault"
    monkeypatch.setenv(guard_host.MODE_ENV, "report")
    assert guard_host.resolve_mode() == "report"
    assert guard_host.resolve_mode("fault") == "fault"
    with pytest.raises(ValueError, match="guard mode"):
        guard_host.resolve_mode("ignore")


def test_clock_for_isa(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert guard_host.clock_for_isa("sm_90") == guard_host.CLOCK_GLOBALTIMER
    assert guard_host.clock_for_isa("gfx950") == guard_host.CLOCK_MEMREALTIME
    assert guard_host.clock_for_isa(None) == guard_host.CLOCK_ITER
    assert guard_host.clock_for_isa("gfx1100") == guard_host.CLOCK_ITER
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert guard_host.clock_for_isa("sm_90") == guard_host.CLOCK_ITER


def test_deadline_ticks_per_clock():
    assert guard_host.deadline_ticks(2.0, guard_host.CLOCK_GLOBALTIMER) == 2_000_000_000
    # gfx950's s_memrealtime runs at 100 MHz.
    assert guard_host.deadline_ticks(2.0, guard_host.CLOCK_MEMREALTIME) == 200_000_000
    assert guard_host.deadline_ticks(0.5, guard_host.CLOCK_ITER) == int(0.5 * guard_host.ITER_PER_S)
    with pytest.raises(ValueError):
        guard_host.deadline_ticks(0, guard_host.CLOCK_ITER)


def test_guard_buffers_and_check_cpu(tmp_path):
    torch = pytest.importorskip("torch")
    g = guard_host.Guard(3, device="cpu", mode="report", deadline_s=1e-3, clock=guard_host.CLOCK_ITER,
                         stage_names={2: "moe"})
    assert g.fault == 0 and g.deadline == 1000
    assert g.abort.shape == (3, 2) and g.abort.dtype == torch.int32
    assert g.abort_tab.tolist() == [g.abort[r].data_ptr() for r in range(3)]
    assert g.errors.shape == (3, errors.NSLOTS)
    g.check()  # nothing written
    g.errors[1, errors.STATE] = errors.STATE_COMPLETE
    g.errors[1, errors.CODE] = errors.CODE_TIMEOUT
    g.errors[1, errors.STAGE] = 2
    g.errors[1, errors.RANK] = 1
    with pytest.raises(errors.MonoWaitTimeout, match=r"stage 2 \(moe\), rank 1"):
        g.check()
    g.reset()
    g.check()
