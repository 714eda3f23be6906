"""Fenced buffers for the layer kernel's memory-safety check.

Each buffer sits between two guard bands of poison bytes (0xFF: NaN as fp32, bf16 and e4m3,
-1 as an integer). A read past a buffer's end then yields a non-finite or wrong result, and a
write past it changes a band, on any allocation layout: without fences an out-of-bounds access
lands in whatever the caching allocator put next to the buffer, which is zeros in a fresh
process and a stale neighbour in a long one.

    f = Fences()
    t = f.alloc((2, 64), torch.float32, "cuda")   # zeroed, fenced
    w = f.copy(weight, "w:o_proj")                # a fenced contiguous copy
    ...launch...
    assert not f.changed()                        # names of buffers whose bands were written
"""

from __future__ import annotations

import math

import torch

__all__ = ["BAND", "POISON", "Fences"]

BAND = 4096  # bytes each side: a multiple of every alignment the kernel assumes
POISON = 0xFF


class Fences:
    """Makes fenced tensors and checks their guard bands afterwards."""

    def __init__(self):
        self._items: list[tuple[str, torch.Tensor, int]] = []  # (name, backing bytes, payload bytes)

    def alloc(self, shape, dtype, device, name: str | None = None) -> torch.Tensor:
        """A zeroed tensor of `shape` and `dtype` between two poisoned bands."""
        shape = tuple(int(d) for d in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        # the bytes between the payload's end and the next 16-byte boundary are poison too
        padded = -(-nbytes // 16) * 16
        back = torch.full((BAND + padded + BAND,), POISON, dtype=torch.uint8, device=device)
        back[BAND: BAND + nbytes].zero_()
        self._items.append((name or f"buffer{len(self._items)}", back, nbytes))
        return back[BAND: BAND + nbytes].view(dtype).view(shape)

    def copy(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """A fenced contiguous copy of `t`."""
        out = self.alloc(t.shape, t.dtype, t.device, name)
        out.copy_(t)
        return out

    def rename(self, names: dict[int, str]) -> None:
        """Name the buffers made without a name by their payload address (`{data_ptr: name}`)."""
        self._items = [(names.get(int(b.data_ptr()) + BAND, n), b, nb) for n, b, nb in self._items]

    def changed(self) -> list[str]:
        """Buffers whose guard bands no longer hold the poison, as "name (before|after: k bytes)"."""
        bad = []
        for name, back, nbytes in self._items:
            head = back[:BAND]
            tail = back[BAND + nbytes:]
            for side, band in (("before", head), ("after", tail)):
                k = int((band != POISON).sum())
                if k:
                    bad.append(f"{name} ({side}: {k} bytes)")
        return bad
