"""The library's small stages under the interpreter against their references: the radix top-k
(mono_common.stages.topk), biased routing (stages.routing), RMSNorm (stages.norm), RoPE and the
Hadamard rotation (stages.rope)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from mono_common.ref.norm import rms_norm  # noqa: E402
from mono_common.ref.rope import apply_rope, hadamard_rotate, rope_cos_sin  # noqa: E402
from mono_common.ref.routing import biased_topk  # noqa: E402
from mono_common.stages import small_host as H  # noqa: E402


@pytest.mark.parametrize("first_tile,rt,short,once", [(0, False, 0, False), (64, False, 0, False),
                                                      (0, True, 0, False), (0, False, 1024, False),
                                                      (0, False, 512, False), (0, False, 512, True)],
                         ids=["own-stage", "first-pass-by-producer", "runtime-pass", "short-rows-counted-by-write",
                              "some-rows-counted-by-write", "thresholds-once-a-program"])
@pytest.mark.parametrize("lens", [(700, 40, 300, 1), (256, 257, 512, 33)], ids=["long-short", "chunk-edges"])
def test_radix_topk_selects_the_top_k_set(lens, first_tile, rt, short, once):
    """The top-k set, above-threshold keys then ties in index order; with the first radix
    pass run by the scores' producer (`topk_hist_first`, tiles of 64), with each pass's
    number a runtime value (`topk_hist` RT), with rows of at most `short` tokens counted
    by the write stage from their keys (`topk` SHORT: every row, the count stage not launched;
    or 512: the 700-token row still counted by the count stage), and with every row's
    threshold digits derived once a run of a program's contiguous tiles (`topk` ONCE: 3
    programs over 3 + 2 chunks of two long rows in runs of 2, so one run crosses rows), the
    same."""
    k = 128
    g = torch.Generator().manual_seed(sum(lens))
    L = max(lens)
    scores = torch.randn(len(lens), L, generator=g)  # distinct values: the set is unique
    seqlen = torch.tensor(lens, dtype=torch.int32)
    got = H.run_topk(scores, seqlen, k, nprog=3, first_tile=first_tile, rt=rt, short=short, once=once)
    for m, n in enumerate(lens):
        row = got[m]
        if n <= k:
            want = list(range(n)) + [-1] * (k - n)
            assert row.tolist() == want, m
        else:
            ref = set(torch.topk(scores[m, :n], k).indices.tolist())
            assert set(row.tolist()) == ref, m
            # the keys above the threshold (the k-th score) in index order, then its ties
            vals = scores[m, row.long()]
            above, ties = row[vals > vals.min()].tolist(), row[vals == vals.min()].tolist()
            assert row.tolist() == sorted(above) + sorted(ties), m


def test_radix_topk_in_buffers_wider_than_the_rows_touches_only_the_rows():
    """A served launch's score rows are as wide as the server's context, and the stages number
    only the rows' chunks: the rows still get their top-k, the chunk counts exist for the
    chunks of rows longer than k only, and with 3 rows (read as a vector of 4 lengths) nothing
    of a 4th row is touched."""
    from mono_common.stages.entries import topk_entry
    from mono_common.stages.topk import TKC, TKH_ROW

    k, lens = 128, (700, 40, 300)
    W, L = len(lens), 4096
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(W + 1, L, generator=g)
    seqlen = torch.tensor(lens + (L,), dtype=torch.int32)  # a 4th row the launch must not see
    nck = L // TKC.value
    tkh = torch.zeros(W + 1, TKH_ROW.value, dtype=torch.int32)
    tkc = torch.full((W + 1, nck, 2), -5, dtype=torch.int32)
    topk = torch.full((W + 1, k), -7, dtype=torch.int32)
    for stage in range(6):
        topk_entry[(3,)](scores, scores.stride(0), seqlen, tkh, tkc, topk, nck, stage, W=W, TOPK=k, STAGE=stage)
    for m, n in enumerate(lens):
        if n <= k:
            assert topk[m].tolist() == list(range(n)) + [-1] * (k - n)
        else:
            assert set(topk[m].tolist()) == set(torch.topk(scores[m, :n], k).indices.tolist())
    assert (topk[W] == -7).all() and (tkh[W] == 0).all() and (tkc[W] == -5).all()
    # chunk counts only for the chunks of rows longer than k
    for m, n in enumerate(lens):
        live = -(-n // TKC.value) if n > k else 0
        assert (tkc[m, live:] == -5).all() and (tkc[m, :live] >= 0).all(), m


@pytest.mark.parametrize("first_tile,short,once", [(0, 0, False), (32, 0, False), (0, 512, False), (0, 0, True)])
def test_radix_topk_ties_resolve_in_index_order(first_tile, short, once):
    # short: the write stage counts the row itself (the second chunk's ties come after the
    # first chunk's 254, past the k slots); once: the threshold derived once a run
    k = 8
    scores = torch.zeros(1, 300)
    scores[0, 10] = 5.0
    scores[0, 250] = 4.0  # the rest tie at 0.0: the lowest indices fill the remaining 6 slots
    got = H.run_topk(scores, torch.tensor([300], dtype=torch.int32), k, nprog=2, first_tile=first_tile, short=short,
                     once=once)
    assert got[0].tolist() == [10, 250, 0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("lens,k,row", [((700, 40, 300, 1), 128, 1024), ((256, 257, 512, 33), 128, 512),
                                         ((300, 129, 128), 128, 512), ((1024,), 1000, 1024)],
                         ids=["long-short", "chunk-edges", "at-k", "k-near-row"])
@pytest.mark.parametrize("row_hist", [False, True], ids=["search", "hist-seeded"])
def test_row_topk_gives_the_radix_stages_integers(lens, k, row, row_hist):
    """One program a row (`topk_rows_one`, 2 programs over the rows from the last down): the
    radix stages' entries exactly, over scores of both signs with repeated values (ties
    across chunk edges, -0.0 below 0.0 in key order, as the radix passes order them) and
    rows at, under and over k; also with the search seeded by radix pass 0 (HIST)."""
    g = torch.Generator().manual_seed(sum(lens) + k)
    L = max(lens)
    scores = torch.randint(-40, 40, (len(lens), L), generator=g).float() / 8  # many ties
    scores[:, ::7] = -0.0
    seqlen = torch.tensor(lens, dtype=torch.int32)
    want = H.run_topk(scores, seqlen, k, nprog=3)
    got = H.run_topk(scores, seqlen, k, nprog=2, row=row, row_hist=row_hist)
    assert torch.equal(got, want)
    for m, n in enumerate(lens):
        if n > k:
            kth = torch.topk(scores[m, :n], k).values.min()
            assert (scores[m, got[m].long()] >= kth).all() and len(set(got[m].tolist())) == k, m
        else:
            assert got[m].tolist() == list(range(n)) + [-1] * (k - n), m


def test_row_topk_threshold_is_the_kth_key_over_the_whole_key_range():
    """The two-bits-a-step threshold search reaches every bit of the key: scores spanning
    the float range (subnormals, huge, negative, inf) and a k-th key that differs from its
    neighbours only in the lowest mantissa bit; a row longer than `row` takes the radix
    stages instead (the host's fallback)."""
    k = 5
    base = torch.tensor([1.0, 1.0000001, -3e38, 3e38, 1e-45, -1e-45, float("inf"), -float("inf"), 0.5, 2.0,
                         1.0000002, 7.0])
    scores = base[None].repeat(2, 1)
    seqlen = torch.tensor([12, 12], dtype=torch.int32)
    got = H.run_topk(scores, seqlen, k, nprog=1, row=16)
    # above the 5th largest (1.0000002): inf, 3e38, 7.0, 2.0 in index order, then the tie
    assert got[0].tolist() == [3, 6, 9, 11, 10] and torch.equal(got[0], got[1])
    long = torch.randn(1, 40, generator=torch.Generator().manual_seed(3))
    assert torch.equal(H.run_topk(long, torch.tensor([40], dtype=torch.int32), 8, nprog=2, row=32),
                       H.run_topk(long, torch.tensor([40], dtype=torch.int32), 8, nprog=2))


@pytest.mark.parametrize("ncand", [16, 512, 513, 1024])
def test_hist_seeded_row_topk_packs_or_masks_the_top_digits_keys(ncand):
    """The seeded search's two forms (`tk_row_threshold_hist`): the threshold's top digit
    holds ncand keys ([1, 2) share one: 16 and CAND = 512 are packed into the free bins, 513
    and 1024 searched in place over the row), 100 keys above it in [4, 8) and the rest
    negative; a k inside the digit's keys, with ties there, gives the radix stages' entries.
    A producer's pass 0 (first_tile) seeds it as the layer's index scores do."""
    from mono_common.stages.topk import CAND

    assert CAND.value == 512
    n, k = 2048, 100 + ncand // 2
    g = torch.Generator().manual_seed(ncand)
    mid = 1 + torch.randint(0, 64, (ncand,), generator=g).float() / 64  # ties among the candidates
    hi = 4 + 4 * torch.rand(100, generator=g)
    lo = -1 - torch.rand(n - ncand - 100, generator=g)
    scores = torch.cat([mid, hi, lo])[torch.randperm(n, generator=g)][None]
    seqlen = torch.tensor([n], dtype=torch.int32)
    want = H.run_topk(scores, seqlen, k, nprog=3)
    for first_tile in (0, 64):
        got = H.run_topk(scores, seqlen, k, nprog=2, row=n, row_hist=True, first_tile=first_tile)
        assert torch.equal(got, want), first_tile


@pytest.mark.parametrize("lens,k,spread,rk", [((700, 40, 300, 1), 128, 1024, 16), ((256, 257, 512, 33), 128, 512, 32),
                                               ((300, 129, 128), 128, 512, 64), ((1024,), 1000, 1024, 128)],
                         ids=["long-short", "chunk-edges", "at-k", "k-near-row"])
@pytest.mark.parametrize("select", [False, True], ids=["two-stages", "select"])
def test_spread_topk_gives_the_radix_stages_integers(lens, k, spread, rk, select):
    """The spread form (radix pass 0 with the fine histograms, `topk_spread_threshold`, then
    `topk_spread_write`; select: the two as `topk_spread_select`; rk keys a tile over 3
    programs): the radix stages' entries exactly, over scores of both signs with many ties (the
    threshold's ties across tile edges; -0.0 below 0.0 in key order) and rows at, under and
    over k."""
    g = torch.Generator().manual_seed(sum(lens) + k + rk)
    L = max(lens)
    scores = torch.randint(-40, 40, (len(lens), L), generator=g).float() / 8
    scores[:, ::7] = -0.0
    seqlen = torch.tensor(lens, dtype=torch.int32)
    want = H.run_topk(scores, seqlen, k, nprog=3)
    got = H.run_topk(scores, seqlen, k, nprog=3, spread=spread, rk=rk, select=select)
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", ["all-equal", "threshold-in-last-bit", "few-candidates", "least-key-threshold",
                                  "one-top-digit"])
