"""The library GEMV (mono_common.stages.gemv) under the interpreter against its fp64 reference:
split-K and stream-K plans, with and without the register prefetch, FP8 and bf16 weights, raw
and pre-quantised activations, column counts that leave a partial column tile."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from mono_common.ref.fp8 import per_token_group_quant  # noqa: E402
from mono_common.ref.gemv import bf16_gemv, block_fp8_gemv  # noqa: E402
from mono_common.stages.gemv import span_per, span_slots  # noqa: E402
from mono_common.stages.gemv_host import GemvPlan, run_gemv  # noqa: E402

N, K = 200, 512  # 200 = one full and one partial tile of 128 columns; 4 K blocks


def _weights(n=N, k=K, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(1, n, k, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    s = torch.rand(1, -(-n // 128), k // 128, generator=g) * 1e-3 + 1e-4
    x = torch.randn(3, k, generator=g).to(torch.bfloat16)
    return x, w, s


def _rel(got, ref):
    return ((got.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("kw", [
    dict(bn=128, span=False, ks=2), dict(bn=64, span=False, ks=4), dict(bn=128, span=True),
    dict(bn=128, span=True, pre=True), dict(bn=256, span=True, pre=True), dict(bn=32, span=False, ks=1, pre=True),
    dict(bn=128, span=True, dot=1), dict(bn=64, span=False, ks=2, dot=2, pre=True),
    dict(bn=128, span=True, dot=2, lstg=3), dict(bn=64, span=False, ks=2, lstg=2),
], ids=["k128", "k64", "s128", "s128p", "s256p", "k32p", "s128w", "k64fp", "s128fl", "k64l"])
@pytest.mark.parametrize("rows", [1, 3])
def test_fp8_gemv_matches_reference(kw, rows):
    x, w, s = _weights()
    x = x[:rows]
    plan = GemvPlan.make(N, K, rows, nprog=3, **kw)
    got = run_gemv(plan, x, w, s)[0]
    ref = block_fp8_gemv(x, w[0], s[0])
    assert got.shape == (rows, N)
    # fp32 accumulation of exact products: ~1e-7 relative; a wrong block scale or slot is >= 1e-3
    assert _rel(got, ref) < 1e-6


def test_stream_k_spans_cross_column_tiles():
    # 7 programs over 2 tiles x 4 blocks = 8 items: PER 2, so spans end inside tiles and one
    # tile's partials land in two slots; every slot the plan never writes stays zero.
    x, w, s = _weights()
    plan = GemvPlan.make(N, K, 2, nprog=7, bn=128, span=True)
    assert plan.PER == 2 and plan.slots == 3
    assert _rel(run_gemv(plan, x[:2], w, s)[0], block_fp8_gemv(x[:2], w[0], s[0])) < 1e-6


@pytest.mark.parametrize("nprog", [3, 7])
def test_span_fixup_sums_each_column_tile_into_slot_0(nprog):
    """fixup: each column tile's last span sums the tile's partial slots into slot 0 (in slot
    order from zero, so the bits of the host's slot-order sum of the plain launch), over two
    weight sets (each its own counters), two launches on one fixup buffer (the programs'
    epochs count on, as graph replays do); the other slots keep their partials. At 7 programs
    spans end inside tiles (a tile's partials in up to 3 slots); a split-K plan is refused."""
    from mono_common.stages.gemv_host import alloc_out, fixup_words, launch_gemv

    x, w, s = _weights()
    w2 = torch.cat([w, w.flip(1)])
    s2 = torch.cat([s, s.flip(1)])
    plan = GemvPlan.make(N, K, 3, nprog=nprog, bn=128, span=True)
    plain = alloc_out(plan, 2, x.device)
    launch_gemv(plan, x, w2, s2, plain)
    fix = torch.zeros(fixup_words(plan, 2), dtype=torch.int32)
    for _ in range(2):
        fixed = alloc_out(plan, 2, x.device)
        launch_gemv(plan, x, w2, s2, fixed, fixup=fix)
        assert torch.equal(fixed[:, 1:], plain[:, 1:])
        assert plan.slots > 1 and torch.equal(fixed[:, 0], _slot_order_sum(plain))
    assert fix[-nprog:].tolist() == [2] * nprog
    assert _rel(fixed[0, 0], block_fp8_gemv(x, w[0], s[0])) < 1e-6
    with pytest.raises(ValueError, match="split-K"):
        launch_gemv(GemvPlan.make(N, K, 3, nprog=3, bn=128, span=False, ks=2), x, w, s,
                    alloc_out(GemvPlan.make(N, K, 3, nprog=3, bn=128, span=False, ks=2), 1, x.device), fixup=True)


def _slot_order_sum(out):
    acc = out[:, 0].clone()
    for j in range(1, out.shape[1]):
        acc += out[:, j]
    return acc


def test_prequantised_activations_give_the_same_bits():
    from mono_common.stages.gemv_host import alloc_out, launch_gemv

    x, w, s = _weights()
    plan = GemvPlan.make(N, K, 3, nprog=3, bn=128, span=True)
    xq, xs = per_token_group_quant(x, 128)
    a, b = alloc_out(plan, 1, "cpu"), alloc_out(plan, 1, "cpu")
    launch_gemv(plan, x, w, s, a)
    launch_gemv(plan, xq.to(torch.bfloat16), w, s, b, xs=xs.contiguous())
    assert torch.equal(a, b)


def test_bf16_weights():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(1, N, K, generator=g).to(torch.bfloat16)
    x = torch.randn(2, K, generator=g).to(torch.bfloat16)
    plan = GemvPlan.make(N, K, 2, nprog=3, bn=64, span=True)
    got = run_gemv(plan, x, w, w, fmt="bf16")[0]
    assert _rel(got, bf16_gemv(x, w[0])) < 1e-6


def test_several_weight_sets_in_one_launch():
    x, w0, s0 = _weights(seed=0)
    _, w1, s1 = _weights(seed=1)
    w, s = torch.cat([w0, w1]), torch.cat([s0, s1])
    plan = GemvPlan.make(N, K, 3, nprog=3, bn=128, span=True)
    got = run_gemv(plan, x, w, s)
    for li in range(2):
        assert _rel(got[li], block_fp8_gemv(x, w[li], s[li])) < 1e-6


def test_plan_refuses_bad_tiles():
    with pytest.raises(ValueError, match="multiple of the block"):
        GemvPlan.make(N, 500, 1, 3)
    with pytest.raises(ValueError, match="multiple of 16"):
        GemvPlan.make(N, K, 1, 3, bn=24)
    with pytest.raises(ValueError, match="does not divide"):
        GemvPlan.make(N, K, 1, 3, span=False, ks=3)


@pytest.mark.parametrize("form", [dict(lstg=3), dict(lstg=2)], ids=["pipelined3", "pipelined2"])
@pytest.mark.parametrize("tiling", [dict(bn=128, span=True, dot=2), dict(bn=64, span=False, ks=2)],
                         ids=["span-fp8mma", "splitk"])
def test_loop_forms_give_the_same_bits(form, tiling):
    # the loop pipelined with every load reorders loads, not sums: bit-equal to the default
    # form, with x quantised in the loop and pre-quantised
    from mono_common.stages.gemv_host import alloc_out, launch_gemv

    x, w, s = _weights()
    xq, xs = per_token_group_quant(x[:3], 128)
    xq = xq.to(torch.bfloat16)
    for args in ((x[:3], None), (xq, xs.contiguous())):
        outs = []
        for kw in ({}, form):
            plan = GemvPlan.make(N, K, 3, nprog=3, **tiling, **kw)
            out = alloc_out(plan, 1, "cpu")
            launch_gemv(plan, args[0], w, s, out, xs=args[1])
            outs.append(out)
        assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("nprog", [3, 7])
def test_called_span_gives_the_inline_spans_partials(nprog):
    # gemv_span_call: one called copy with runtime shapes writes every partial slot the inline
    # span writes, bit for bit: two weight sets, spans crossing column tiles, x quantised in the
    # span and pre-quantised, both MMA forms
    from mono_common.stages.gemv_host import alloc_out, launch_gemv

    x, w0, s0 = _weights(seed=0)
    _, w1, s1 = _weights(seed=1)
    w, s = torch.cat([w0, w1]), torch.cat([s0, s1])
    xq, xs = per_token_group_quant(x[:3], 128)
    xq = xq.to(torch.bfloat16)
    for args in ((x[:3], None), (xq, xs.contiguous())):
        for dot in (0, 2):
            outs = []
            for call in (False, True):
                plan = GemvPlan.make(N, K, 3, nprog=nprog, bn=128, span=True, dot=dot, call=call)
                out = alloc_out(plan, 2, "cpu")
                launch_gemv(plan, args[0], w, s, out, xs=args[1])
                outs.append(out)
            assert torch.equal(outs[0], outs[1]) and outs[1].abs().sum() > 0
    with pytest.raises(ValueError, match="stream-K span without pre or lstg"):
        GemvPlan.make(N, K, 3, nprog=3, span=False, call=True)
    with pytest.raises(ValueError, match="no fixup form"):
        plan = GemvPlan.make(N, K, 3, nprog=3, call=True)
        launch_gemv(plan, x[:3], w, s, alloc_out(plan, 2, "cpu"), fixup=True)


def _pair_inputs(xq):
    """x, GEMV A (200 columns: one tile partial) and B (384) over it, and x as the pair's entry
    takes it: pre-quantised with its scales (xq), or as is (its scales then unread)."""
    x, wa, sa = _weights(200, K, seed=3)
    _, wb, sb = _weights(384, K, seed=4)
    xin, xs = x, x.float()
    if xq:
        q, qs = per_token_group_quant(x, 128)
        xin, xs = q.to(torch.bfloat16), qs.contiguous()
    return x, wa, sa, wb, sb, xin, xs


@pytest.mark.parametrize("nprog", [3, 5])
@pytest.mark.parametrize("xq,dot", [(False, 0), (True, 2), (False, 2)], ids=["xw", "xq-fp8", "fp8"])
def test_span_pair_gives_the_two_spans_partials(nprog, xq, dot):
    """gemv_span_pair: two GEMVs over one x (A 200 columns, one tile partial; B 384), each in its
    own spans (PER 2 and 3 on 5 programs: spans that end inside tiles), run as one loop write
    the partials two gemv_span calls write, bit for bit, and both meet the reference."""
    from mono_common.stages.entries import gemv_pair_entry

    x, wa, sa, wb, sb, xin, xs = _pair_inputs(xq)
    pera, perb = span_per(200, K, 128, 128, nprog), span_per(384, K, 128, 128, nprog)
    got = {}
    for pair in (False, True):
        oa = torch.zeros(span_slots(K, 128, pera), 3, 200)
        ob = torch.zeros(span_slots(K, 128, perb), 3, 384)
        gemv_pair_entry[(nprog,)](xin, xs, wa[0], sa[0], oa, wb[0], sb[0], ob, NA=200, NB=384, PERA=pera, PERB=perb,
                                  K=K, W=3, BM=16, BN=128, XQ=xq, DOT=dot, PAIR=pair)
        got[pair] = (oa, ob)
    assert torch.equal(got[False][0], got[True][0]) and torch.equal(got[False][1], got[True][1])
    tol = 1e-6 if dot == 0 else 2e-2  # e4m3 x e4m3 MMAs quantise x; the bf16 form holds it exact
    assert _rel(got[True][0].sum(0), block_fp8_gemv(x, wa[0], sa[0])) < tol
    assert _rel(got[True][1].sum(0), block_fp8_gemv(x, wb[0], sb[0])) < tol


@pytest.mark.parametrize("nprog", [3, 5])
@pytest.mark.parametrize("xq,dot", [(False, 0), (True, 2)], ids=["xw", "xq-fp8"])
def test_span_joint_is_one_span_gemv_over_both_gemvs_tiles(nprog, xq, dot):
    """gemv_span_joint: A (200 columns: one tile partial) then B (384) as one stream-K GEMV
    writes, tile for tile, the partials one gemv_span writes over the stacked weights [A padded
    to its tiles; B] (the same spans, PER 3 and 2 on 3 and 5 programs: spans across A's end and
    inside tiles), bit for bit, each tile's in its own GEMV's buffer; both meet the reference."""
    from mono_common.stages.entries import gemv_pair_entry
    from mono_common.stages.gemv_host import alloc_out, launch_gemv

    x, wa, sa, wb, sb, xin, xs = _pair_inputs(xq)
    per = span_per(256 + 384, K, 128, 128, nprog)
    oa = torch.zeros(span_slots(K, 128, per), 3, 200)
    ob = torch.zeros(span_slots(K, 128, per), 3, 384)
    gemv_pair_entry[(nprog,)](xin, xs, wa[0], sa[0], oa, wb[0], sb[0], ob, NA=200, NB=384, PERA=per, PERB=0,
                              K=K, W=3, BM=16, BN=128, XQ=xq, DOT=dot, PAIR=2)
    # the stacked GEMV: A's 56 pad columns zero (their scales A's second block row's)
    w = torch.cat([wa[0], torch.zeros(56, K, dtype=torch.uint8), wb[0]])[None]
    s = torch.cat([sa[0], sb[0]])[None]
    plan = GemvPlan.make(640, K, 3, nprog=nprog, bn=128, span=True, dot=dot)
    assert plan.PER == per
    out = alloc_out(plan, 1, "cpu")
    launch_gemv(plan, xin if xq else x, w, s, out, xs=xs if xq else None)
    assert torch.equal(oa, out[0][:, :, :200]) and torch.equal(ob, out[0][:, :, 256:])
    assert oa.abs().sum() > 0 and ob.abs().sum() > 0
    tol = 1e-6 if dot == 0 else 2e-2  # e4m3 x e4m3 MMAs quantise x; the bf16 form holds it exact
    assert _rel(oa.sum(0), block_fp8_gemv(x, wa[0], sa[0])) < tol
    assert _rel(ob.sum(0), block_fp8_gemv(x, wb[0], sb[0])) < tol
