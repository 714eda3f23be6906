"""tests/compile: builds for gfx950 and sm_90 on the CPU; needs a real (non-interpreted) Triton."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TRITON_INTERPRET") == "1":
        here = os.path.dirname(__file__)
        skip = pytest.mark.skip(reason="TRITON_INTERPRET=1 is set: compile tests need the compiler (run tests/compile on its own)")
        for it in items:
            if str(it.path).startswith(here):
                it.add_marker(skip)
