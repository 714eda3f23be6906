"""The library's small stages on a GPU at GLM-5.3's shapes (one TP8 rank where a stage is
sharded), against their references computed on the CPU (a CUDA-side reference once disagreed
with the CPU's; the CPU's is the one checked against SGLang): the radix top-k of 2048 over
4096 / 65536 / 200000 keys (staged, linked in one launch, and one program a row at 4096), sparse MLA over 2048 selected
tokens (8 heads of a TP8 rank, and the 64 of TP1), biased routing, RMSNorm, RoPE and the
Hadamard rotation. Correctness only: timing is `mono bench stages`. Each check takes the device
and the sizes, so the same code runs under the interpreter at tiny sizes."""

import pytest

torch = pytest.importorskip("torch")

from mono_common.ref.mla import sparse_mla, topk_to_slots  # noqa: E402
from mono_common.ref.norm import rms_norm  # noqa: E402
from mono_common.ref.rope import apply_rope, hadamard_rotate, rope_cos_sin  # noqa: E402
from mono_common.ref.routing import biased_topk  # noqa: E402
from mono_common.ref.topk import order_keys, topk_index_order  # noqa: E402
from mono_common.stages import linked_host as LH  # noqa: E402
from mono_common.stages import small_host as H  # noqa: E402
from mono_common.testing.stage_inputs import mla_inputs  # noqa: E402

# GLM-5.3 (mono_glm53.config.REAL): index_topk 2048, 64 heads (8 a TP8 rank), kv_lora 512,
# qk_rope 64, softmax scale (192 + 64) ** -0.5, 256 experts top-8, q_lora 2048, index heads
# 32 x 128, max_position 202752, rms eps 1e-5, rope theta 10000, page 64
INDEX_TOPK = 2048
KEYS = (4096, 65536, 200000)
MLA_SCALE = 256 ** -0.5
MAX_POSITION = 202752
# bf16 P and a bf16 output, ~2^-9 relative each (the interpreter measured 2.0e-3 at real shapes)
MLA_REL_BOUND = 5e-3


def _nprog():
    return 2 * torch.cuda.get_device_properties(0).multi_processor_count  # the layer's grid


def _seqlens(rows, n, k):
    """One row of n keys, or eight of every kind: more than k keys (the radix select), exactly k,
    fewer (all of them, then -1), one."""
    if rows == 1:
        return [n]
    return [n, n - 1, n - 255, n // 2 + 7, k + 1, k, k - 1, 1][:rows]


def check_topk(dev, n, rows, k, nprog, ties, seed=0):
    g = torch.Generator().manual_seed(seed + n + rows)
    scores = torch.randn(rows, n, generator=g)
    if ties:
        scores = (scores * 8).round() / 8  # runs of equal keys at every threshold
    seqlen = torch.tensor(_seqlens(rows, n, k), dtype=torch.int32)
    want = topk_index_order(scores, seqlen, k)
    sd, ld = scores.to(dev), seqlen.to(dev)
    forms = [("staged", H.run_topk(sd, ld, k, nprog)), ("linked", LH.run_topk_linked(sd, ld, k, nprog))]
    if n <= 4096:  # one program a row (`topk_rows_one`) where the rows fit its 4096 keys
        forms.append(("row", H.run_topk(sd, ld, k, nprog, row=4096)))
        # seeded by radix pass 0 (`topk_row` HIST): packed candidates or, with ties, in place
        forms.append(("rowh", H.run_topk(sd, ld, k, nprog, row=4096, row_hist=True)))
        forms.append(("rowh-linked", LH.run_topk_linked(sd, ld, k, nprog, row=4096, hist=True)))
        # the spread form: radix pass 0, the threshold by its candidates' tiles, the write
        forms.append(("spread", H.run_topk(sd, ld, k, nprog, spread=4096)))
        forms.append(("spread-linked", LH.run_topk_linked(sd, ld, k, nprog, spread=4096)))
        # and its threshold and write as one stage (the low 16 bits one bit a step)
        forms.append(("spread-select", H.run_topk(sd, ld, k, nprog, spread=4096, select=True)))
        forms.append(("spread-select-linked", LH.run_topk_linked(sd, ld, k, nprog, spread=4096, select=True)))
    for form, got in forms:
        got = got.cpu().long()
        for m, nm in enumerate(seqlen.tolist()):
            row = got[m]
            if nm > k:
                key = order_keys(scores[m, :nm])
                thr = torch.topk(key, k).values[-1]
                # as a set: every key above the k-th, and k in all
                assert set(torch.nonzero(key > thr).flatten().tolist()) <= set(row.tolist()), (form, m)
                assert (key[row] >= thr).all() and len(set(row.tolist())) == k, (form, m)
                if (key == thr).sum() == 1:  # no tie at the k-th: the set is torch.topk's
                    assert set(row.tolist()) == set(torch.topk(scores[m, :nm], k).indices.tolist()), (form, m)
            # and in order: above the threshold in index order, then its ties in index order
            assert row.tolist() == want[m].tolist(), (form, m)


def check_mla(dev, plan, ctx, page, nprog, linked, scale=MLA_SCALE, seed=0):
    g = torch.Generator().manual_seed(seed + plan.W + plan.NH)
    q, kv, topk, req, rtt = mla_inputs(plan, ctx, page, g, short_row=plan.W - 1 if plan.W > 1 else None)
    got = LH.run_mla(plan, q.to(dev), kv.to(dev), topk.to(dev), req.to(dev), rtt.to(dev), scale, nprog,
                     linked=linked).cpu()
    ref = sparse_mla(q.double(), kv.double(), topk_to_slots(topk, req, rtt), plan.KVL, scale)
    rel = ((got.double() - ref).norm() / ref.norm()).item()
    print(f"sparse MLA W {plan.W} heads {plan.NH} {'linked' if linked else 'staged'}: rel_l2 {rel:.3e}")
    assert got.dtype == torch.bfloat16 and rel < MLA_REL_BOUND, rel


def check_routing(dev, rows, n_experts, top_k, seed=0):
    g = torch.Generator().manual_seed(seed + rows)
    logits = torch.randn(rows, n_experts, generator=g) * 2
    bias = torch.randn(n_experts, generator=g) * 0.1
    choice = torch.sort(logits.sigmoid() + bias, dim=1, descending=True).values
    # the inputs leave no near-tie at the cut, so a few ulps of sigmoid cannot change the choice
    assert (choice[:, top_k - 1] - choice[:, top_k]).min() > 1e-5
    w, used = H.run_routing(logits.to(dev), bias.to(dev), top_k)
    w, used = w.cpu(), used.cpu()
    rw, rid = biased_topk(logits, bias, top_k)
    want = torch.zeros(rows, n_experts)
    want.scatter_(1, rid.long(), rw)
    assert ((w > 0) == (want > 0)).all()
    assert torch.allclose(w, want, rtol=4e-6, atol=0), (w - want).abs().max()
    assert used.tolist() == (want > 0).any(0).int().tolist()


def check_rmsnorm(dev, rows, d, eps=1e-5, seed=0):
    g = torch.Generator().manual_seed(seed + d)
    x = (torch.randn(rows, d, generator=g) * 3).to(torch.bfloat16)
    w = (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16)
    got = H.run_rmsnorm(x.float().to(dev), w.to(dev), eps).cpu()
    want = rms_norm(x, w, eps).float()
    # one fp32 summation order (and rsqrt) against another: at most one bf16 rounding step apart
    assert ((got - want).abs() <= want.abs() * 2 ** -7).all()
    assert (got == want).float().mean() > 0.99


_CS = {}


def _cos_sin(rd, theta=10000.0):
    if rd not in _CS:
        cos, sin = rope_cos_sin(torch.arange(MAX_POSITION), rd, theta)
        _CS[rd] = cos, sin, torch.cat([cos, sin], dim=-1).contiguous()
    return _CS[rd]


def check_rope(dev, tokens, heads, rd, neox, seed=0):
    """q_pe of every head and the k_pe of each token, at positions up to the model's maximum."""
    g = torch.Generator().manual_seed(seed + tokens)
    tpos = torch.randint(0, MAX_POSITION, (tokens,), generator=g)
    tpos[0] = MAX_POSITION - 1
    pos = tpos.repeat_interleave(heads + 1)
    x = torch.randn(pos.numel(), rd, generator=g)
    cos, sin, cs = _cos_sin(rd)
    got = H.run_rope(x.to(dev), pos.to(dev), cs.to(dev), neox).cpu()
    want = apply_rope(x, cos[pos], sin[pos], interleaved=not neox)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6), (got - want).abs().max()


