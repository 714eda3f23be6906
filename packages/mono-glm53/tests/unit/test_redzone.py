"""kernels.redzone.Fences: fenced buffers are zeroed views between poisoned bands, and a
write just past either end of a buffer is reported by name."""

import torch

from mono_glm53.kernels.redzone import BAND, Fences


def test_alloc_is_zeroed_aligned_and_clean():
    f = Fences()
    t = f.alloc((3, 5), torch.float32, "cpu", "a")
    assert t.shape == (3, 5) and t.dtype == torch.float32
    assert bool((t == 0).all())
    assert t.data_ptr() % 16 == 0
    t.fill_(7.0)  # writes inside the buffer are not reported
    assert f.changed() == []


def test_write_past_either_end_is_named():
    f = Fences()
    a = f.alloc((4,), torch.bfloat16, "cpu", "a")
    b = f.alloc((2, 3), torch.int32, "cpu", "b")
    base = a.untyped_storage()
    # one element after a's last and one before b's first, through the backing bytes
    raw_a = torch.tensor([], dtype=torch.uint8).set_(base)
    raw_a[BAND + a.numel() * 2] = 0
    raw_b = torch.tensor([], dtype=torch.uint8).set_(b.untyped_storage())
    raw_b[BAND - 1] = 0
    assert f.changed() == ["a (after: 1 bytes)", "b (before: 1 bytes)"]


def test_reads_past_the_end_are_nan():
    f = Fences()
    a = f.alloc((4,), torch.float32, "cpu", "a")
    raw = torch.tensor([], dtype=torch.uint8).set_(a.untyped_storage())
    past = raw[BAND + 16: BAND + 20].view(torch.float32)
    assert bool(torch.isnan(past).all())


def test_copy_and_rename():
    f = Fences()
    src = torch.arange(6, dtype=torch.int64).view(2, 3).t()  # not contiguous
    c = f.copy(src, "c")
    assert torch.equal(c, src) and c.is_contiguous()
    u = f.alloc((2,), torch.float32, "cpu")
    f.rename({u.data_ptr(): "named_later"})
    raw = torch.tensor([], dtype=torch.uint8).set_(u.untyped_storage())
    raw[0] = 1
    assert f.changed() == ["named_later (before: 1 bytes)"]