@pytest.mark.parametrize("select", [False, True], ids=["two-stages", "select"])
def test_spread_topk_finds_the_threshold_however_many_keys_share_its_digit(case, select):
    """The spread threshold's candidates are the keys of the threshold's top 16 bits: every key
    (a row of equal scores, as an index whose ReLU terms are all zero gives), keys that differ
    only in their last mantissa bit (one fine bin: select's bit steps split them),
    a few among many others, keys that all share their top 8 bits (as index scores mostly do)
    split by the fine bins, or a threshold that is the least key there is (the NaN of all-ones
    bits, whose key the stages also use for keys that do not count); each gives the radix
    stages' entries and, with distinct keys, torch.topk's set."""
    g = torch.Generator().manual_seed(7)
    n, k = 512, 100
    if case == "all-equal":
        scores = torch.zeros(1, n)
    elif case == "threshold-in-last-bit":
        bits = torch.tensor(1.0).view(torch.int32) + torch.randperm(n, generator=g).to(torch.int32)
        scores = bits.view(torch.float32)[None]
    elif case == "one-top-digit":
        scores = (2 + torch.rand(n, generator=g))[None]
    elif case == "few-candidates":
        scores = torch.cat([4 + torch.rand(90, generator=g), 1 + torch.rand(20, generator=g),
                            -1 - torch.rand(n - 110, generator=g)])[torch.randperm(n, generator=g)][None]
    else:
        least = torch.full((n - 60,), -1, dtype=torch.int32).view(torch.float32)
        scores = torch.cat([torch.rand(60, generator=g), least])[torch.randperm(n, generator=g)][None]
    seqlen = torch.tensor([n], dtype=torch.int32)
    want = H.run_topk(scores, seqlen, k, nprog=3)
    got = H.run_topk(scores, seqlen, k, nprog=5, spread=n, rk=16, select=select)
    assert torch.equal(got, want)
    if case == "all-equal":
        assert got[0].tolist() == list(range(k))
    elif case == "least-key-threshold":
        assert set(torch.nonzero(scores[0] >= 0).flatten().tolist()) < set(got[0].tolist())
    else:
        assert set(got[0].tolist()) == set(torch.topk(scores[0], k).indices.tolist())