def check_hadamard(dev, rows, d, seed=0):
    g = torch.Generator().manual_seed(seed + rows)
    x = torch.randn(rows, d, generator=g)
    got = H.run_hadamard(x.to(dev), d ** -0.5).cpu()
    assert torch.allclose(got, hadamard_rotate(x), rtol=1e-5, atol=1e-5), (got - hadamard_rotate(x)).abs().max()


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("n", KEYS)
def test_radix_topk_on_gpu(n, rows, ties):
    check_topk("cuda", n, rows, INDEX_TOPK, _nprog(), ties)


MLA_PLANS = [LH.MlaPlan(W=1, NH=8), LH.MlaPlan(W=8, NH=8), LH.MlaPlan(W=1, NH=64),
             LH.MlaPlan(W=1, NH=8, CT=16, HOLD=True), LH.MlaPlan(W=8, NH=8, CT=32, HOLD=True)]


@pytest.mark.parametrize("linked", [False, True], ids=["staged", "linked"])
@pytest.mark.parametrize("plan", MLA_PLANS, ids=[f"w{p.W}-h{p.NH}" + (f"-hold{p.CT}" if p.HOLD else "")
                                                 for p in MLA_PLANS])
def test_sparse_mla_on_gpu(plan, linked):
    check_mla("cuda", plan, ctx=2 * INDEX_TOPK, page=64, nprog=_nprog(), linked=linked)


@pytest.mark.parametrize("rows", [1, 8])
def test_biased_routing_on_gpu(rows):
    check_routing("cuda", rows, 256, 8)


@pytest.mark.parametrize("d", [512, 2048], ids=["kv_a", "q_a"])
@pytest.mark.parametrize("rows", [1, 8])
def test_rmsnorm_on_gpu(rows, d):
    check_rmsnorm("cuda", rows, d)


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "interleaved"])
@pytest.mark.parametrize("tokens", [1, 8])
def test_rope_on_gpu(tokens, neox):
    check_rope("cuda", tokens, 8, 64, neox)


@pytest.mark.parametrize("tokens", [1, 8])
def test_hadamard_on_gpu(tokens):
    check_hadamard("cuda", tokens * 33, 128)  # 32 index heads and the index key a token
