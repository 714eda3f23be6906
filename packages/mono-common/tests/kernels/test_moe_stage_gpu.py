"""The MoE expert stage (mono_common.stages.moe) on a GPU at a GLM-5.3 TP8 rank's shapes, against
its reference computed on the CPU (a CUDA-side reference disagreed earlier), fused (one launch,
grid hand-offs between gate_up, SiLU and down) and staged (one launch a stage), over two steps
of one launch (correctness only: timing is `mono_common.bench.expert`)."""

import pytest

torch = pytest.importorskip("torch")

# GLM-5.3 at one TP8 rank: hidden 6144, 256 routed experts top-8 + 1 shared, moe_intermediate
# 2048 / 8 (mono_glm53.config REAL.tp_shard(8, 0).moe_inter_per_rank; mono-common imports no model)
H, E, TOPK, I = 6144, 256, 8, 2048 // 8
SCALE = 2.5


def _nprog():
    return 2 * torch.cuda.get_device_properties(0).multi_processor_count


def _fp8_bits(shape, g):
    v = torch.randn(shape, generator=g, device="cuda") * 64
    return v.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def _scales(shape, g):
    return torch.rand(shape, generator=g, device="cuda") * 1e-3 + 1e-4


def _lists(pattern, rows, L, g):
    """ids / wts [L, rows, TOPK], each row's ids sorted (the stage sums in expert-id order, the
    reference in list order)."""
    if pattern == "distinct":  # every row its own top-8 (rows overlap by chance only)
        ids = torch.stack([torch.stack([torch.randperm(E, generator=g, device="cuda")[:TOPK]
                                        for _ in range(rows)]) for _ in range(L)])
    else:  # every row the same 8 experts: 9 slots (8 routed + the shared one) at any width
        ids = torch.stack([torch.randperm(E, generator=g, device="cuda")[:TOPK].expand(rows, TOPK)
                           for _ in range(L)])
    ids = ids.sort(-1).values.to(torch.int32).contiguous()
    wts = torch.rand(L, rows, TOPK, generator=g, device="cuda") + 0.05
    return ids, (wts / wts.sum(-1, keepdim=True)).contiguous()


def _reference(x, ids, wts, experts, shared):
    """On the CPU, with only the experts the lists name copied there."""
    from mono_common.ref.moe import moe_over_slots

    uniq = ids.unique()
    sub = tuple(t.index_select(0, uniq.long()).cpu() for t in experts)
    local = torch.searchsorted(uniq, ids).to(torch.int32).cpu()
    return moe_over_slots(x.cpu(), local, wts.cpu(), sub, tuple(t.cpu() for t in shared), SCALE)


