"""Checks every model package's unit tests share: a package with no spec declares no entry point.

Model packages may not import each other, so the assertions they have in
common live here.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib import metadata

PLUGIN_GROUP = "sglang.srt.plugins"


def own_entry_points(dist: str) -> list[metadata.EntryPoint]:
    """The `sglang.srt.plugins` entry points that distribution `dist` declares."""
    return [ep for ep in metadata.entry_points(group=PLUGIN_GROUP)
            if ep.dist is not None and ep.dist.metadata["Name"] == dist]


def assert_specless_package(dist: str, module_name: str, architecture: str) -> None:
    """A package without a spec: no entry point, SGLang finds no spec, light import, versions agree."""
    module = importlib.import_module(module_name)
    assert module.HAS_SPEC is False
    assert module.ARCHITECTURE == architecture
    assert own_entry_points(dist) == [], f"{dist} has no spec but declares an entry point"
    assert metadata.version(dist) == module.__version__

    from sglang.kernels.plugin_kernels.amd import spec as amd_spec

    saved = amd_spec._REGISTRY
    amd_spec._REGISTRY = {}
    try:
        for ep in metadata.entry_points(group=PLUGIN_GROUP):
            if ep.dist is not None and ep.dist.metadata["Name"].startswith("mono-"):
                ep.load()()
        for isa in ("gfx950", "sm_90"):
            found, why = amd_spec.find_spec(backend="amd", architectures=[architecture], isa=isa)
            assert found is None and why, f"SGLang found a spec for {architecture} on {isa}"
    finally:
        amd_spec._REGISTRY = saved

    code = f"import sys, {module_name}; sys.exit(1 if {{'torch','triton','sglang'}} & set(sys.modules) else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, f"importing {module_name} is not light"
