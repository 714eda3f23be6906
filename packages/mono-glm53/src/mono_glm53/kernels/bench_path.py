"""The monokernel path for `mono bench glm53`: `register()` adds "mono" to `bench.PATHS`.

The builder picks the smallest built width (2, 4, 8) that holds the case's rows, builds the
kernel on the case's weights (read in place) and returns the fused launch as a zero-argument,
graph-capturable step, with `check()` (the kernel's guard) and `profile(steps)`: the per-stage
spans of a rotation of such steps (`rotation_profile`). `mono_glm53.bench.main` registers it
itself on a GPU; another caller of the bench's PATHS calls `register()` first.

`side_builder(tree)`: the same path for another checkout's kernel (`tree`: a folder holding
its packages/mono-common/src and packages/mono-glm53/src, such as a `git archive` of an
earlier commit), imported beside this one (`mono_common.bench.side_tree`) so both are timed in
one run on the same weights; its steps stamp no stages (earlier kernels may have no stamps).
`knob_builder(knobs)`: the "mono" path with `GlmLayerKernel` measurement knobs (`--knobs`);
`output_digest(step, rows)`: what the bench compares the paths' outputs by.
"""

from __future__ import annotations

import contextlib

WIDTHS = (2, 4, 8)


def built_width(rows: int) -> int:
    for w in WIDTHS:
        if rows <= w:
            return w
    raise ValueError(f"{rows} rows exceed the widest build ({WIDTHS[-1]})")


def _fused_step(kernel_cls, case, scope=contextlib.nullcontext):
    """(step, kernel): `kernel_cls` built on `case` at its built width, and its fused launch as a
    zero-argument step, compiled once here (outside any capture). `scope()`: the context every
    call into the kernel runs in (a side tree's, whose launch imports its own stages lazily)."""
    with scope():
        k = kernel_cls(case.shape, case.weights, built_width(case.width),
                       max_seq_len=case.inputs.max_seq_len, indexer=True)
        k.set_inputs(case.hidden, case.residual, case.inputs)

    def step():
        with scope():
            return k.launch(case.caches, mode="fused")

    step()
    return step, k


def build_mono(case):
    return knob_builder({})(case)


def knob_builder(knobs: dict):
    """The "mono" path's builder with the kernel's measurement knobs (`layer.KNOBS` by name;
    the kernel refuses unknown names and out-of-range values)."""
    def build(case):
        import functools

        from mono_glm53.kernels.layer import GlmLayerKernel

        step, k = _fused_step(functools.partial(GlmLayerKernel, **knobs), case)
        # The bench calls this after timing: in report mode an expired wait raises here instead
        # of the timed numbers passing silently.
        step.check = k.guard.check
        step.kernel = k
        step.profile = rotation_profile
        # the rotation's next layer (`bench._chain`): its weights are what a launch with the
        # next_layer_prefetch knob requests ahead, as a served step's next layer
        step.chain = lambda nxt: setattr(k, "next_weights", nxt.kernel.w if hasattr(nxt, "kernel") else None)
        return step

    return build


def output_digest(step, rows: int) -> str:
    """A digest of the outputs (hidden, residual, top-k) of `step`'s kernel's real rows after its
    last launch: equal digests across paths on the same case mean the same bits."""
    import hashlib

    import torch

    k = step.kernel
    h = hashlib.sha256()
    for t in (k.out, k.res_out, k.topk):
        h.update(t[:rows].detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def side_builder(tree: str):
    """A path builder for the kernel of the checkout at `tree` (see the module docstring)."""
    import os

    from mono_common.bench.side_tree import SideTree

    side = SideTree([os.path.join(tree, "packages", "mono-common", "src"),
                     os.path.join(tree, "packages", "mono-glm53", "src")],
                    packages=("mono_common", "mono_glm53"))
    kernel_cls = side.attr("mono_glm53.kernels.layer", "GlmLayerKernel")

    def build(case):
        step, k = _fused_step(kernel_cls, case, scope=lambda: side)
        if hasattr(getattr(k, "guard", None), "check"):
            step.check = k.guard.check
        return step

    return build


def rotation_profile(steps, replays: int = 10, samples: int = 5) -> dict[str, float]:
    """Each stage's in-kernel span (us; "total": the launch) of a rotation of mono steps as the
    bench times it (`kernels.stamps.stage_profile` over every layer's kernel)."""
    from mono_glm53.kernels.stamps import stage_profile

    prof = stage_profile([s.kernel for s in steps], lambda: [s() for s in steps], replays, samples)
    return {name: v["span"] for name, v in prof.items()}


def register() -> None:
    from mono_glm53.bench import register_path

    register_path("mono", build_mono)
