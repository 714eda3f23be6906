"""The whole reference layer on the tiny config (CPU, no sglang): every layer kind runs, TP ranks
sum to the TP1 layer, a verify step equals the same tokens decoded one by one, and each step
writes exactly the cache rows SGLang's stores write."""

from __future__ import annotations

import pytest
import torch

from mono_deepseek_v41 import layouts as L
from mono_deepseek_v41 import reference as R
from mono_deepseek_v41 import weights as W
from mono_deepseek_v41.config import tiny

NREQ, PROMPT = 2, 40


def _stack(s, seed=0):
    return [W.make_layer_weights(s.whole, i, seed=seed * 100 + i) for i in range(s.num_layers)]


def _run(s, weights, caches, tables, start, tokens, ids, x, layers=None, shard_tps=(1,)):
    """Run `layers` of the stack for one step; returns the final HcState."""
    req_to_token, f2s = tables
    step = W.make_step(s, torch.full((NREQ,), start), tokens, req_to_token, f2s, ids)
    state, ctx = R.HcState(R.hc_expand(x, s.hc_mult)), R.StepContext()
    for i in layers if layers is not None else range(s.num_layers):
        shapes = [s.tp_shard(tp, r) for tp in shard_tps for r in range(tp)]
        ranks = [W.shard(weights[i], sh) for sh in shapes]
        state = R.decoder_layer(shapes, ranks, state, step, caches, ctx, i)
    return state


@pytest.fixture(scope="module")
def prefilled():
    """The tiny stack after a 40-token prompt for two requests (every kind has compressed rows:
    ratio 1/2/4 blocks, no C128 block yet)."""
    torch.manual_seed(0)
    s = tiny()
    weights = _stack(s)
    req_to_token, f2s, pages = W.make_tables(s, NREQ, 300)
    caches = W.make_caches(s, pages, NREQ)
    ids = torch.randint(0, s.vocab, (NREQ, PROMPT))
    x = (torch.randn(NREQ * PROMPT, s.hidden) * 0.5).bfloat16()
    out = _run(s, weights, caches, (req_to_token, f2s), 0, PROMPT, ids, x)
    return s, weights, caches, (req_to_token, f2s), out


def _clone(caches):
    return {k: R.LayerCaches(*(None if getattr(c, f) is None else getattr(c, f).clone()
                               for f in ("swa", "ckv", "index_k", "state", "index_state"))) for k, c in caches.items()}


def test_every_layer_kind_is_in_the_tiny_stack():
    s = tiny()
    names = {s.layer_kind(i).name for i in range(s.num_layers)}
    assert names == {"swa/hash", "c1+kv+index/hash", "c2+kv+index/topk", "c4/topk", "c128/topk", "c1/topk",
                     "c2/topk", "c1+index/topk"}


def test_prefill_is_finite_and_writes_every_pool(prefilled):
    s, _, caches, _, out = prefilled
    assert torch.isfinite(out.streams.float()).all() and out.pre.shape == (NREQ * PROMPT, s.hc_mult)
    for i in range(s.num_layers):
        kind, c = s.layer_kind(i), caches[i]
        assert c.swa.any(), i
        if kind.ratio in (4, 128) or kind.kv_source:
            assert (c.ckv is not None) and (c.ckv.any() if kind.ratio != 128 else not c.ckv.any()), i
        if kind.ratio == 4:
            assert c.index_k.any() and torch.isfinite(c.index_state).any()
        if kind.kv_source and kind.index_source:
            assert c.index_k.any(), i


