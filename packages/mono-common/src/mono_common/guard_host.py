"""Host side of the guarded waits: buffers, the fault/report mode switch, the check after a launch.

`Guard` owns, for R ranks simulated or real, the abort flags (device memory, polled by every
wait), the table of their addresses, and the error words (host-visible: pinned host memory that
the kernel writes through the unified address space). Pinned host memory stays readable
after a fault has killed the CUDA context, so even in `fault` mode `check()` names the
failed wait before the process dies.

Modes:
  fault  (serving default) the failing program writes the error word, raises the abort flag
         and stores to 0x0: the process dies and SGLang stops every rank. No token of the
         failed step can reach a client.
  report (tests, check mode) every program returns; `check()` after the launch decodes the
         error words and raises MonoWaitTimeout naming stage, rank, program, observed and
         expected.
Torch is imported lazily so `import mono_common.guard_host` stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mono_common import errors

MODES = ("fault", "report")
DEFAULT_MODE = "fault"
MODE_ENV = "MONO_GUARD_MODE"  # overrides the default mode (tests and check mode set "report")

# Clock ids: the same numbers as mono_common.device.timer.
CLOCK_GLOBALTIMER = 0
CLOCK_MEMREALTIME = 1
CLOCK_ITER = 2
TICKS_PER_S = {CLOCK_GLOBALTIMER: 1e9, CLOCK_MEMREALTIME: 1e8}
# Calibrated bound for CLOCK_ITER: polls per second. An acquire atomic round trip to L2 takes
# about 1 us on the H200 (a 132-program barrier costs 0.97 us, facts.md), so one million polls
# is roughly a second; a poll is never faster than that, so the deadline is never shorter.
ITER_PER_S = 1.0e6


def resolve_mode(mode: str | None = None) -> str:
    mode = mode or os.environ.get(MODE_ENV) or DEFAULT_MODE
    if mode not in MODES:
        raise ValueError(f"guard mode must be one of {MODES}, got {mode!r}")
    return mode


def clock_for_isa(isa: str | None) -> int:
    """The device clock guarded waits use on `isa` ("sm_90", "gfx950", ...; None: no clock)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or not isa:
        return CLOCK_ITER
    if isa.startswith("sm_"):
        return CLOCK_GLOBALTIMER
    if isa.startswith("gfx9"):
        return CLOCK_MEMREALTIME
    return CLOCK_ITER


def ticks_per_s(clock: int) -> float:
    return TICKS_PER_S.get(clock, ITER_PER_S)


def deadline_ticks(deadline_s: float, clock: int) -> int:
    """`deadline_s` (BuildContext.deadline_s) in ticks of `clock`."""
    if not deadline_s > 0:
        raise ValueError(f"deadline_s must be positive, got {deadline_s!r}")
    return max(1, int(deadline_s * ticks_per_s(clock)))


def current_isa() -> str | None:
    """ISA of the current torch device ("sm_90", "gfx950"), None without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if getattr(torch.version, "hip", None):
        return props.gcnArchName.split(":")[0]
    return f"sm_{props.major}{props.minor}"


class Guard:
    """Abort flags and error words for `nranks` ranks (1 on a plain single-GPU launch).

    Kernel arguments: `abort` (int32 [nranks, 2]), `abort_tab` (int64 [nranks] addresses),
    `errors` (int64 [nranks, NSLOTS]), `deadline` (ticks), and the constexprs `clock`, `fault`.

    `abort=(flag, table)`: the guard of ONE rank of a world whose ranks are separate processes:
    `flag` is this rank's int32 [2] abort flag in a peer region every rank's programs reach and
    `table` the int64 [nranks] device table of every rank's flag (mono_common.peer.abort_args),
    so one rank's expired wait raises the flag of every rank. `abort` is then [1, 2] (this
    rank's), `errors` [1, NSLOTS] (its own word), and `args(rank)` gives them for its rank.
    """

    def __init__(
        self,
        nranks: int = 1,
        *,
        device=None,
        mode: str | None = None,
        deadline_s: float = 2.0,
        clock: int | None = None,
        stage_names: Mapping[int, str] | None = None,
        abort=None,
    ):
        import torch

        self.nranks = nranks
        self.mode = resolve_mode(mode)
        self.fault = 1 if self.mode == "fault" else 0
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        on_gpu = self.device.type == "cuda"
        if clock is None:
            clock = clock_for_isa(current_isa() if on_gpu else None)
        self.clock = clock
        self.deadline_s = deadline_s
        self.deadline = deadline_ticks(deadline_s, clock)
        self.stage_names = dict(stage_names or {})
        self.peer_abort = abort is not None
        if self.peer_abort:
            flag, self.abort_tab = abort
            self.abort = flag.view(torch.int32)[:2].view(1, 2)
        else:
            self.abort = torch.zeros(nranks, 2, dtype=torch.int32, device=self.device)
            self.abort_tab = torch.tensor(
                [self.abort[r].data_ptr() for r in range(nranks)], dtype=torch.int64, device=self.device
            )
        rows = 1 if self.peer_abort else nranks
        if on_gpu:
            self.errors = torch.zeros(rows, errors.NSLOTS, dtype=torch.int64, pin_memory=True)
        else:
            self.errors = torch.zeros(rows, errors.NSLOTS, dtype=torch.int64)

    def args(self, rank: int = 0):
        """(abort, abort_tab, errors) views for one rank of a plain launch."""
        row = 0 if self.peer_abort else rank
        return self.abort[row], self.abort_tab, self.errors[row]

    def words(self):
        return [list(map(int, w)) for w in self.errors.tolist()]

    def check(self, synchronize: bool = True) -> None:
        """Raise MonoWaitTimeout (or MonoAborted) if any rank wrote an error word."""
        if synchronize and self.device.type == "cuda":
            import torch

            try:
                torch.cuda.synchronize(self.device)
            except RuntimeError as cuda_error:
                # A `fault` launch died at 0x0 after writing its word. The words are pinned host
                # RAM, still readable with the CUDA context gone: name the cause, then die.
                try:
                    errors.raise_for_words(self.words(), self.stage_names, ticks_per_s(self.clock))
                except errors.MonoDeviceError as device_error:
                    raise device_error from cuda_error
                raise
        errors.raise_for_words(self.words(), self.stage_names, ticks_per_s(self.clock))

    def reset(self) -> None:
        """Clear flags and words after a reported failure (never needed between good steps)."""
        self.abort.zero_()
        self.errors.zero_()