def _case(pattern, rows, L, seed):
    """(experts, shared, ids, wts, x) of L steps at `rows` rows: the routed pool, one shared
    expert a step, the lists and x [rows, H] bf16."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    experts = (_fp8_bits((E, 2 * I, H), g), _scales((E, 2 * I // 128, H // 128), g),
               _fp8_bits((E, H, I), g), _scales((E, H // 128, I // 128), g))
    shared = (_fp8_bits((L, 2 * I, H), g), _scales((L, 2 * I // 128, H // 128), g),
              _fp8_bits((L, H, I), g), _scales((L, H // 128, I // 128), g))
    ids, wts = _lists(pattern, rows, L, g)
    return experts, shared, ids, wts, torch.randn(rows, H, generator=g, device="cuda").to(torch.bfloat16)


@pytest.mark.parametrize("pattern", ["distinct", "same-experts"])
@pytest.mark.parametrize("rows", [1, 2, 8])
def test_moe_stage_on_gpu(pattern, rows):
    from mono_common.stages.moe_host import MoePlan, alloc_buffers, launch_moe, quantise_x

    L = 2
    experts, shared, ids, wts, x = _case(pattern, rows, L, rows * 7 + len(pattern))
    plan = MoePlan.make(H, I, E, TOPK, rows, _nprog())
    xq, xs = quantise_x(x)
    outs = {}
    for mode, kw in (("fused", {}), ("fused+bar", dict(barrier=True)), ("staged", dict(staged=True))):
        bufs = alloc_buffers(plan, L, "cuda")
        outs[mode] = launch_moe(plan, xq, xs, ids, wts, experts, shared, SCALE, bufs, **kw).clone()
        if mode == "fused":
            want_slots = [1 + ids[li].unique().numel() for li in range(L)]
            assert bufs["nslot"].tolist() == want_slots
    torch.cuda.synchronize()
    # every partial is summed in a fixed order: the modes agree bit for bit
    assert torch.equal(outs["fused"], outs["staged"]) and torch.equal(outs["fused"], outs["fused+bar"])
    for li in range(L):
        want = _reference(x, ids[li], wts[li], experts, tuple(t[li] for t in shared)).float()
        got = outs["fused"][li].float().cpu()
        diff = (got - want).abs()
        rel = (diff.norm() / want.norm()).item()
        print(f"moe {pattern} rows {rows} step {li}: rel_err {rel:.3e}, exact {(diff == 0).float().mean():.4f}")
        # fp32 sums in another order than the reference's flip a rare bf16 rounding, carried
        # through SiLU and the requantisation (the interpreter's figure: <= 3e-4)
        assert rel < 2e-3, (li, rel)
        assert (diff <= want.abs() * 2 ** -6 + 1e-3).float().mean() > 0.99, (li, rel)


@pytest.mark.parametrize("rows", [1, 8])
def test_f16_weights_give_the_fastcvt_bits_on_gpu(rows):
    """f16 (the e4m3 weights to f16 on sm_90's conversion unit, f16 MMAs, the quantised x and
    SiLU output as f16) against fastcvt (to bf16 on the integer pipes, bf16 MMAs): the same
    exact products, so the same bits, fused over two steps."""
    from mono_common.stages.moe_host import MoePlan, alloc_buffers, launch_moe, quantise_x

    L = 2
    experts, shared, ids, wts, x = _case("distinct", rows, L, rows + 91)
    xq, xs = quantise_x(x)
    outs = []
    for kw in (dict(fastcvt=True), dict(f16=True)):
        plan = MoePlan.make(H, I, E, TOPK, rows, _nprog(), down_stages=3, down_step=2 if rows >= 8 else 1, **kw)
        outs.append(launch_moe(plan, xq, xs, ids, wts, experts, shared, SCALE, alloc_buffers(plan, L, "cuda")).clone())
    torch.cuda.synchronize()
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


@pytest.mark.parametrize("rows", [1, 2, 8])
def test_down_items_give_the_slot_loop_bits_on_gpu(rows):
    """down as (slot, column tile) items, each tile summed by the program of its last item
    (`moe_down_items`), against the pipelined slot loop: the same tiles and the same sums in
    slot order, so the same bits, fused over two steps with and without a hand-off after each
    (the tile counters set back to zero by each combine, so the second step counts afresh)."""
    from mono_common.stages.moe_host import MoePlan, alloc_buffers, launch_moe, quantise_x

    L = 2
    experts, shared, ids, wts, x = _case("distinct", rows, L, rows + 53)
    xq, xs = quantise_x(x)
    outs = []
    for kw, bar in ((dict(down_ids=True), False), (dict(down_items=True), False), (dict(down_items=True), True)):
        plan = MoePlan.make(H, I, E, TOPK, rows, _nprog(), down_stages=3, f16=True, **kw)
        bufs = alloc_buffers(plan, L, "cuda")
        outs.append(launch_moe(plan, xq, xs, ids, wts, experts, shared, SCALE, bufs, barrier=bar).clone())
        if plan.down_items:
            assert not bufs["dcnt"].any()  # every counter back at zero
    torch.cuda.synchronize()
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    assert torch.equal(outs[0].view(torch.int16), outs[2].view(torch.int16))


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("bnd", [64, 128])
def test_e4m3_down_items_match_the_reference_on_gpu(rows, bnd):
    """down's items on e4m3 MMAs (`moe_down_items` DDOT): fused with and without a hand-off
    after each step and staged give the same bits (fixed sums), and the output is within the
    exact forms' bound of the reference, 2e-3: down's e4m3 accumulation is not exact fp32, but
    nothing after down is requantised (measured 1.4e-3 to 1.6e-3, H100, session 38; a bench
    form, not the layer's)."""
    from mono_common.stages.moe_host import MoePlan, alloc_buffers, launch_moe, quantise_x

    L = 2
    experts, shared, ids, wts, x = _case("distinct", rows, L, rows + bnd)
    xq, xs = quantise_x(x)
    plan = MoePlan.make(H, I, E, TOPK, rows, _nprog(), down_stages=3, down_items=True, down_dot=2, bnd=bnd)
    outs = {}
    for mode, kw in (("fused", {}), ("fused+bar", dict(barrier=True)), ("staged", dict(staged=True))):
        outs[mode] = launch_moe(plan, xq, xs, ids, wts, experts, shared, SCALE, alloc_buffers(plan, L, "cuda"),
                                **kw).clone()
    torch.cuda.synchronize()
    assert torch.equal(outs["fused"], outs["staged"]) and torch.equal(outs["fused"], outs["fused+bar"])
    for li in range(L):
        want = _reference(x, ids[li], wts[li], experts, tuple(t[li] for t in shared)).float()
        got = outs["fused"][li].float().cpu()
        rel = ((got - want).norm() / want.norm()).item()
        print(f"e4m3 down items bnd {bnd} rows {rows} step {li}: rel_err {rel:.3e}")
        assert rel < 2e-3, (li, rel)
