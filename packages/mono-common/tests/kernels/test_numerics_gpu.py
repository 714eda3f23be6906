"""`stages.numerics.e4m3_bf16` on the GPU: its sm_90 path (FAST, integer and bf16x2 instructions)
gives torch's bf16 value of every finite e4m3fn code bit for bit (zeros and their signs,
subnormals, the largest normals), in every lane of a packed register, and reads the two NaN
codes as +-480 as its docstring says. The plain path (FAST off) is checked the same way.
`e4m3_bits` (fp32 -> e4m3fn code), both forms (HW: sm_90's conversion unit), gives torch's
clamp-then-cast code at every rounding boundary, past saturation and over random values."""

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from mono_common.stages.numerics import e4m3_bf16, e4m3_bits  # noqa: E402


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


@triton.jit
def _e4m3_codes(x_ptr, o_ptr, N: tl.constexpr, HW: tl.constexpr):
    i = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(o_ptr + i, e4m3_bits(tl.load(x_ptr + i), HW))


def _e4m3_probe_values():
    """fp32 values around every e4m3fn rounding boundary (each midpoint between neighbouring
    codes, one ulp either side, and the codes themselves), past the saturation point, and
    random values over the whole exponent range, with both signs."""
    vals = torch.arange(0, 127, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (vals[:-1] + vals[1:]) / 2  # exact in fp32
    mids = torch.cat([mids, torch.tensor([464.0])])  # between 448 and the next would-be value
    near = torch.cat([mids, vals, torch.tensor([448.0, 449.0, 480.0, 1e4, 3.4e38, 1e-30, 2.0 ** -10, 2.0 ** -9])])
    bits = near.view(torch.int32)
    around = torch.cat([bits - 1, bits, bits + 1]).view(torch.float32)
    around = around[torch.isfinite(around)]  # 0's bits - 1 is a NaN: activations hold none
    gen = torch.Generator().manual_seed(0)
    rnd = torch.randn(1 << 18, generator=gen) * torch.exp2(torch.randint(-20, 12, (1 << 18,), generator=gen).float())
    x = torch.cat([around, rnd])
    x = torch.cat([x, -x])
    return torch.cat([x, torch.zeros(-x.numel() % 1024)])


@pytest.mark.parametrize("hw", [True, False], ids=["hw", "int"])
def test_e4m3_bits_rounds_as_torch_clamp_then_cast(hw):
    if hw and torch.version.hip:
        pytest.fail("the HW path is the sm_90 conversion; a HIP run must test hw=False only")
    x = _e4m3_probe_values()
    out = torch.empty(x.numel(), dtype=torch.int32, device="cuda")
    _e4m3_codes[(x.numel() // 1024,)](x.cuda(), out, N=1024, HW=hw)
    want = x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32)
    got = out.cpu()
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, [(x[i].item(), got[i].item(), want[i].item()) for i in bad[:8]]
