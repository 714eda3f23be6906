"""mono_common.l2_window on a CUDA device: a streaming window set around a captured launch
reaches that launch's kernel node (and only it), and the stream's own window comes back after.
Whether it makes a layer faster is `mono bench glm53` (mono-glm53's knob `l2_window`)."""

import ctypes

import pytest
import torch

from mono_common import l2_window as L

# No module-level skip: the mono pytest plugin skips these (folder tests/kernels: marker gpu)
# without a GPU, and fails them under --require-gpu.


def _node_windows(g) -> list[L._Window]:
    cu = L._cuda()
    raw = ctypes.c_void_p(g.raw_cuda_graph())
    n = ctypes.c_size_t(0)
    assert cu.cuGraphGetNodes(raw, None, ctypes.byref(n)) == 0
    nodes = (ctypes.c_void_p * n.value)()
    assert cu.cuGraphGetNodes(raw, nodes, ctypes.byref(n)) == 0
    out = []
    for nd in nodes:
        kind = ctypes.c_int(-1)
        assert cu.cuGraphNodeGetType(ctypes.c_void_p(nd), ctypes.byref(kind)) == 0
        if kind.value == 0:  # CU_GRAPH_NODE_TYPE_KERNEL
            w = L._Window()
            assert cu.cuGraphKernelNodeGetAttribute(ctypes.c_void_p(nd), L.WINDOW_ATTR, ctypes.byref(w)) == 0
            out.append(w)
    return out


def test_a_captured_launch_carries_the_streaming_window_and_the_stream_gets_its_own_back():
    if torch.version.hip:
        pytest.fail("l2_window is CUDA's access policy window; this test needs a CUDA device")
    mx = L.max_window_bytes("cuda")
    assert mx > 0, "a CUDA device of compute capability 8.0 or later has an access policy window"
    x = torch.randn(1 << 20, device="cuda")
    base, nbytes = L.weight_window([(x.data_ptr(), x.numel() * 4)], mx)
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(s):
        y = x * 2  # torch's lazy per-stream state, before the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            with L.streaming(s.cuda_stream, base, nbytes):
                y = x * 2
            z = y + 1
    after = L._Window()
    assert L._cuda().cuStreamGetAttribute(ctypes.c_void_p(s.cuda_stream), L.WINDOW_ATTR, ctypes.byref(after)) == 0
    assert after.nbytes == 0, "the stream's window before (none) is restored"
    wins = _node_windows(g)
    assert len(wins) == 2
    inside, outside = wins
    assert (inside.base, inside.nbytes) == (base, nbytes)
    assert (inside.hit_prop, inside.miss_prop) == (L.STREAMING, L.STREAMING) and inside.hit_ratio == 1.0
    assert outside.nbytes == 0
    g.instantiate()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(z, x * 2 + 1, rtol=0, atol=0)
