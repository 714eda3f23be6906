"""The check mode's comparator: cosine, max_abs, rel and rel_l2 of an output against named bounds.

Bounds are named `<launch>.<output>.<metric>` (SGLang's `Numerics` format),
metric one of `cosine` (a floor), `max_abs`, `rel` and `rel_l2` (ceilings). A cosine is
blind to an error that scales the whole output (a wrong weight scale gives cosine 1.0), and
`rel` (max |diff| over max |expected|) sees one element; `rel_l2` = ||actual - expected|| /
||expected|| bounds the error's share of the whole output's norm, so a 1 % scale error reads
0.01 whatever the direction agrees. SGLang 0.5.23's `Numerics` accepts only cosine,
max_abs and rel, so a spec's `NUMERICS` cannot carry a rel_l2 bound: a model package keeps
those beside it and passes both to `compare`. The model
package's check harness runs SGLang's own layer beside the launch and feeds
both outputs here; every value out of bounds becomes a `Violation`, and
none is dropped. torch is imported only when tensors are compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

METRICS = ("cosine", "max_abs", "rel", "rel_l2")


@dataclass(frozen=True)
class BoundName:
    """A parsed `<launch>.<output>.<metric>` bound name."""

    launch: str
    output: str
    metric: str

    @classmethod
    def parse(cls, name: str) -> BoundName:
        parts = name.split(".")
        if len(parts) < 3 or not all(parts):
            raise ValueError(f"bound name {name!r} is not <launch>.<output>.<metric>")
        metric = parts[-1]
        if metric not in METRICS:
            raise ValueError(f"bound name {name!r}: metric {metric!r} is not one of {METRICS}")
        return cls(parts[0], ".".join(parts[1:-1]), metric)

    def __str__(self) -> str:
        return f"{self.launch}.{self.output}.{self.metric}"


@dataclass(frozen=True)
class Violation:
    """One metric outside its bound."""

    bound: str
    value: float
    limit: float

    def describe(self) -> str:
        side = ">=" if self.bound.endswith(".cosine") else "<="
        return f"{self.bound} = {self.value:.6g}, needs {side} {self.limit:.6g}"


def metrics(actual, expected) -> dict[str, float]:
    """cosine, max_abs, rel (max_abs over max |expected|) and rel_l2 (the norm of the
    difference over the norm of expected) of two tensors, in float64.

    NaN or inf anywhere in `actual` gives NaN metrics, which fail every bound.
    """
    import torch

    a = actual.detach().to(torch.float64).flatten().cpu()
    e = expected.detach().to(torch.float64).flatten().cpu()
    if a.shape != e.shape:
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    if not torch.isfinite(a).all():
        nan = float("nan")
        return {"cosine": nan, "max_abs": nan, "rel": nan, "rel_l2": nan}
    diff = (a - e).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    scale = float(e.abs().max()) if e.numel() else 0.0
    denom = float(a.norm() * e.norm())
    if denom == 0.0:
        cosine = 1.0 if float(a.norm()) == float(e.norm()) == 0.0 else 0.0
    else:
        cosine = float(torch.dot(a, e)) / denom
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    e_norm = float(e.norm())
    d_norm = float((a - e).norm())
    rel_l2 = d_norm / e_norm if e_norm > 0 else (0.0 if d_norm == 0 else float("inf"))
    return {"cosine": cosine, "max_abs": max_abs, "rel": rel, "rel_l2": rel_l2}


def _passes(metric: str, value: float, limit: float) -> bool:
    if value != value:  # NaN fails every bound
        return False
    return value >= limit if metric == "cosine" else value <= limit


def compare(launch: str, output: str, actual, expected, bounds: Mapping[str, float]) -> list[Violation]:
    """Compare one output against every bound named `<launch>.<output>.*` in `bounds`.

    Raises KeyError when no bound covers this output: an unchecked output is a bug.
    """
    wanted = {}
    for name, limit in bounds.items():
        parsed = BoundName.parse(name)
        if parsed.launch == launch and parsed.output == output:
            wanted[parsed.metric] = float(limit)
    if not wanted:
        raise KeyError(f"no bound named {launch}.{output}.<metric> in NUMERICS")
    got = metrics(actual, expected)
    return [
        Violation(f"{launch}.{output}.{m}", got[m], lim)
        for m, lim in wanted.items()
        if not _passes(m, got[m], lim)
    ]
