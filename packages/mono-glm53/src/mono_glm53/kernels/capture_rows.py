"""Pinned host rows for the pointer tables that a CUDA-graph capture builds.

A table first needed while a graph is being captured is copied to the GPU by a captured async
copy, which must read pinned host memory that outlives the graph. Pinning inside the capture is
what fails: torch's pinned allocator queries CUDA events (or allocates) there, which a capture in
CUDA's global mode (SGLang's) refuses. So each kernel object pins its rows up front and hands
them out, never reusing one (a captured graph may replay any of them)."""

from __future__ import annotations

import torch


class CaptureRows:
    """`capacity` int64 rows of `width` entries, pinned when built (on a CUDA device object;
    plain host memory for a CPU one), taken in order by `take`."""

    def __init__(self, capacity: int, width: int, pin: bool):
        self.rows = torch.zeros(capacity, width, dtype=torch.int64, pin_memory=pin)
        self.used = 0

    def take(self, host: torch.Tensor) -> torch.Tensor:
        """The next host.shape[0] rows, holding a copy of `host` (int64 [n, width])."""
        n = host.shape[0]
        cap, width = self.rows.shape
        if host.dim() != 2 or host.shape[1] != width:
            raise ValueError(f"a table of shape {tuple(host.shape)} does not fit rows of width {width}")
        if self.used + n > cap:
            raise ValueError(
                f"graph capture needs {n} more pointer-table rows but this kernel object has "
                f"{cap - self.used} of {cap} left: launch each layer once eagerly with the caches "
                f"it will be captured with (SGLang's warm-up does) before capturing, or build the "
                f"object with a larger capture_rows")
        out = self.rows[self.used:self.used + n]
        out.copy_(host)
        self.used += n
        return out
