"""The kernel's own rounding helpers are bit-exact with torch under the interpreter (its
native fp32->bf16 and fp32->fp8 casts are not: they truncate / misround)."""

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
    from mono_glm53.fp8 import act_quant, index_k_quant

    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).bfloat16().float()
    for plain in (True, False):
        q = torch.empty(16, 32, dtype=torch.int32)
        s = torch.empty(16)
        _kq[(16,)](x, q, s, 32, plain)
        rq, rs = index_k_quant(x) if plain else act_quant(x, 32, "ue8m0")
        assert torch.equal(s, rs.view(-1)), plain
        assert torch.equal((q & 0xFF).to(torch.uint8), rq.view(torch.uint8)), plain


@triton.jit
def _ktopk(scores_ptr, seqlen_ptr, topk_ptr, stride, W: tl.constexpr, TOPK: tl.constexpr, BT: tl.constexpr):
    from mono_glm53.kernels.stages import stage_topk

    stage_topk(tl.program_id(0), tl.num_programs(0), scores_ptr, stride, seqlen_ptr, topk_ptr, W, TOPK, True, BT)


def test_radix_topk_selects_exactly_the_largest_with_ties_by_index():
    """stage_topk's radix select: the TOPK largest of each row's first seq_len scores; among
    scores equal to the threshold the lowest indices; negatives, -0.0 and many ties."""
    g = torch.Generator().manual_seed(2)
    W, L, TOPK = 3, 3000, 512
    sc = torch.randn(W, L, generator=g)
    sc[1] = torch.randint(-20, 20, (L,), generator=g).float() / 4  # heavy ties
    sc[2, :1500] = -0.0
    seq = torch.tensor([3000, 2001, 2999], dtype=torch.int32)
    out = torch.full((W, TOPK), -1, dtype=torch.int32)
    _ktopk[(2,)](sc, seq, out, sc.stride(0), W, TOPK, 256)
    for r in range(W):
        n = int(seq[r])
        v = sc[r, :n]
        thr = v.sort(descending=True).values[TOPK - 1]
        want = set(torch.nonzero(v > thr).flatten().tolist())
        ties = torch.nonzero(v == thr).flatten().tolist()
        want |= set(ties[: TOPK - len(want)])
        assert set(out[r].tolist()) == want, r