@pytest.mark.parametrize("rows", [1, 3])
def test_biased_routing_matches_the_reference(rows):
    E, top_k = 64, 8
    g = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, E, generator=g)
    bias = torch.randn(E, generator=g) * 0.1
    w, used = H.run_routing(logits, bias, top_k)
    rw, rid = biased_topk(logits, bias, top_k)
    want = torch.zeros(rows, E)
    want.scatter_(1, rid.long(), rw)
    assert torch.allclose(w, want, rtol=1e-6, atol=0), (w - want).abs().max()
    assert used.tolist() == (want > 0).any(0).int().tolist()


def test_biased_routing_sums_split_k_partials_in_slot_order():
    # 7 partials of [3 -> 4 rows, 256]: unrolled groups of 4 and a remainder of 3, each added
    # in slot order, so the routing is that of the partials' sequential fp32 sum
    E, top_k, ksr = 256, 8, 7
    g = torch.Generator().manual_seed(11)
    parts = torch.randn(ksr, 3, E, generator=g)
    bias = torch.randn(E, generator=g) * 0.1
    total = torch.zeros(3, E)
    for p in parts:
        total = total + p
    w, used = H.run_routing(parts, bias, top_k)
    want_w, want_used = H.run_routing(total, bias, top_k)
    assert torch.equal(w, want_w) and torch.equal(used, want_used)


