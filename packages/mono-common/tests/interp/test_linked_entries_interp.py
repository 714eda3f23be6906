"""The linked entries (stages.linked_entries) under the interpreter: sparse MLA staged and linked
against its reference, the six top-k stages in one launch over two score sets (the tkh slices
they zero for each other) against the index-order reference, and the hand-off counter. A
linked launch runs on ONE program here: the interpreter runs programs one after another, so a
hand-off between two of them would never complete."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from mono_common.ref.mla import sparse_mla, topk_to_slots  # noqa: E402
from mono_common.ref.topk import topk_index_order  # noqa: E402
from mono_common.stages import linked_host as LH  # noqa: E402


def mla_inputs(plan, ctx, page, gen, short_row=None):
    """qabs (bf16 values), a paged cache of W requests x ctx tokens in shuffled pages, and
    each row's TOPK distinct positions in index order (short_row: that row has fewer than TOPK
    tokens and selects them all, then -1)."""
    W, D = plan.W, plan.KVL + plan.RD
    q = torch.randn(W, plan.NH, D, generator=gen).bfloat16().float()
    kv = torch.randn(W * ctx, D, generator=gen).bfloat16()
    pages = torch.randperm(W * ctx // page, generator=gen).view(W, ctx // page)
    rtt = (pages[:, :, None] * page + torch.arange(page)).reshape(W, ctx).int()
    topk = torch.stack([torch.randperm(ctx, generator=gen)[:plan.TOPK].sort().values for _ in range(W)]).int()
    if short_row is not None:
        n = plan.TOPK // 2 + 3
        topk[short_row] = torch.where(torch.arange(plan.TOPK) < n, torch.arange(plan.TOPK), -1).int()
    req = torch.arange(W, dtype=torch.int64)
    return q, kv, topk, req, rtt


def mla_rel_err(plan, got, q, kv, topk, req, rtt, scale):
    ref = sparse_mla(q.double(), kv.double(), topk_to_slots(topk, req, rtt), plan.KVL, scale)
    return ((got.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("linked", [False, True], ids=["staged", "linked"])
def test_sparse_mla_matches_the_reference(linked):
    plan = LH.MlaPlan(W=3, NH=20, KVL=128, RD=64, TOPK=64, CT=16, HG=16)
    g = torch.Generator().manual_seed(7)
    q, kv, topk, req, rtt = mla_inputs(plan, 96, 16, g, short_row=1)
    got = LH.run_mla(plan, q, kv, topk, req, rtt, 0.06, nprog=1 if linked else 3, linked=linked)
    # bf16 P and bf16 output: ~2^-9 relative each
    assert mla_rel_err(plan, got, q, kv, topk, req, rtt, 0.06) < 4e-3


def test_linked_topk_over_two_sets_matches_the_reference():
    k, rows, n = 128, 3, 700
    g = torch.Generator().manual_seed(11)
    scores = torch.randn(2, rows, n, generator=g)
    scores[1, 0] = (scores[1, 0] * 4).round() / 4  # ties at the threshold
    seqlen = torch.tensor([n, 300, 129], dtype=torch.int32)
    got = LH.run_topk_linked(scores[0], seqlen, k, nprog=1)
    assert got.long().tolist() == topk_index_order(scores[0], seqlen, k).tolist()
    # two sets a launch, launched twice on the same buffers (a graph's replays): set 1 runs on
    # the tkh slice set 0 zeroed and zeroes slice 0 back for the next launch
    bufs = LH.topk_buffers(rows, n, k, "cpu")
    for _ in range(2):
        LH.launch_topk_linked(scores, seqlen, bufs, nprog=1)
        assert bufs.topk.long().tolist() == topk_index_order(scores[1], seqlen, k).tolist()
        assert not bufs.tkh[0].any()


def test_handoffs_count_the_grid():
    bar = torch.zeros(2, dtype=torch.int32)
    LH.launch_handoffs(bar, 5, nprog=1)
    assert bar.tolist() == [5, 0]
