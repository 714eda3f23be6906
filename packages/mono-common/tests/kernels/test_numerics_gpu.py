"""`stages.numerics.e4m3_bf16` on the GPU: its sm_90 path (FAST, integer and bf16x2 instructions)
gives torch's bf16 value of every finite e4m3fn code bit for bit (zeros and their signs,
subnormals, the largest normals), in every lane of a packed register, and reads the two NaN
codes as +-480 as its docstring says. The plain path (FAST off) is checked the same way."""

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from mono_common.stages.numerics import e4m3_bf16  # noqa: E402


@triton.jit
def _convert(w_ptr, o_ptr, N: tl.constexpr, FAST: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(o_ptr + i, e4m3_bf16(tl.load(w_ptr + i), FAST))


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "cast"])
def test_every_e4m3_code_converts_exactly(fast):
    if fast and torch.version.hip:
        pytest.fail("the fast path is sm_90 PTX; a HIP run must test fast=False only")
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    # every code in every byte position of a packed register: 4 rotations of the 256 codes
    w = torch.cat([codes.roll(r) for r in range(4)]).cuda()
    out = torch.empty(w.numel(), dtype=torch.bfloat16, device="cuda")
    _convert[(1,)](w, out, N=w.numel(), FAST=fast)
    want = w.cpu().view(torch.float8_e4m3fn).to(torch.bfloat16)
    got = out.cpu()
    finite = (w.cpu() & 0x7F) != 0x7F
    assert torch.equal(got[finite].view(torch.int16), want[finite].view(torch.int16))
    nan = ~finite
    if fast:
        assert torch.equal(got[nan].float().abs(), torch.full((int(nan.sum()),), 480.0))
    else:
        assert torch.isnan(got[nan].float()).all()
