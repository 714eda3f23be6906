"""A launch's weights marked streaming in the L2: the CUDA access policy window of a stream.

A decode layer streams ~90 MB of weights through a 50-60 MB L2 once a launch, so under the
L2's default policy every weight line evicts something the next launch needs again: the
kernel's own code (hundreds of KB, executed once a launch and fetched cold) and the small
activations. Marking the weights *streaming* (evicted first) keeps those instead. Triton 3.6's
pipeliner drops a load's `eviction_policy` on the `cp.async` copies that stream the weights,
so the policy is set from the host, per address range: the driver's access policy window
(`CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW`), set on the stream before a launch and restored
after; stream capture copies it into the launch's kernel node.

One window a launch: one contiguous range [base, base + nbytes), nbytes at most the device's
`CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE`. `weight_window` picks it from a layer's
tensors (address, size): the tensors below `skip` bytes (a TP rank's whole routed-expert
stacks, ~1.2 GB a GLM-5.3 TP8 rank, cannot share a window with the rest), from the lowest
address. CUDA only: `max_window_bytes` is 0 elsewhere (ROCm: no such policy is documented for
gfx950), and `streaming` then changes nothing.
"""

from __future__ import annotations

import contextlib
import ctypes

__all__ = ["weight_window", "max_window_bytes", "streaming", "WINDOW_ATTR", "STREAMING", "NORMAL"]

WINDOW_ATTR = 1  # CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW (a stream, graph-node and launch attribute)
_MAX_WINDOW_DEV_ATTR = 109  # CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE
NORMAL, STREAMING = 0, 1  # CUaccessProperty
# the routed experts' stacks and anything else this large stay out of the window
SKIP_BYTES = 256 << 20


class _Window(ctypes.Structure):
    """CUaccessPolicyWindow inside the 64-byte CUlaunchAttributeValue union."""

    _fields_ = [("base", ctypes.c_void_p), ("nbytes", ctypes.c_size_t), ("hit_ratio", ctypes.c_float),
                ("hit_prop", ctypes.c_int), ("miss_prop", ctypes.c_int), ("_pad", ctypes.c_char * 36)]


def weight_window(spans, max_bytes: int, skip: int | None = None) -> tuple[int, int]:
    """(base, nbytes) of the window over `spans` ((address, size) of a layer's weights): the
    spans under `skip` bytes (None: `SKIP_BYTES`), from the lowest address to the end of the
    highest, at most `max_bytes` (0: none; then (0, 0))."""
    skip = SKIP_BYTES if skip is None else skip
    small = [(a, n) for a, n in spans if 0 < n < skip]
    if max_bytes <= 0 or not small:
        return 0, 0
    lo = min(a for a, _ in small)
    hi = max(a + n for a, n in small)
    return lo, min(hi - lo, max_bytes)


_driver = None


def _cuda():
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def max_window_bytes(device) -> int:
    """The largest window the device takes (bytes), 0 where there is none (not CUDA, ROCm)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip or not torch.cuda.is_available():
        return 0
    v = ctypes.c_int(0)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if _cuda().cuDeviceGetAttribute(ctypes.byref(v), _MAX_WINDOW_DEV_ATTR, idx) != 0:
        return 0
    return max(0, v.value)


def _attr(call: str, stream: int, w: _Window) -> int:
    """cuStreamGetAttribute or cuStreamSetAttribute of the stream's window through w: its CUresult."""
    return getattr(_cuda(), call)(ctypes.c_void_p(stream), WINDOW_ATTR, ctypes.byref(w))


@contextlib.contextmanager
def streaming(stream: int, base: int, nbytes: int):
    """Within the block, launches on `stream` (a CUstream handle, e.g. torch's `cuda_stream`)
    see [base, base + nbytes) as streaming; the stream's window before is restored after.
    nbytes 0: nothing is set. The legacy default stream (handle 0) may refuse stream
    attributes; there the block runs without a window (a hint, not a result) where any other
    stream's refusal raises."""
    if nbytes <= 0:
        yield
        return
    before = _Window()
    rc = _attr("cuStreamGetAttribute", stream, before)
    if rc == 0:
        rc = _attr("cuStreamSetAttribute", stream, _Window(base, nbytes, 1.0, STREAMING, STREAMING))
    if rc != 0 and stream == 0:
        yield
        return
    if rc != 0:
        raise RuntimeError(f"the access policy window of stream {stream:#x} was refused: CUresult {rc}")
    try:
        yield
    finally:
        rc = _attr("cuStreamSetAttribute", stream, before)
        if rc != 0:
            raise RuntimeError(f"the access policy window of stream {stream:#x} was not restored: CUresult {rc}")
