"""Logs a guard's error word as soon as a launch writes it, from a host thread.

A served step never reads the device on the host (captured graphs replay without Python), and
in `fault` mode a stopped launch kills its process at the next CUDA call: the error words
(pinned host memory the kernel writes, `mono_common.guard_host.Guard.errors`) are the only
record of which wait stopped where. `watch(guard, label)` registers a guard with one daemon
thread per process that reads the words of every registered guard every `INTERVAL_S` and logs
each newly written word once (logger.error: timeout or abort, stage, rank, program, observed,
expected), so the log of every rank of a stopped step names its stop before the process dies.
Reading pinned host memory is a plain host read: no device synchronisation, no effect on the
launches. `poll_once()` does one pass (tests).
"""

from __future__ import annotations

import logging
import threading

from mono_common import errors

logger = logging.getLogger("mono_common.guard")

INTERVAL_S = 0.01

_LOCK = threading.Lock()
_WATCHED: dict[int, tuple[object, str, set]] = {}  # id(guard) -> (guard, label, rows logged)
_THREAD: threading.Thread | None = None


def watch(guard, label: str = "mono") -> None:
    """Log `guard`'s error words when they appear (idempotent per guard)."""
    global _THREAD
    with _LOCK:
        _WATCHED.setdefault(id(guard), (guard, label, set()))
        if _THREAD is None or not _THREAD.is_alive():
            _THREAD = threading.Thread(target=_run, name="mono-guard-watch", daemon=True)
            _THREAD.start()


def poll_once() -> list[str]:
    """One pass over the registered guards: the lines logged now."""
    with _LOCK:
        entries = list(_WATCHED.values())
    lines = []
    for guard, label, logged in entries:
        for row, word in enumerate(guard.errors.tolist()):
            if row in logged or word[errors.STATE] != errors.STATE_COMPLETE:
                continue  # empty, or claimed and still being written
            logged.add(row)
            text = errors.decode(word).describe(guard.stage_names, _ticks_per_s(guard))
            lines.append(f"{label}: {text}")
            logger.error("%s: %s", label, text)
    return lines


def _ticks_per_s(guard) -> float | None:
    from mono_common.guard_host import ticks_per_s

    return ticks_per_s(guard.clock)


def _run() -> None:
    import time

    while True:
        try:
            poll_once()
        except Exception:  # noqa: BLE001 - the watcher must never take the process down
            logger.exception("mono guard watcher: reading the error words failed")
        time.sleep(INTERVAL_S)