def test_rows_that_are_not_live_route_to_no_expert():
    # a decode step's pad rows: no weights, no expert marked used on their account; the live
    # rows route exactly as without the mask
    E, top_k = 64, 8
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, E, generator=g)
    bias = torch.randn(E, generator=g) * 0.1
    w, used = H.run_routing(logits, bias, top_k, live=torch.tensor([1, 0, 1]))
    w_all, _ = H.run_routing(logits, bias, top_k)
    assert torch.equal(w[1], torch.zeros(E))
    assert torch.equal(w[0], w_all[0]) and torch.equal(w[2], w_all[2])
    assert used.tolist() == ((w_all[0] > 0) | (w_all[2] > 0)).int().tolist()
    assert (w_all[1] > 0).sum() == top_k  # the masked row would have selected experts


def test_biased_routing_breaks_ties_to_the_lower_expert_and_orders_negative_scores():
    # exact ties of score + bias (equal logits, equal biases) go to the lower expert id, and
    # negative score + bias values (a bias below -1) order below positive ones and among
    # themselves by value: the packed-key pick must agree with a stable descending sort
    E, top_k = 64, 8
    logits = torch.zeros(2, E)
    logits[0, 40:] = 1.0  # the even ones of these 24 experts tie on the top score: the 8 lowest win
    bias = torch.zeros(E)
    bias[1::2] = -3.0  # odd experts score + bias negative
    logits[1] = torch.linspace(-2, 2, E)
    w, used = H.run_routing(logits, bias, top_k)
    b = logits.sigmoid() + bias
    want_ids = torch.sort(b, dim=1, descending=True, stable=True).indices[:, :top_k]
    assert [sorted(torch.nonzero(w[r]).flatten().tolist()) for r in range(2)] == \
        [sorted(want_ids[r].tolist()) for r in range(2)]
    assert sorted(torch.nonzero(w[0]).flatten().tolist()) == list(range(40, 56, 2))


def test_rmsnorm_matches_the_reference():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 256, generator=g).to(torch.bfloat16)
    w = (torch.rand(256, generator=g) + 0.5).to(torch.bfloat16)
    got = H.run_rmsnorm(x.float(), w, 1e-5)
    want = rms_norm(x, w, 1e-5).float()
    # one fp32 summation order against another: at most one bf16 rounding step apart
    assert ((got - want).abs() <= want.abs() * 2 ** -7).all()
    assert (got == want).float().mean() > 0.99


@pytest.mark.parametrize("neox", [True, False])
def test_rope_matches_the_reference(neox):
    rd = 64
    g = torch.Generator().manual_seed(int(neox))
    x = torch.randn(4, rd, generator=g)
    pos = torch.tensor([0, 1, 17, 4095])
    cos, sin = rope_cos_sin(torch.arange(4096), rd, 10000.0)
    cs = torch.cat([cos, sin], dim=-1).contiguous()
    got = H.run_rope(x, pos, cs, neox)
    want = apply_rope(x, cos[pos], sin[pos], interleaved=not neox)
    assert torch.allclose(got, want, rtol=0, atol=1e-6)


def test_hadamard_matches_the_reference():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 128, generator=g)
    got = H.run_hadamard(x, 128 ** -0.5)
    assert torch.allclose(got, hadamard_rotate(x), rtol=1e-5, atol=1e-5)
