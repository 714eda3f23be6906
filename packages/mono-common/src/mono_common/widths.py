"""The widths a model's spec serves at each TP size, merged over ISAs.

  merge_widths_by_tp({isa: {tp: widths}}) -> {tp: widths served on some ISA, sorted}

A spec keeps one table per ISA (`WIDTHS_BY_TP`); the config-time refusals run before the ISA
is known (beyond what SGLang's binding checks itself), so they read the merged table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["merge_widths_by_tp"]


def merge_widths_by_tp(widths_by_tp: Mapping[str, Mapping[int, Iterable[int]]]) -> dict[int, tuple[int, ...]]:
    merged: dict[int, set[int]] = {}
    for table in widths_by_tp.values():
        for tp, widths in table.items():
            merged.setdefault(tp, set()).update(widths)
    return {tp: tuple(sorted(w)) for tp, w in merged.items()}
