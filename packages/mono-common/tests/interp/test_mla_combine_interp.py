"""stages.mla's combine read in place by a consumer (`mla_combined_cols`) under the interpreter:
the bits `mla_combine` writes, each row's value from its own chunks, pad rows 0."""

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from mono_common.stages.mla import mla_combine, mla_combined_cols  # noqa: E402


@triton.jit
def _combine_entry(part_ptr, ml_ptr, attn_ptr, W: tl.constexpr, NH: tl.constexpr, KVL: tl.constexpr,
                   TOPK: tl.constexpr, CT: tl.constexpr, VEC: tl.constexpr = False):
    mla_combine(tl.program_id(0), tl.num_programs(0), part_ptr, ml_ptr, attn_ptr, W, NH, KVL, TOPK, CT, VEC)


@triton.jit
def _cols_entry(part_ptr, ml_ptr, out_ptr, W: tl.constexpr, BM: tl.constexpr, NH: tl.constexpr,
                KVL: tl.constexpr, NCH: tl.constexpr, BK: tl.constexpr):
    # a program a (head, column block), as the value projection's tiles read it
    h = tl.program_id(0) // (KVL // BK)
    d0 = (tl.program_id(0) % (KVL // BK)) * BK
    rows = tl.arange(0, BM)
    rmask = rows < W
    v = mla_combined_cols(part_ptr, ml_ptr, rows, rmask, h, d0, NH, KVL, NCH, BK)
    dc = tl.arange(0, BK)
    tl.store(out_ptr + (rows[:, None] * NH + h) * KVL + d0 + dc[None, :], v)


def test_combined_columns_are_the_combine_stages_bits():
    W, BM, NH, KVL, TOPK, CT, BK = 3, 4, 3, 128, 64, 16, 64
    nch = TOPK // CT
    g = torch.Generator().manual_seed(5)
    part = torch.randn(W, NH, nch, KVL, generator=g) * 4
    ml = torch.stack([torch.randn(W, NH, nch, generator=g) * 3,
                      torch.rand(W, NH, nch, generator=g) * 5 + 0.1], -1).contiguous()
    attn = torch.zeros(W, NH, KVL, dtype=torch.bfloat16)
    _combine_entry[(5,)](part, ml, attn, W, NH, KVL, TOPK, CT)
    out = torch.full((BM, NH, KVL), float("nan"))
    _cols_entry[(NH * KVL // BK,)](part, ml, out, W, BM, NH, KVL, nch, BK)
    assert torch.equal(out[:W], attn.float())
    assert (out[W:] == 0).all()
    # and both are the combine: sum_c exp(m_c - M) part_c / sum_c exp(m_c - M) l_c
    e = torch.exp(ml[..., 0].double() - ml[..., 0].double().amax(-1, keepdim=True))
    want = (e[..., None] * part.double()).sum(2) / (e * ml[..., 1].double()).sum(-1)[..., None]
    assert torch.allclose(out[:W].double(), want, rtol=2 ** -8, atol=0)


def test_vector_combine_is_the_combine_in_its_own_order():
    """VEC: a tile's chunks as one [NCH, DC] load and block reductions: the combine within a
    bf16 step of the chunk-order form (another summation order of the same terms), every
    value written, with 8 and 32 chunks."""
    for W, NH, KVL, TOPK, CT in ((3, 3, 128, 64, 8), (2, 2, 64, 2048, 64)):
        nch = TOPK // CT
        g = torch.Generator().manual_seed(nch)
        part = torch.randn(W, NH, nch, KVL, generator=g) * 4
        ml = torch.stack([torch.randn(W, NH, nch, generator=g) * 3,
                          torch.rand(W, NH, nch, generator=g) * 5 + 0.1], -1).contiguous()
        got = {}
        for vec in (False, True):
            got[vec] = torch.full((W, NH, KVL), float("nan"), dtype=torch.bfloat16)
            _combine_entry[(5,)](part, ml, got[vec], W, NH, KVL, TOPK, CT, vec)
        assert not torch.isnan(got[True].float()).any()
        # a bf16 value moves by at most one step (2^-7 of it) with the fp32 sums' order
        assert torch.allclose(got[True].float(), got[False].float(), rtol=2 ** -7, atol=0)
        e = torch.exp(ml[..., 0].double() - ml[..., 0].double().amax(-1, keepdim=True))
        want = (e[..., None] * part.double()).sum(2) / (e * ml[..., 1].double()).sum(-1)[..., None]
        assert torch.allclose(got[True].double(), want, rtol=2 ** -8, atol=0)
