"""Error-word layout and decoding (pure Python, no torch or triton)."""

import ast
import pathlib

import pytest

from mono_common import errors, guard_host

SRC = pathlib.Path(errors.__file__).parent / "device"


def _word(**kw):
    w = [0] * errors.NSLOTS
    w[errors.STATE] = kw.pop("state", errors.STATE_COMPLETE)
    for k, v in kw.items():
        w[getattr(errors, k.upper())] = v
    return w


def _module_ints(path, pattern_prefix):
    """Module-level `NAME = N` or `NAME = tl.constexpr(N)` ints of a device source file."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, val = node.targets[0].id, node.value
            if isinstance(val, ast.Call) and val.args:
                val = val.args[0]
            if name.startswith(pattern_prefix) and isinstance(val, ast.Constant) and isinstance(val.value, int):
                out[name] = val.value
    return out


def test_device_slots_match_host_layout():
    dev = _module_ints(SRC / "guard.py", "_")
    slots = ["STATE", "CODE", "STAGE", "RANK", "PROGRAM", "OBSERVED", "EXPECTED", "LANE", "WAITED", "ORIGIN", "STAMP", "NSLOTS"]
    assert {s: dev["_" + s] for s in slots} == {s: getattr(errors, s) for s in slots}


def test_device_clock_ids_match_host():
    dev = _module_ints(SRC / "timer.py", "CLOCK_")
    assert dev == {
        "CLOCK_GLOBALTIMER": guard_host.CLOCK_GLOBALTIMER,
        "CLOCK_MEMREALTIME": guard_host.CLOCK_MEMREALTIME,
        "CLOCK_ITER": guard_host.CLOCK_ITER,
    }


def test_empty_word_decodes_to_none():
    assert errors.decode([0] * errors.NSLOTS) is None
    errors.raise_for_words([[0] * errors.NSLOTS] * 4)  # nothing raised


def test_decode_fields_and_int32_view():
    w = errors.decode(_word(code=errors.CODE_TIMEOUT, stage=3, rank=5, program=77,
                            observed=(1 << 32) - 2, expected=0x7FFFFFFF + 1, lane=2, waited=123, origin=5,
                            stamp=1 << 40))
    assert (w.code, w.stage, w.rank, w.program, w.lane, w.waited, w.origin) == (1, 3, 5, 77, 2, 123, 5)
    assert w.stamp == 1 << 40  # the device clock when the program gave up, 64 bits
    # The device counters are int32 compared wrap-safe: show them as int32.
    assert w.observed == -2 and w.expected == -(1 << 31)
    assert w.complete


def test_short_or_corrupt_word_rejected():
    with pytest.raises(ValueError):
        errors.decode([0] * 3)
    with pytest.raises(ValueError):
        errors.decode(_word(state=7))


def test_timeout_message_names_everything():
    word = _word(code=errors.CODE_TIMEOUT, stage=4, rank=2, program=17, observed=131, expected=132, lane=0,
                 waited=200_000_000, origin=2)
    with pytest.raises(errors.MonoWaitTimeout) as ei:
        errors.raise_for_words([[0] * errors.NSLOTS, [0] * errors.NSLOTS, word], {4: "o_proj"}, 1e9)
    msg = str(ei.value)
    for part in ("stage 4 (o_proj)", "rank 2", "program 17", "observed 131", "expected 132", "0.200000 s"):
        assert part in msg
    assert ei.value.word.program == 17


def test_timeout_is_primary_over_aborted_ranks():
    aborted = _word(code=errors.CODE_ABORTED, stage=1, rank=0, program=3, observed=0, expected=1, origin=1)
    timeout = _word(code=errors.CODE_TIMEOUT, stage=1, rank=1, program=9, observed=0, expected=1, lane=3, origin=1)
    with pytest.raises(errors.MonoWaitTimeout) as ei:
        errors.raise_for_words([aborted, timeout])
    lines = str(ei.value).splitlines()
    assert lines[0].startswith("guarded wait timed out") and "rank 1" in lines[0] and "lane 3" in lines[0]
    assert "abort flag raised by rank 1" in lines[1] and "rank 0" in lines[1]


def test_only_aborted_words_raise_mono_aborted():
    aborted = _word(code=errors.CODE_ABORTED, stage=0, rank=0, program=1, origin=3)
    with pytest.raises(errors.MonoAborted, match="raised by rank 3"):
        errors.raise_for_words([aborted])


def test_claimed_but_incomplete_word_is_reported():
    w = _word(state=errors.STATE_CLAIMED, code=errors.CODE_TIMEOUT)
    with pytest.raises(errors.MonoWaitTimeout, match="claimed but not completed"):
        errors.raise_for_words([w])
