"""kernels.capture_rows.CaptureRows on the CPU: rows handed out in order, never twice, and a
clear refusal when a capture would need more than were pinned."""

import pytest

torch = pytest.importorskip("torch")

from mono_glm53.kernels.capture_rows import CaptureRows  # noqa: E402


def test_rows_are_taken_in_order_and_hold_the_table():
    rows = CaptureRows(4, 3, pin=False)
    a = rows.take(torch.tensor([[1, 2, 3]]))
    b = rows.take(torch.tensor([[4, 5, 6], [7, 8, 9]]))
    assert a.tolist() == [[1, 2, 3]] and b.tolist() == [[4, 5, 6], [7, 8, 9]]
    assert a.data_ptr() != b.data_ptr() and rows.used == 3
    # the rows are views of the one pinned-at-build block, not copies made later
    assert b.data_ptr() == rows.rows[1].data_ptr()


def test_a_full_pool_refuses_with_what_to_do():
    rows = CaptureRows(2, 3, pin=False)
    rows.take(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"needs 1 more pointer-table rows but this kernel object has 0 of 2 left"):
        rows.take(torch.zeros(1, 3, dtype=torch.int64))


def test_a_table_of_another_width_is_refused():
    with pytest.raises(ValueError, match=r"does not fit rows of width 3"):
        CaptureRows(2, 3, pin=False).take(torch.zeros(1, 4, dtype=torch.int64))


def test_every_kernel_object_pins_its_own_rows():
    from mono_glm53.config import tiny
    from mono_glm53.kernels.layer import GlmLayerKernel
    from mono_glm53.kernels.ptable import NSLOTS
    from mono_glm53.weights import make_weights

    s = tiny()
    w = make_weights(s, device="cpu", seed=0)
    k1 = GlmLayerKernel(s, w, 2, 8, nprog=2, device="cpu", capture_rows=8)
    k2 = GlmLayerKernel(s, w, 2, 8, nprog=2, device="cpu")
    assert tuple(k1._capture_rows.rows.shape) == (8, NSLOTS.value)
    assert tuple(k2._capture_rows.rows.shape) == (512, NSLOTS.value)
    assert k1._capture_rows.rows.data_ptr() != k2._capture_rows.rows.data_ptr()
