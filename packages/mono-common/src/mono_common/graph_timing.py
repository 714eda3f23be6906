"""Timing GPU work as CUDA-graph replays: capture a callable's launches once, time replays.

Graph replays leave out the host's launch cost (Triton's launcher alone takes ~100 us for a
kernel of ~130 arguments), so what is timed is the GPU's. Used by the benchmarks and timing
helpers of every package. torch is imported when called, never at import.

    g = capture(fn, launches=20, warm=1)       # fn's launches, captured on a side stream
    us = replay_us(g, 60, per=20, warmup=5)     # one time per replay, divided by `per`
    graph_median_us(fn, 20, replays=60)         # eager call, capture, median of replays
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

__all__ = ["capture", "replay_us", "graph_median_us"]


def capture(fn: Callable[[], object], launches: int = 1, warm: int = 0):
    """A CUDA graph of `launches` calls of fn, captured on a side stream that first waits for
    the current one (and runs fn `warm` times eagerly, for lazily created per-stream state);
    the current stream then waits for the capture. Returns the torch.cuda.CUDAGraph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for _ in range(warm):
            fn()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(launches):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    return g


def replay_us(g, replays: int, per: int = 1, warmup: int = 0) -> list[float]:
    """Microseconds of each of `replays` replays of g (CUDA events around each), divided by
    `per` (the launches captured in g), after `warmup` untimed replays."""
    import torch

    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / per)
    return times


def graph_median_us(fn: Callable[[], object], launches_per_graph: int = 1, replays: int = 60,
                    warmup: int = 5) -> float:
    """Median microseconds of one fn() call: one eager call (compiles, warms), then
    `launches_per_graph` calls captured in one graph, timed over `replays` replays."""
    import torch

    fn()
    torch.cuda.synchronize()
    g = capture(fn, launches_per_graph)
    return statistics.median(replay_us(g, replays, launches_per_graph, warmup))
