"""Scoped Triton code-generation switches that a kernel needs for its own compiles only.

`amd_buffer_ops(False)` turns off Triton's AMD buffer-load/store conversion while the block
runs (the launch that compiles a kernel, or a CPU compile check). A buffer op addresses
memory through a 4-register scalar descriptor per distinct base pointer; a kernel that reads
its pointers from a device table and has many of them (a persistent decoder layer) then runs
out of gfx950's ~100 scalar registers and spills. Plain global loads keep the bases in vector
registers. The switch is `triton.knobs.amd.use_buffer_ops` (Triton >= 3.4); where it does not
exist the block runs unchanged, and NVIDIA targets never read it.

The knob is global to the process, so set it around the compiling call only; a kernel must be
launched under the same setting every time (Triton specialises pointer arguments on it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["amd_buffer_ops"]

_UNSET = object()


@contextlib.contextmanager
def amd_buffer_ops(enabled: bool) -> Iterator[None]:
    """Run the block with Triton's AMD buffer ops on or off, then restore the previous value."""
    try:
        from triton import knobs
    except ImportError:  # Triton < 3.4: no knob, buffer ops are not emitted by default
        yield
        return
    amd = getattr(knobs, "amd", None)
    knob = next((vars(c)["use_buffer_ops"] for c in type(amd).__mro__ if "use_buffer_ops" in vars(c)), None)
    if knob is None:
        yield
        return
    # Setting the knob also sets its environment variable (which Triton's cache key reads):
    # restore both.
    key = getattr(knob, "key", "AMDGCN_USE_BUFFER_OPS")
    before, env_before = amd.__dict__.get("use_buffer_ops", _UNSET), os.environ.get(key)
    amd.use_buffer_ops = bool(enabled)
    try:
        yield
    finally:
        if before is _UNSET:
            amd.__dict__.pop("use_buffer_ops", None)
        else:
            amd.__dict__["use_buffer_ops"] = before
        if env_before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = env_before
