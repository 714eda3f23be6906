"""The library's MoE expert stage (mono_common.stages.moe) under the interpreter against its
reference (mono_common.ref.moe) at a tiny shape, staged (one launch a stage), over slot
patterns: distinct experts per row, one expert shared by every row, zero weights, one slot,
empty lists (the shared expert alone), and two steps of one launch reading different lists;
the same patterns with gate_up as stream-K spans (MoePlan span), against the reference and the
tile form."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from mono_common.ref.moe import moe_over_slots  # noqa: E402
from mono_common.stages.moe_host import MoePlan, run_moe  # noqa: E402

H, I, E = 256, 256, 16  # 2 K blocks each way, as the GLM-5.3 TP8 shard's down (I = 256)
SCALE = 2.5


def _fp8_bits(shape, g):
    return (torch.randn(shape, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def _scales(shape, g):
    return torch.rand(shape, generator=g) * 1e-3 + 1e-4


def _weights(L, seed=0):
    g = torch.Generator().manual_seed(seed)
    experts = (_fp8_bits((E, 2 * I, H), g), _scales((E, 2 * I // 128, H // 128), g),
               _fp8_bits((E, H, I), g), _scales((E, H // 128, I // 128), g))
    shared = (_fp8_bits((L, 2 * I, H), g), _scales((L, 2 * I // 128, H // 128), g),
              _fp8_bits((L, H, I), g), _scales((L, H // 128, I // 128), g))
    return experts, shared


def _sorted(ids, wts):
    # the stage sums a row's slots in expert-id order; the reference in list order
    order = ids.argsort(dim=-1, stable=True)
    return ids.gather(-1, order).contiguous(), wts.gather(-1, order).contiguous()


def _lists(pattern, W, K, g):
    if pattern == "distinct":
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(W)])
    elif pattern == "same-experts":  # every row picks the same experts: K slots for W rows
        ids = torch.randperm(E, generator=g)[:K].expand(W, K)
    elif pattern == "overlap":  # rows share some experts, not all
        base = torch.randperm(E, generator=g)[: K + 1]
        ids = torch.stack([base[torch.arange(K) + (m % 2)] for m in range(W)])
    elif pattern == "empty":  # no routed expert: the shared expert alone
        ids = torch.full((W, K), -1)
    else:
        raise ValueError(pattern)
    wts = torch.rand(W, K, generator=g) + 0.05
    wts = wts / wts.sum(-1, keepdim=True)
    if pattern == "overlap":
        wts[0, 1] = 0.0  # a selected expert with routing weight 0
    return _sorted(ids.to(torch.int32), wts.float())


def _compare(got, want):
    diff = (got.float() - want.float()).abs()
    rel = (diff.norm() / want.float().norm()).item()
    # fp32 sums in another order than the reference's: a rare bf16 rounding flips, then carried
    # through SiLU and the requantisation, so a few outputs move by an ulp or so, no more
    assert rel < 2e-3, rel
    assert (diff <= want.float().abs() * 2 ** -6 + 1e-3).float().mean() > 0.99, rel
    return rel


@pytest.mark.parametrize("pattern,W,K,ksg", [
    ("distinct", 3, 4, None), ("distinct", 2, 4, 2), ("same-experts", 3, 4, None), ("overlap", 4, 3, None),
    ("distinct", 1, 1, None), ("empty", 2, 2, None),
], ids=["distinct", "distinct-splitk", "same-experts", "overlap-zero-weight", "one-slot", "shared-only"])
def test_moe_stage_matches_the_reference(pattern, W, K, ksg):
    g = torch.Generator().manual_seed(W * 10 + K)
    experts, shared = _weights(1)
    ids, wts = _lists(pattern, W, K, g)
    x = torch.randn(W, H, generator=g).to(torch.bfloat16)
    plan = MoePlan.make(H, I, E, K, W, nprog=3, ksg=ksg)
    got = run_moe(plan, x, ids[None], wts[None], experts, shared, SCALE, staged=True)[0]
    want = moe_over_slots(x, ids, wts, experts, tuple(t[0] for t in shared), SCALE)
    _compare(got, want)


# the stream-K gate_up (MoePlan span): nprog 3 -> spans of 3 items, a column tile's K blocks
# split between two spans; nprog 5 -> spans of 2, one tile each; per 1 -> each K block its own
# span (the most partial slots); nprog 2 with per 1 -> more spans than programs
SPAN_CASES = [("distinct", 3, 4, 3, None), ("distinct", 2, 4, 5, None), ("same-experts", 3, 4, 3, 1),
              ("overlap", 4, 3, 2, 1), ("distinct", 1, 1, 3, None), ("empty", 2, 2, 3, None)]


@pytest.mark.parametrize("pattern,W,K,nprog,per", SPAN_CASES,
                         ids=["distinct", "distinct-5prog", "same-experts-per1", "overlap-zero-weight-2prog",
                              "one-slot", "shared-only"])
def test_moe_span_gateup_matches_the_reference_and_the_tiles(pattern, W, K, nprog, per):
    g = torch.Generator().manual_seed(W * 10 + K)
    experts, shared = _weights(1)
    ids, wts = _lists(pattern, W, K, g)
    x = torch.randn(W, H, generator=g).to(torch.bfloat16)
    plan = MoePlan.make(H, I, E, K, W, nprog=nprog, span=True, per=per)
    assert plan.span and plan.BN == 128 and plan.KSG == 2
    got = run_moe(plan, x, ids[None], wts[None], experts, shared, SCALE, staged=True)[0]
    want = moe_over_slots(x, ids, wts, experts, tuple(t[0] for t in shared), SCALE)
    _compare(got, want)
    tiles = run_moe(MoePlan.make(H, I, E, K, W, nprog=nprog), x, ids[None], wts[None], experts, shared, SCALE,
                    staged=True)[0]
    _compare(got, tiles)


@pytest.mark.parametrize("form", [dict(down_stages=3), dict(down_stages=2, fastcvt=True),
                                  dict(down_stages=3, down_step=2), dict(gate_stages=3),
                                  dict(down_stages=3, down_ids=True), dict(down_stages=3, down_step=2, down_ids=True),
                                  dict(f16=True), dict(down_stages=3, down_step=2, f16=True, gate_dot=1),
                                  dict(down_stages=3, down_step=4, down_ids=True, bnd=16),
                                  dict(down_stages=3, down_items=True), dict(down_stages=2, down_items=True, bnd=16)],
                         ids=["down-pipelined", "down-pipelined-fastcvt", "down-two-slots", "gate-pipelined",
                              "down-ids-in-registers", "down-two-slots-ids-in-registers", "f16",
                              "f16-two-slots-swap-ab", "down-four-slots-16-columns", "down-items",
                              "down-items-16-columns"])
@pytest.mark.parametrize("pattern,W,K,ksg", [("distinct", 3, 4, None), ("distinct", 2, 4, 2), ("overlap", 4, 3, None),
                                             ("empty", 2, 2, None)],
                         ids=["distinct", "distinct-splitk", "overlap-zero-weight", "shared-only"])
def test_moe_loop_forms_give_the_same_bits(form, pattern, W, K, ksg):
    # the pipelined down slot loop (slot 0's weights picked by pointer, two slots an iteration
    # with the odd last one dropped) and gate_up's pipelined k-loops reorder loads, never sums:
    # the default form's bits (fastcvt is the cast under the interpreter; its sm_90 path is
    # checked code by code on the GPU; f16 converts to f16 and multiplies f16 operands, here
    # through its buffers' f16 bits, on the GPU against fastcvt's bits)
    g = torch.Generator().manual_seed(W * 10 + K + 7)
    experts, shared = _weights(2, seed=3)
    ids, wts = _lists(pattern, W, K, g)
    ids2, wts2 = _lists("distinct", W, K, g)
    ids, wts = torch.stack([ids, ids2]), torch.stack([wts, wts2])
    x = torch.randn(W, H, generator=g).to(torch.bfloat16)
    want = run_moe(MoePlan.make(H, I, E, K, W, nprog=3, ksg=ksg), x, ids, wts, experts, shared, SCALE, staged=True)
    got = run_moe(MoePlan.make(H, I, E, K, W, nprog=3, ksg=ksg, **form), x, ids, wts, experts, shared, SCALE,
                  staged=True)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    ref = moe_over_slots(x, ids[0], wts[0], experts, tuple(t[0] for t in shared), SCALE)
    _compare(got[0], ref)


def test_moe_down_items_on_one_program_give_the_same_bits():
    # one program runs every item (ns * 8 of them: more than the 64 arrivals of one RMW), so
    # it arrives in several vector RMWs and combines every tile itself
    g = torch.Generator().manual_seed(5)
    experts, shared = _weights(1, seed=6)
    W, K = 3, 4
    ids, wts = _lists("distinct", W, K, g)
    x = torch.randn(W, H, generator=g).to(torch.bfloat16)
    want = run_moe(MoePlan.make(H, I, E, K, W, nprog=1), x, ids[None], wts[None], experts, shared, SCALE, staged=True)
    plan = MoePlan.make(H, I, E, K, W, nprog=1, down_stages=2, down_items=True)
    assert (1 + W * K) * (H // plan.BND) > 64
    got = run_moe(plan, x, ids[None], wts[None], experts, shared, SCALE, staged=True)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("bn,span,gdot", [(64, False, 1), (128, False, 1), (128, True, 1), (64, True, 0)],
                         ids=["tiles-wx64", "tiles-wx128", "spans-wx128", "spans-xw64"])
def test_moe_bf16_gateup_forms_match_the_reference(bn, span, gdot):
    # gate_up with the weights on the MMA's M side, or as stream-K spans on bf16 MMAs: the same
    # exact products, summed in another order, so the reference's bound rather than the bits
    g = torch.Generator().manual_seed(31)
    experts, shared = _weights(1, seed=4)
    W, K = 3, 4
    ids, wts = _lists("overlap", W, K, g)
    x = torch.randn(W, H, generator=g).to(torch.bfloat16)
    plan = MoePlan.make(H, I, E, K, W, nprog=3, bn=bn, span=span, gate_dot=gdot, down_stages=2, down_step=2)
    got = run_moe(plan, x, ids[None], wts[None], experts, shared, SCALE, staged=True)[0]
    _compare(got, moe_over_slots(x, ids, wts, experts, tuple(t[0] for t in shared), SCALE))


@pytest.mark.parametrize("bnd", [32, 64])
def test_moe_e4m3_down_items_match_the_reference(bnd):
    # down's items on e4m3 MMAs (the weights on the M side): under the interpreter the e4m3
    # dot is exact fp32 on the upcasts, so the reference's bound holds (on sm_90 the MMA's own
    # accumulation differs: the GPU test bounds that)
    g = torch.Generator().manual_seed(41)
    experts, shared = _weights(1, seed=8)
    W, K = 3, 4
    ids, wts = _lists("overlap", W, K, g)
    x = torch.randn(W, H, generator=g).to(torch.bfloat16)
    plan = MoePlan.make(H, I, E, K, W, nprog=3, down_stages=2, down_items=True, down_dot=2, bnd=bnd)
    got = run_moe(plan, x, ids[None], wts[None], experts, shared, SCALE, staged=True)[0]
    _compare(got, moe_over_slots(x, ids, wts, experts, tuple(t[0] for t in shared), SCALE))


def test_moe_loop_form_options_are_checked():
    with pytest.raises(ValueError, match="down step"):
        MoePlan.make(H, I, E, 2, 1, 4, down_step=2)
    with pytest.raises(ValueError, match="down step"):
        MoePlan.make(H, I, E, 2, 1, 4, down_stages=3, down_step=3)
    for kw in (dict(), dict(down_stages=3, down_ids=True), dict(down_stages=3, down_step=2)):
        with pytest.raises(ValueError, match="down_items is its own down loop"):
            MoePlan.make(H, I, E, 2, 1, 4, down_items=True, **kw)
    for kw in (dict(down_dot=1), dict(down_dot=2, down_stages=3), dict(down_dot=2, down_stages=3, down_items=True,
                                                                       f16=True)):
        with pytest.raises(ValueError, match="down MMA form"):
            MoePlan.make(H, I, E, 2, 1, 4, **kw)
    with pytest.raises(ValueError, match="down_items combines at most 8 rows"):
        MoePlan.make(H, I, E, 2, 9, 4, down_items=True, down_stages=3)
    with pytest.raises(ValueError, match="MMA form"):
        MoePlan.make(H, I, E, 2, 1, 4, gate_dot=2)  # the e4m3 form is the spans' only
    with pytest.raises(ValueError, match="depths"):
        MoePlan.make(H, I, E, 2, 1, 4, gate_stages=-1)
    with pytest.raises(ValueError, match="down_ids is a form of the pipelined down loop"):
        MoePlan.make(H, I, E, 2, 1, 4, down_ids=True)
    for kw in (dict(fastcvt=True), dict(span=True), dict(span=True, gate_dot=2)):
        with pytest.raises(ValueError, match="f16 converts the weights for bf16-form MMAs"):
            MoePlan.make(H, I, E, 2, 1, 4, f16=True, **kw)


def test_moe_span_steps_leave_no_stale_partials():
    # two steps share gu: a step with many slots then one with few (one of them empty lists)
    # must not read the first step's partials
    g = torch.Generator().manual_seed(13)
    W, K, L = 2, 3, 2
    experts, shared = _weights(L, seed=2)
    a = _lists("distinct", W, K, g)
    b = _lists("empty", W, K, g)
    ids = torch.stack([a[0], b[0]])
    wts = torch.stack([a[1], b[1]])
    x = torch.randn(W, H, generator=g).to(torch.bfloat16)
    plan = MoePlan.make(H, I, E, K, W, nprog=3, span=True, per=1)
    got = run_moe(plan, x, ids, wts, experts, shared, SCALE, staged=True)
    for li in range(L):
        want = moe_over_slots(x, ids[li], wts[li], experts, tuple(t[li] for t in shared), SCALE)
        _compare(got[li], want)


def test_moe_stage_slot_tables():
    # slot 0 the shared expert, then each selected expert once in id order; a row's weight of
    # an expert it did not select is 0
    from mono_common.stages.moe_host import alloc_buffers, launch_moe, quantise_x

    g = torch.Generator().manual_seed(7)
    experts, shared = _weights(1)
    W, K = 2, 3
    ids = torch.tensor([[1, 5, 9], [5, 9, 12]], dtype=torch.int32)
    wts = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.0, 0.4]])
    plan = MoePlan.make(H, I, E, K, W, nprog=2)
    bufs = alloc_buffers(plan, 1, "cpu")
    xq, xs = quantise_x(torch.randn(W, H, generator=g).to(torch.bfloat16))
    launch_moe(plan, xq, xs, ids[None], wts[None], experts, shared, SCALE, bufs, staged=True)
    assert bufs["nslot"].tolist() == [5]
    assert bufs["slot_e"][0, 1:5].tolist() == [1, 5, 9, 12]
    want = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.6, 0.0, 0.4]])
    assert torch.equal(bufs["slot_w"][0, :, 1:5], want)


def test_moe_stage_steps_read_their_own_lists_and_shared_expert():
    g = torch.Generator().manual_seed(11)
    W, K, L = 2, 2, 2
    experts, shared = _weights(L, seed=1)
    lists = [_lists("distinct", W, K, g) for _ in range(L)]
    ids = torch.stack([a for a, _ in lists])
    wts = torch.stack([b for _, b in lists])
    x = torch.randn(W, H, generator=g).to(torch.bfloat16)
    plan = MoePlan.make(H, I, E, K, W, nprog=4)
    got = run_moe(plan, x, ids, wts, experts, shared, SCALE, staged=True)
    for li in range(L):
        want = moe_over_slots(x, ids[li], wts[li], experts, tuple(t[li] for t in shared), SCALE)
        _compare(got[li], want)


def test_plan_refuses_bad_shapes():
    with pytest.raises(ValueError, match="power of two"):
        MoePlan.make(H, I, 12, 2, 1, 4)
    with pytest.raises(ValueError, match="multiple of the block"):
        MoePlan.make(200, I, E, 2, 1, 4)
    with pytest.raises(ValueError, match="does not divide"):
        MoePlan.make(H, I, E, 2, 1, 4, ksg=3)
    with pytest.raises(ValueError, match="no split-K"):
        MoePlan.make(H, I, E, 2, 1, 4, span=True, ksg=2)
    with pytest.raises(ValueError, match="at least 1"):
        MoePlan.make(H, I, E, 2, 1, 4, span=True, per=0)
    with pytest.raises(ValueError, match="multiple of 16"):
        MoePlan.make(H, I, E, 2, 1, 4, span=True, bn=100)
    with pytest.raises(ValueError, match="down tile 256 is wider than the scale block 128"):
        MoePlan.make(H, I, E, 2, 1, 4, bnd=256)


def test_span_plan_partials_and_default_span_length():
    # the GLM-5.3 TP8 rank on the H200's 264 programs: 9 slots of 4 x 48 items over the grid
    p = MoePlan.make(6144, 256, 256, 8, 1, 264, span=True)
    assert (p.BN, p.PER, p.KSG) == (128, 7, 8)
    p = MoePlan.make(6144, 256, 256, 8, 1, 264)  # the tile form as before
    assert (p.span, p.BN, p.KSG) == (False, 64, 4)
