"""tests/interp: Triton kernels under the interpreter (CPU). TRITON_INTERPRET must be set before
triton (and any @triton.jit module) is imported, so it is set here, at the top."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

# @triton.jit decides at decoration time whether a kernel is interpreted. If another folder of
# the same pytest run imported the device modules first, they are compiled kernels: skip.
_ALREADY = [m for m in ("mono_common.device.guard", "mono_common.device.allreduce", "mono_common.stages.numerics")
            if m in sys.modules]


def _old_interpreter():
    # Triton 3.6's interpreter cannot use a runtime scalar (a kernel argument, program_id) as a
    # range() bound ("only 0-dimensional arrays can be converted"), which every runtime loop
    # here does; 3.8's can (seen on the H200's 3.6 and this venv's 3.8).
    try:
        import triton
    except ImportError:
        return None
    major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    return triton.__version__ if (major, minor) < (3, 8) else None


def pytest_collection_modifyitems(config, items):
    reason = None
    if _ALREADY:
        reason = "device modules were imported before TRITON_INTERPRET=1: run tests/interp in its own pytest process"
    elif _old_interpreter():
        reason = f"Triton {_old_interpreter()}'s interpreter cannot run runtime-bounded loops; needs Triton >= 3.8"
    if reason:
        here = os.path.dirname(__file__)
        for it in items:
            if str(it.path).startswith(here):
                it.add_marker(pytest.mark.skip(reason=reason))