def test_decode_writes_exactly_the_new_rows(prefilled):
    s, weights, caches0, tables, _ = prefilled
    caches = _clone(caches0)
    req_to_token, f2s = tables
    ids = torch.randint(0, s.vocab, (NREQ, 1))
    x = (torch.randn(NREQ, s.hidden) * 0.5).bfloat16()
    _run(s, weights, caches, tables, PROMPT, 1, ids, x)  # position 40: completes ratio 1 and 2... and no c4
    new = req_to_token[:, PROMPT]
    swa_pages = set((f2s[new] // s.page_size).tolist())
    for i in range(s.num_layers):
        before, after = caches0[i].swa, caches[i].swa
        changed = set((before != after).any(-1).nonzero().flatten().tolist())
        assert changed <= swa_pages and changed, i
        rows = L.v4_read(after, f2s[new], s.page_size, s.nope_dim, s.rope_dim)
        assert rows.abs().sum(-1).gt(0).all(), i
    # position 40 completes a ratio-1 group only (41 % 2, % 4, % 128 != 0)
    assert not torch.equal(caches0[1].ckv, caches[1].ckv)
    for i in (2, 3, 4):
        assert torch.equal(caches0[i].ckv, caches[i].ckv), i


def _chain(s, weights, caches, step, x, tp=1, inputs=None):
    """Run the stack for one step; layer i reads `inputs[i]` when given (else the previous
    layer's output). Returns [(input HcState, output HcState)] a layer."""
    state, ctx, trace = R.HcState(R.hc_expand(x, s.hc_mult)), R.StepContext(), []
    shapes = [s.tp_shard(tp, r) for r in range(tp)]
    for i in range(s.num_layers):
        if inputs is not None:
            state = inputs[i]
        out = R.decoder_layer(shapes, [W.shard(weights[i], sh) for sh in shapes], state, step, caches, ctx, i)
        trace.append((state, out))
        state = out
    return trace


def _rows(state, idx):
    return R.HcState(state.streams[idx], state.pre[idx] if state.pre is not None else None)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_ranks_sum_to_the_tp1_layer(prefilled, tp):
    """Every layer, fed the same input at TP1 and as `tp` ranks: the ranks' partial sums meet
    at the two all-reduces and give the TP1 output, up to rounding."""
    s, weights, caches0, (req_to_token, f2s), _ = prefilled
    step = W.make_step(s, torch.full((NREQ,), PROMPT), 1, req_to_token, f2s, torch.randint(0, s.vocab, (NREQ, 1)))
    x = (torch.randn(NREQ, s.hidden) * 0.5).bfloat16()
    one_caches, tp_caches = _clone(caches0), _clone(caches0)
    one = _chain(s, weights, one_caches, step, x)
    many = _chain(s, weights, tp_caches, step, x, tp=tp, inputs=[a for a, _ in one])
    for i, ((_, a), (_, b)) in enumerate(zip(one, many)):
        # each rank rounds its bf16 partial before the fp32 all-reduce (TP1 rounds the whole
        # sum once): ~tp/2 bf16 ulps of each sublayer output, and where that moves an FP8
        # activation group's scale or rounding, the MoE's inputs move too (measured: up to
        # 1.6 % of the largest stream value at TP4, cosine > 0.99999). A wrong shard breaks
        # the cosine, not the last percent.
        a32, b32 = a.streams.float(), b.streams.float()
        assert torch.nn.functional.cosine_similarity(a32.flatten(), b32.flatten(), dim=0) > 0.9999, i
        assert (a32 - b32).abs().max() <= 2**-5 * a32.abs().max(), i
        # the FFN's pre mixes the attention post's streams, which moved by those ulps
        assert (a.pre - b.pre).abs().max() <= 2**-8, i
    # the replicated state (SWA rows, compressed rows, rings) is the same on every rank
    for i in range(s.num_layers):
        assert torch.equal(one_caches[i].swa, tp_caches[i].swa), i


def test_verify_step_equals_the_same_tokens_decoded_one_by_one():
    """A DSpark verify block (3 tokens a request) and the same tokens as three decode steps,
    every layer fed the same rows: identical causal visibility, compressor and indexer
    state, so the same outputs and the same caches."""
    torch.manual_seed(1)
    s = tiny(draft_tokens=3)
    weights = _stack(s, seed=1)
    req_to_token, f2s, pages = W.make_tables(s, NREQ, 300)
    caches = W.make_caches(s, pages, NREQ)
    tables = (req_to_token, f2s)
    _run(s, weights, caches, tables, 0, 34, torch.randint(0, s.vocab, (NREQ, 34)),
         (torch.randn(NREQ * 34, s.hidden) * 0.5).bfloat16())
    ids = torch.randint(0, s.vocab, (NREQ, 3))
    x = (torch.randn(NREQ, 3, s.hidden) * 0.5).bfloat16()
    verify_caches = _clone(caches)
    vstep = W.make_step(s, torch.full((NREQ,), 34), 3, req_to_token, f2s, ids)
    verify = _chain(s, weights, verify_caches, vstep, x.reshape(-1, s.hidden))
    for j in range(3):  # positions 34, 35 (completes a c1, c2 and c4 block), 36
        rows = torch.arange(NREQ) * 3 + j
        step = W.make_step(s, torch.full((NREQ,), 34 + j), 1, req_to_token, f2s, ids[:, j : j + 1])
        seq = _chain(s, weights, caches, step, x[:, j], inputs=[_rows(a, rows) for a, _ in verify])
        for i, ((_, v), (_, d)) in enumerate(zip(verify, seq)):
            want = v.streams[rows]
            # the GEMMs see 6 rows at once instead of 2; CPU BLAS may block them otherwise,
            # moving an fp32 last bit and, rarely, one bf16 rounding of the C4 index path
            assert (d.streams.float() - want.float()).abs().max() <= 2**-8 * want.float().abs().max(), (j, i)
    for i in range(s.num_layers):
        for f in ("swa", "ckv", "index_k"):  # quantized rows: a flipped rounding at most
            a, b = getattr(verify_caches[i], f), getattr(caches[i], f)
            if a is not None:
                assert (a != b).float().mean() < 1e-3, (i, f)
        for f in ("state", "index_state"):  # fp32 projections: the GEMM's last bits
            a, b = getattr(verify_caches[i], f), getattr(caches[i], f)
            if a is not None:
                finite = a[torch.isfinite(a)].abs().max()
                assert torch.allclose(a, b, rtol=2**-18, atol=2**-20 * float(finite)), (i, f)


def test_a_low_ratio_layer_without_a_published_topk_is_an_error():
    s = tiny(compress_ratios=(0, 1, 2, 4, 128, 1, 2, 1), index_source_layer_ids=(2, 7))
    w = W.make_layer_weights(s, 1, seed=0)
    req_to_token, f2s, pages = W.make_tables(s, 1, 64)
    caches = W.make_caches(s, pages, 1)
    step = W.make_step(s, torch.zeros(1, dtype=torch.long), 4, req_to_token, f2s, torch.zeros(1, 4, dtype=torch.long))
    x = torch.randn(4, s.hidden).bfloat16()
    with pytest.raises(ValueError, match="reads a top-k no earlier layer"):
        R.attention_partial(x, w, s, step, caches[1], caches, R.StepContext(), 1)


def test_hash_layers_route_by_token_and_the_rest_by_score():
    s = tiny()
    torch.manual_seed(2)
    w0, w3 = W.make_layer_weights(s, 0, seed=3), W.make_layer_weights(s, 3, seed=4)
    ids = torch.tensor([5, 17, 5])
    logits = torch.randn(3, s.n_experts)
    _, got = R.hash_topk(logits, ids, w0["mlp.topk.tid2eid"], s.routed_scaling)
    assert torch.equal(got, w0["mlp.topk.tid2eid"][ids]) and torch.equal(got[0], got[2])
    wts, sel = R.biased_sqrtsoftplus_topk(logits, w3["mlp.gate.e_score_correction_bias"], s.top_k, s.routed_scaling)
    assert torch.allclose(wts.sum(-1), torch.full((3,), s.routed_scaling))
    biased = R._sqrtsoftplus(logits) + w3["mlp.gate.e_score_correction_bias"]
    assert torch.equal(sel.long(), biased.topk(s.top_k).indices)


def test_swiglu_limit_clamps_the_gate_before_silu():
    gu = torch.tensor([[5.0, -3.0, 4.0, -9.0]])
    out = R.swiglu_clamp(gu, 1.0)
    want = torch.nn.functional.silu(torch.tensor([1.0, -3.0])) * torch.tensor([1.0, -1.0])
    assert torch.equal(out[0], want)
    assert torch.equal(R.swiglu_clamp(gu, None)[0], torch.nn.functional.silu(gu[0, :2]) * gu[0, 2:])
