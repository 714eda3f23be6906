"""`code_prefetch` on an NVIDIA GPU: the address a kernel reads for its own entry name is where
its code is (the words loaded there are the cubin's `.text` of the entry), and requesting its
code lines into the L2 from every program runs and changes nothing the kernel computes. The
timing of what it saves is `bench/code_fetch.py --self`."""

import pytest

torch = pytest.importorskip("torch")

from mono_common.stages.code_prefetch import code_read_entry, text_of  # noqa: E402


@pytest.mark.parametrize("on", [False, True])
def test_a_kernel_reads_its_own_code_at_its_entry_address(on):
    if torch.version.hip:
        pytest.fail("code_prefetch is sm_90's (a kernel's code address through PTX); not built on ROCm")
    out = torch.zeros(5, dtype=torch.int64, device="cuda")
    ck = code_read_entry[(1,)](out, 0, ON=on)
    nbytes = len(text_of(ck.asm["cubin"], "code_read_entry"))
    assert nbytes > 0
    out.zero_()
    grid = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    code_read_entry[(grid,)](out, nbytes, ON=on)
    torch.cuda.synchronize()
    text = text_of(ck.asm["cubin"], "code_read_entry")
    assert int(out[0]) != 0
    assert out[1:5].cpu().numpy().tobytes() == text[:32]
