"""The kernel's own rounding helpers are bit-exact with torch under the interpreter (its
native fp32->bf16 and fp32->fp8 casts are not: they truncate / misround)."""

import pytest
import torch
import triton
import triton.language as tl

from mono_glm53.kernels.stages import _e4m3_bits, _index_quant, _rbf


@triton.jit
def _k(x_ptr, b_ptr, q_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    tl.store(b_ptr + i, _rbf(x))
    tl.store(q_ptr + i, _e4m3_bits(x))


@triton.jit
def _kq(x_ptr, q_ptr, s_ptr, D: tl.constexpr, PLAIN: tl.constexpr):
    r = tl.program_id(0)
    d = tl.arange(0, D)
    code, s = _index_quant(tl.load(x_ptr + r * D + d), PLAIN)
    tl.store(q_ptr + r * D + d, code)
    tl.store(s_ptr + r, s)


def test_bf16_and_e4m3_rounding_match_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(8192, generator=g) * 100, torch.randn(4096, generator=g) * 1e-3,
                   torch.tensor([0.0, -0.0, 448.0, -448.0, 500.0, 2.0 ** -9, 3 * 2.0 ** -10])])
    n = 1 << (x.numel() - 1).bit_length()
    x = torch.nn.functional.pad(x, (0, n - x.numel()))
    b = torch.empty(n, dtype=torch.bfloat16)
    q = torch.empty(n, dtype=torch.int32)
    _k[(1,)](x, b, q, n)
    assert torch.equal(b, x.bfloat16())
    want = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).int()
    assert torch.equal(q & 0xFF, want)


def test_index_quant_matches_reference():
    from mono_common.ref.fp8 import act_quant, index_k_quant

    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).bfloat16().float()
    for plain in (True, False):
        q = torch.empty(16, 32, dtype=torch.int32)
        s = torch.empty(16)
        _kq[(16,)](x, q, s, 32, plain)
        rq, rs = index_k_quant(x) if plain else act_quant(x, 32, "ue8m0")
        assert torch.equal(s, rs.view(-1)), plain
        assert torch.equal((q & 0xFF).to(torch.uint8), rq.view(torch.uint8)), plain


@triton.jit
def _ktk(scores_ptr, seqlen_ptr, topk_ptr, tkh_ptr, tkc_ptr, stride, nck, W: tl.constexpr,
         TOPK: tl.constexpr, STEP: tl.constexpr):
    from mono_glm53.kernels.stages import stage_tkcount, stage_tkhist, stage_tkwrite

    pid, nprog = tl.program_id(0), tl.num_programs(0)
    if STEP < 4:
        stage_tkhist(pid, nprog, scores_ptr, stride, seqlen_ptr, tkh_ptr, nck, W, TOPK, True, STEP)
    elif STEP == 4:
        stage_tkcount(pid, nprog, scores_ptr, stride, seqlen_ptr, tkh_ptr, tkc_ptr, nck, W, TOPK, True)
    else:
        stage_tkwrite(pid, nprog, scores_ptr, stride, seqlen_ptr, tkh_ptr, tkc_ptr, topk_ptr, nck, W, TOPK, True)


def _want(v: torch.Tensor, k: int) -> list[int]:
    """Every index above the k-th largest value in index order, then the ties in index order."""
    if v.numel() <= k:
        return list(range(v.numel())) + [-1] * (k - v.numel())
    thr = v.sort(descending=True).values[k - 1]
    above = torch.nonzero(v > thr).flatten().tolist()
    ties = torch.nonzero(v == thr).flatten().tolist()
    return above + ties[: k - len(above)]


@pytest.mark.parametrize("grid", [1, 3, 64])
def test_radix_topk_selects_exactly_the_largest_with_ties_by_index(grid):
    """The top-k stages, launched one after another as the staged mode does: each row's TOPK
    largest of its first seq_len scores (above the threshold in index order, then the lowest-index
    ties); negatives, -0.0 and many ties; a row shorter than TOPK; any number of programs."""
    g = torch.Generator().manual_seed(2)
    W, L, TOPK = 4, 3000, 512
    sc = torch.randn(W, L, generator=g)
    sc[1] = torch.randint(-20, 20, (L,), generator=g).float() / 4  # heavy ties
    sc[2, :1500] = -0.0
    seq = torch.tensor([3000, 2001, 2999, 300], dtype=torch.int32)
    nck = (L + 255) // 256
    out = torch.full((W, TOPK), -7, dtype=torch.int32)
    tkh = torch.zeros(W, 4, 256, dtype=torch.int32)
    tkc = torch.zeros(W, nck, 2, dtype=torch.int32)
    for step in range(6):
        _ktk[(grid,)](sc, seq, out, tkh, tkc, sc.stride(0), nck, W, TOPK, step)
    for r in range(W):
        assert out[r].tolist() == _want(sc[r, : int(seq[r])], TOPK), r
