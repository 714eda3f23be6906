"""Unit-test settings: one torch thread (the reference runs many small ops; the CPU machines
here are shared, and more threads only add contention)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
