"""Where a fused launch spends its time: the per-program clock stamps of its hand-offs.

With `GlmLayerKernel.stamp` set, every program of a fused launch stores the device clock when
it starts, when it reaches each hand-off (its part of the stage before is done), when it
passes it, and when it ends (`stages.STAMP_W` entries a program). `summarize` turns one
launch's stamps into per-stage numbers; `stage_profile` replays captured fused launches (one
kernel's, or a rotation of layers as the bench times it) and summarizes their last replays. This measures the fused launch itself, so weights a stage
re-reads from L2 in the staged mode's back-to-back repeats are not flattered here.

Per stage s (from the stamps, microseconds):
  span      last program done with s - first program starting s
  busy_max  the longest one program spent in s;  busy_med  the median over programs
  handoff   (s >= 1) first program passing hand-off s - last program reaching it: the cost of
            the counter hand-off itself, after the slowest program arrived
"""

from __future__ import annotations

import statistics

__all__ = ["summarize", "stage_profile", "fused_stage_profile"]


def summarize(stamps, stage_names, ns_per_tick: float = 1.0, folded=()) -> dict[str, dict[str, float]]:
    """Per-stage span/busy/handoff (us) and "total" of one launch's stamps: a sequence of
    per-program rows of 2 * len(stage_names) + 2 clock values (`stages.STAMP_W`). `folded`:
    the hand-offs the launch did not run (`layer.folded_handoffs`), which get no "handoff"
    entry."""
    rows = [list(map(int, r)) for r in stamps]
    n = len(stage_names)
    if not rows or any(len(r) != 2 * n + 2 for r in rows):
        raise ValueError(f"stamps need rows of {2 * n + 2} entries, one row per program")
    us = ns_per_tick / 1000.0
    out: dict[str, dict[str, float]] = {}
    for s, name in enumerate(stage_names):
        go = [r[2 * s + 1] for r in rows]
        done = [r[2 * s + 2] for r in rows]
        busy = sorted(d - g for d, g in zip(done, go))
        if busy[0] < 0:
            raise ValueError(f"stage {name}: a program's end stamp precedes its start (stamps not written?)")
        st = {"span": (max(done) - min(go)) * us, "busy_max": busy[-1] * us,
              "busy_med": statistics.median(busy) * us}
        if s >= 1 and s not in folded:
            st["handoff"] = (min(go) - max(r[2 * s] for r in rows)) * us
        out[name] = st
    out["total"] = {"span": (max(r[2 * n] for r in rows) - min(r[1] for r in rows)) * us}
    return out


def stage_profile(kernels, launch, replays: int = 20, samples: int = 5) -> dict[str, dict[str, float]]:
    """Per-stage medians (span/busy/handoff, us) of the fused launches of kernel objects
    `kernels` that `launch()` runs (one kernel's launch, or a rotation of layers): stamping on
    in every kernel, `launch` captured as one graph; each of `samples` times, `replays` back-to-
    back replays, then `summarize` of every kernel's last launch; the median over samples and
    kernels. Stamping is off again after."""
    import torch

    from mono_common.graph_timing import capture
    from mono_common.guard_host import ticks_per_s
    from mono_glm53.kernels.layer import folded_handoffs
    from mono_glm53.kernels.stages import STAGE_NAMES

    for k in kernels:
        k.stamp = 1
    try:
        g = capture(launch, warm=1)
        sums = []
        for _ in range(samples):
            for _ in range(replays):
                g.replay()
            torch.cuda.synchronize()
            for k in kernels:
                k.guard.check()
                sums.append(summarize(k.stamps.cpu().tolist(), STAGE_NAMES, 1e9 / ticks_per_s(k.guard.clock),
                                      folded_handoffs(k.plan)))
        del g
    finally:
        for k in kernels:
            k.stamp = 0
    return {name: {key: statistics.median(s[name][key] for s in sums) for key in sums[0][name]}
            for name in sums[0]}


def fused_stage_profile(k, caches, replays: int = 20, samples: int = 5) -> dict[str, dict[str, float]]:
    """`stage_profile` of kernel object k's fused launch alone (its weights re-read each replay)."""
    return stage_profile([k], lambda: k.launch(caches, "fused"), replays, samples)
