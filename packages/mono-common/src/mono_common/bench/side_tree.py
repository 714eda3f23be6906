"""Another checkout's packages imported beside this one's, in one process, for side-by-side runs.

A benchmark that compares this tree's kernel with an earlier commit's must time both in the
same run (same weights, same read ceiling, same clocks). Both trees name their packages alike
(`mono_common`, `mono_glm53`), so the earlier tree is imported under the same names while this
tree's modules are set aside, and then set aside itself:

    side = SideTree(["/base/packages/mono-common/src", "/base/packages/mono-glm53/src"],
                    packages=("mono_common", "mono_glm53"))
    Kernel = side.attr("mono_glm53.kernels.layer", "GlmLayerKernel")
    with side:                      # the earlier tree's modules are the ones sys.modules holds
        k = Kernel(...); k.launch(...)

Objects made from the side tree keep its modules through their globals; `with side:` is needed
around every call into them that may import lazily (a function-level `from mono_glm53... import`
resolves through sys.modules). Not thread-safe: one process, one thread, as the benches run.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["SideTree"]


class SideTree:
    """The packages `packages` as found in `src_dirs`, swapped in by `with` (re-entrant)."""

    def __init__(self, src_dirs: Sequence[str], packages: Sequence[str]):
        missing = [d for d in src_dirs if not os.path.isdir(d)]
        if missing:
            raise FileNotFoundError(f"side tree source folders not found: {', '.join(missing)}")
        absent = [p for p in packages if not any(os.path.isdir(os.path.join(d, p)) for d in src_dirs)]
        if absent:
            raise FileNotFoundError(
                f"packages {', '.join(absent)} are in none of {', '.join(src_dirs)}: point at the "
                "tree's src folders (packages/<name>/src)")
        self.src_dirs = [os.path.abspath(d) for d in src_dirs]
        self.packages = tuple(packages)
        self._mods: dict[str, object] = {}  # the side tree's modules while set aside
        self._saved: list[tuple[dict[str, object], list[str]]] = []

    def _ours(self, name: str) -> bool:
        return name.split(".", 1)[0] in self.packages

    def __enter__(self) -> SideTree:
        here = {k: v for k, v in sys.modules.items() if self._ours(k)}
        for k in here:
            del sys.modules[k]
        sys.modules.update(self._mods)
        self._saved.append((here, list(sys.path)))
        sys.path[:0] = self.src_dirs
        importlib.invalidate_caches()
        return self

    def __exit__(self, *exc) -> None:
        here, path = self._saved.pop()
        self._mods = {k: v for k, v in sys.modules.items() if self._ours(k)}
        for k in self._mods:
            del sys.modules[k]
        sys.modules.update(here)
        sys.path[:] = path
        importlib.invalidate_caches()

    def module(self, name: str):
        """The side tree's module `name` (imported on first use)."""
        with self:
            mod = importlib.import_module(name)
        where = os.path.abspath(getattr(mod, "__file__", "") or "")
        if not any(where.startswith(d + os.sep) for d in self.src_dirs):
            raise ImportError(f"{name} resolved to {where}, not to the side tree {self.src_dirs}")
        return mod

    def attr(self, module: str, name: str):
        return getattr(self.module(module), name)
