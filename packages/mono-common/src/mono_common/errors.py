"""Error codes, the device error-word layout, and its decoding into Python exceptions.

A guarded wait that expires (or sees the abort flag) writes one error word per rank: int64
slots laid out as below. The first program of a rank to fail claims the word with a CAS
(STATE 0 -> 1), fills it, then publishes it (STATE -> 2), so the word always describes the
first failure seen on that rank. Pure Python: importable without torch or triton.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

# Slots of the error word (int64 each). The device side (mono_common.device.guard) uses
# the same numbers; a unit test pins them together.
STATE = 0
CODE = 1
STAGE = 2
RANK = 3
PROGRAM = 4
OBSERVED = 5
EXPECTED = 6
LANE = 7
WAITED = 8
ORIGIN = 9
STAMP = 10  # the device clock when the program gave up (tells ranks' stops apart in time)
NSLOTS = 16  # room to grow without changing buffer sizes

# STATE values.
STATE_EMPTY = 0
STATE_CLAIMED = 1  # a program took the word but the launch died before it was complete
STATE_COMPLETE = 2

# CODE values.
CODE_NONE = 0
CODE_TIMEOUT = 1  # this program's wait passed its deadline
CODE_ABORTED = 2  # this program saw the abort flag that another program (maybe another rank) raised

CODE_NAMES = {CODE_NONE: "none", CODE_TIMEOUT: "timeout", CODE_ABORTED: "aborted"}


class MonoDeviceError(RuntimeError):
    """A launch of a mono kernel failed stop on the device; its outputs must not be used."""

    def __init__(self, message: str, word: ErrorWord | None = None):
        super().__init__(message)
        self.word = word


class MonoWaitTimeout(MonoDeviceError):
    """A guarded wait passed its deadline: a counter never reached its target."""


class MonoAborted(MonoDeviceError):
    """Programs stopped on the abort flag, but no timeout word was found (e.g. only one rank's
    words were read)."""


@dataclasses.dataclass(frozen=True)
class ErrorWord:
    """One decoded error word."""

    code: int
    stage: int
    rank: int
    program: int
    observed: int
    expected: int
    lane: int
    waited: int  # ticks of the device clock the wait ran (poll count for the iteration clock)
    origin: int  # rank that raised the abort flag (== rank for a timeout)
    complete: bool = True
    # ticks of the device clock when the program gave up (the poll count for the iteration
    # clock): one rank's stamp minus another's is how long after it that rank stopped
    stamp: int = 0

    @property
    def code_name(self) -> str:
        return CODE_NAMES.get(self.code, f"code{self.code}")

    def describe(
        self,
        stage_names: Mapping[int, str] | None = None,
        ticks_per_s: float | None = None,
    ) -> str:
        stage = f"stage {self.stage}"
        if stage_names and self.stage in stage_names:
            stage += f" ({stage_names[self.stage]})"
        head = {
            CODE_TIMEOUT: "guarded wait timed out",
            CODE_ABORTED: f"stopped on the abort flag raised by rank {self.origin}",
        }.get(self.code, f"device error {self.code_name}")
        waited = f"{self.waited} ticks"
        if ticks_per_s:
            waited = f"{self.waited / ticks_per_s:.6f} s"
        text = (
            f"{head}: {stage}, rank {self.rank}, program {self.program}: "
            f"observed {self.observed}, expected {self.expected} "
            f"(lane {self.lane}, waited {waited})"
        )
        if not self.complete:
            text += " [word claimed but not completed: the launch died while writing it]"
        return text


def _signed32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def decode(word: Sequence[int]) -> ErrorWord | None:
    """Decode one error word (a sequence of NSLOTS ints); None when no error was written."""
    if len(word) < NSLOTS:
        raise ValueError(f"an error word has {NSLOTS} slots, got {len(word)}")
    state = int(word[STATE])
    if state == STATE_EMPTY:
        return None
    if state not in (STATE_CLAIMED, STATE_COMPLETE):
        raise ValueError(f"error word has an invalid state {state}: the buffer is corrupt")
    return ErrorWord(
        code=int(word[CODE]),
        stage=int(word[STAGE]),
        rank=int(word[RANK]),
        program=int(word[PROGRAM]),
        # Counters are int32 on the device and compared wrap-safe; show them as int32.
        observed=_signed32(int(word[OBSERVED])),
        expected=_signed32(int(word[EXPECTED])),
        lane=int(word[LANE]),
        waited=int(word[WAITED]),
        origin=int(word[ORIGIN]),
        complete=state == STATE_COMPLETE,
        stamp=int(word[STAMP]),
    )


def raise_for_words(
    words: Sequence[Sequence[int]],
    stage_names: Mapping[int, str] | None = None,
    ticks_per_s: float | None = None,
) -> None:
    """Raise for the error words of one launch (one word per rank); return if all are empty.

    A timeout is the cause and is named first; the ranks that only stopped on the abort flag
    are listed after it.
    """
    decoded = [w for w in (decode(x) for x in words) if w is not None]
    if not decoded:
        return
    timeouts = [w for w in decoded if w.code == CODE_TIMEOUT]
    primary = timeouts[0] if timeouts else decoded[0]
    lines = [primary.describe(stage_names, ticks_per_s)]
    for w in decoded:
        if w is not primary:
            lines.append("  also: " + w.describe(stage_names, ticks_per_s))
    cls = MonoWaitTimeout if timeouts else (MonoAborted if primary.code == CODE_ABORTED else MonoDeviceError)
    raise cls("\n".join(lines), primary)
