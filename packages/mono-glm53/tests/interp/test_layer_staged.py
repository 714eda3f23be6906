"""Staged mode of the GLM-5.3 layer kernel under TRITON_INTERPRET=1 equals the reference.

Tiny config (mono_glm53.config.tiny), 3 programs. On the CPU the reference's GEMMs are the
exact fp32 dequantised ones; the kernel's per-block accumulation differs from them only in
fp32 summation order, so the caches are within one bf16 ulp (bit-identical for most seeds:
seed 0 gives identical MLA rows, index-K bytes and scales) and everything is within NUMERICS.
"""

import pytest
import triton
import triton.language as tl

from mono_glm53.config import tiny
from mono_glm53.kernels.harness import run_case
from mono_glm53.kernels.numerics import failures
from mono_glm53.kernels.stages import _aq_blocks

CASES = [
    # width, rows, ctx, indexer, indexer_rope_interleave (fused indexer path)
    (2, 1, 10, True, False),   # 1-row step at width 2 (pad row), ctx < top-k: take all
    (2, 2, 40, True, True),    # ctx > top-k: exact selection, fused indexer path
    (4, 3, 40, True, False),   # pad row, Hadamard indexer path
    (8, 5, 24, True, True),    # width 8, three pad rows
    (2, 2, 40, False, False),  # layer without an indexer: previous layer's top-k
]


@pytest.mark.parametrize("width,rows,ctx,indexer,inter", CASES)
def test_staged_equals_reference(width, rows, ctx, indexer, inter):
    # 8 index heads: with tiny()'s 2, a quarter of the tokens score exactly 0 (every head's
    # q.k negative) and the top-k boundary is a tie that torch.topk breaks differently
    s = tiny(indexer_rope_interleave=inter, index_heads=8)
    m = run_case(s, width, rows, ctx, indexer, modes=("staged",), nprog=3, seed=width + ctx)
    assert not failures(m), m
    # CPU: tighter than the GPU bounds (same reference GEMM values up to summation order)
    assert m["glm53_layer.mla_cache.max_abs_ulps"] <= 1.0, m
    assert m["glm53_layer.residual.cosine_min"] > 0.99999, m
    if indexer:
        assert m["glm53_layer.index_k.dequant_cosine_min"] > 0.9999, m


def test_staged_equals_reference_several_chunks():
    """Top-k 128 of ctx 700: three 256-key top-k chunks per row, and two 64-token MLA chunks
    to combine (the tiny top-k of 16 gives one of each)."""
    s = tiny(index_heads=8, index_topk=128)
    m = run_case(s, 2, 2, 700, True, modes=("staged",), nprog=3, seed=7)
    assert not failures(m), m
    assert m["glm53_layer.mla_cache.max_abs_ulps"] <= 1.0, m
    assert m["glm53_layer.residual.cosine_min"] > 0.99999, m


def test_seed0_caches_bit_exact():
    """With seed 0 no GEMM output flips a bf16 rounding: caches and index keys bit-exact."""
    m = run_case(tiny(), 2, 1, 10, True, modes=("staged",), nprog=2, seed=0)
    assert m["glm53_layer.mla_cache.max_abs_ulps"] == 0.0, m
    assert m["glm53_layer.index_k.bytes_equal_min"] == 1.0, m
    assert m["glm53_layer.index_k.scale_rel_max"] == 0.0, m


@pytest.mark.parametrize("width,rows,ctx,indexer", [(4, 3, 40, True), (2, 2, 40, False)])
def test_staged_stays_inside_its_buffers(width, rows, ctx, indexer):
    """Every buffer, weight, cache and the page table fenced by poisoned bands
    (harness.fenced_case): no band written, and no poison read into a result."""
    from mono_glm53.kernels.harness import fenced_case

    s = tiny(index_heads=8)
    m, bad = fenced_case(s, width, rows, ctx, indexer, modes=("staged",), nprog=3, seed=width + ctx)
    assert bad == [], bad
    assert not failures(m), m


def test_staged_other_grid_equals_reference():
    """Another grid (5 programs: other stream-K spans, which end inside column tiles, so other
    partial slots and another summation order) meets the same bounds."""
    s = tiny(index_heads=8)
    m = run_case(s, 4, 3, 40, True, modes=("staged",), nprog=5, seed=44)
    assert not failures(m), m
    assert m["glm53_layer.mla_cache.max_abs_ulps"] <= 1.0, m
    assert m["glm53_layer.residual.cosine_min"] > 0.99999, m


@pytest.mark.parametrize("inter", [False, True], ids=["hadamard-indexer", "fused-indexer"])
def test_producer_quantised_gemv_inputs_give_the_same_bits(inter):
    """Plan.XQP (GlmLayerKernel xq_producer): addnorm and latent quantise the q_a/kv_a and
    q_b/wq_b GEMVs' inputs once, the GEMVs read them: every output, cache row and index key
    equals the default's, where each K block quantises its own input."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(indexer_rope_interleave=inter, index_heads=8)
    c = build_case(s, 3, 40, True, seed=21)
    got = {}
    for xqp in (False, True):
        k = GlmLayerKernel(s, c.w, 4, max_seq_len=40, nprog=3, device="cpu", xq_producer=xqp)
        assert k.plan.XQP == xqp
        out, caches = kernel_out(c, k, "staged")
        got[xqp] = (out, caches, k.hnq.clone(), k.qnq.clone())
    (a, ca, _, _), (b, cb, hnq, qnq) = got[False], got[True]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)
    assert hnq[:3].abs().sum() > 0 and qnq[:3].abs().sum() > 0  # the quantised inputs were written


@pytest.mark.parametrize("width,rows,seed", [(4, 1, 5), (8, 5, 6)])
def test_pad_rows_route_to_no_expert(width, rows, seed):
    """A pad row (out_cache_loc -1) gets no routing weight and computes no expert of its own:
    the slot tables hold exactly the experts the real rows select (the reference routing of the
    kernel's own logits), and the pad rows' weights are zero. The case is one where the pad
    rows' all-zero logits would have selected an expert no real row selects."""
    import torch

    from mono_common.ref.routing import biased_topk
    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny()
    c = build_case(s, rows, 40, True, seed=seed)
    k = GlmLayerKernel(s, c.w, width, max_seq_len=40, nprog=3, device="cpu")
    kernel_out(c, k, "staged")
    lg = k.lg[0].clone()
    for ks in range(1, k.lg.shape[0]):  # the kernel's slot order, so the fp32 sums are its own
        lg = lg + k.lg[ks]
    bias = c.w["mlp.gate.e_score_correction_bias"].float()
    real = set(biased_topk(lg[:rows], bias, s.top_k)[1].flatten().tolist())
    pad = set(biased_topk(torch.zeros(1, s.n_experts), bias, s.top_k)[1].flatten().tolist())
    assert pad - real, "the case must have a pad-row expert no real row selects"
    ns = int(k.nslot.item())
    assert sorted(k.slot_e[1:ns].tolist()) == sorted(real)
    assert torch.equal(k.slot_w[rows:], torch.zeros_like(k.slot_w[rows:]))


def test_plan_knobs_give_the_default_bits():
    """The plan's knobs only move work between programs or regroup loads: down_step (two slots
    a pipelined step), gateup_split (with this shape's bf16 partial sums), qkva_programs with
    index_split (q_a/kv_a spans and the index tiles on disjoint programs, the path the TP8
    shard's plan takes; this grid is too small for `make_plan` to take it) write the default
    launch's outputs, MLA rows, index keys and top-k; out-of-range values are refused, all at once."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(moe_inter=64, index_topk=32)  # a slot's K in two blocks: down's pipelined loop
    c = build_case(s, 3, 40, True, seed=31)

    def run(**kw):
        k = GlmLayerKernel(s, c.w, 4, max_seq_len=40, nprog=24, device="cpu", **kw)
        out, caches = kernel_out(c, k, "staged")
        return k, out, caches

    k0, a, ca = run()
    assert k0.plan.DSTG > 0 and k0.plan.DSTEP == 1 and k0.plan.P1 == 0 and k0.plan.KSI > 2
    for kw in (dict(down_step=2), dict(gateup_split=1), dict(mla_stages=6), dict(index_tile=32),
               dict(gateup_stages=3, gateup_bn=16), dict(gateup_dot=1), dict(down_id_vector=True, down_step=2),
               dict(qkva_programs=20, index_split=2)):
        k, b, cb = run(**kw)
        assert all(torch.equal(x[:3], y[:3]) for x, y in zip(a, b)), kw
        assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k), kw
        assert torch.equal(k0.topk[:3], k.topk[:3]), kw
    assert (k.plan.P1, k.plan.KSI) == (20, 2)
    with pytest.raises(ValueError, match=r"unknown knobs \['gate_split'\].*; down_step 3 is not 1 or 2; gateup_dot 2 "
                                         r"is not 0 or 1.*; gateup_split 5 does not divide the 8 K blocks.*; "
                                         r"qkva_programs 24 is not 0 \(no split\) or in 1..23"):
        run(gate_split=2, down_step=3, gateup_split=5, qkva_programs=24, gateup_dot=2)
    with pytest.raises(ValueError, match="down_id_vector is a form of down's pipelined slot loop"):
        run(down_stages=0, down_id_vector=True)
    with pytest.raises(ValueError, match=r"mla_stages 9 is not 0 \(the launch's depth\) or 1..8; gateup_stages 7 "
                                         r"is not 0 .Triton's. or 1..6; index_tile 48 is not a power of two in "
                                         r"16..256; gateup_bn 48 is not 16, 32, 64 or 128"):
        run(mla_stages=9, index_tile=48, gateup_stages=7, gateup_bn=48)


def test_a_kernel_built_for_a_longer_served_context_gives_the_same_bits():
    """A server builds its kernels for its context length: page-table and score rows that wide,
    most of them past the rows' tokens. The index scores and the top-k stages number only the
    rows' tiles, so the launch writes what a kernel built for the rows' own context writes."""
    import dataclasses

    import torch

    from mono_glm53.bench import served_inputs
    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8, index_topk=16)
    c = build_case(s, 3, 40, True, seed=17, ctxs=[40, 9, 33])
    got = []
    for served in (None, 400):
        inputs = c.inputs if served is None else served_inputs(c.inputs, served, s.page)
        k = GlmLayerKernel(s, c.w, 4, max_seq_len=inputs.max_seq_len, nprog=5, device="cpu")
        got.append(kernel_out(dataclasses.replace(c, inputs=inputs), k, "staged"))
        assert k.max_seq_len == inputs.max_seq_len
    (a, ca), (b, cb) = got
    assert all(torch.equal(x[:3], y[:3]) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)
    assert (a[2][:3] >= 0).sum() == 16 + 9 + 16  # rows 0 and 2 select 16 of 40 and 33, row 1 all 9


def test_flag_hand_offs_publish_every_stage_and_give_the_default_bits():
    """handoff_flag (Plan.HF): each stage's last arrival publishes the stage's target in its
    flag word (the staged launch arrives without waiting; the waits are the GPU's to run), and
    the launch writes the default's outputs and caches."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel
    from mono_glm53.kernels.stages import FLAGS, NSTAGES

    s = tiny()
    c = build_case(s, 2, 40, True, seed=23)
    got = []
    for hf in (False, True):
        k = GlmLayerKernel(s, c.w, 2, max_seq_len=40, nprog=3, device="cpu", handoff_flag=hf)
        got.append(kernel_out(c, k, "staged"))
        got.append(kernel_out(c, k, "staged"))  # a second step: the next epoch's targets
        assert k.plan.HF == hf
        flags = k.cnt[FLAGS.value: FLAGS.value + NSTAGES - 1].tolist()
        assert flags == ([2 * 3] * (NSTAGES - 1) if hf else [0] * (NSTAGES - 1))
        assert k.cnt[: NSTAGES - 1].tolist() == [2 * 3] * (NSTAGES - 1)
    for (a, ca), (b, cb) in ((got[0], got[2]), (got[1], got[3])):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)


@pytest.mark.parametrize("knobs", [dict(qkva_fixup=True), dict(qb_fixup=True), dict(oproj_fixup=True)])
def test_gemv_fixups_sum_each_column_tile_once_and_give_the_default_bits(knobs):
    """qkva_fixup (Plan.FIX1), qb_fixup (FIX3), oproj_fixup (FIX9): each q_a/kv_a (q_b, wq_b;
    o_proj) column tile's last span sums the tile's partial slots into slot 0 and latent
    (absorb; postnorm) reads that slot alone; the outputs and caches are the
    default's, two steps in a row (the tile counters count on: epoch times the tile's spans),
    and from a restart near the counters' 2**31 wrap (`set_sync`)."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny()
    c = build_case(s, 2, 40, True, seed=29)
    got = {}
    for fix in (False, True):
        k = GlmLayerKernel(s, c.w, 2, max_seq_len=40, nprog=5, device="cpu", **(knobs if fix else {}))
        assert k.plan.KS1 > 1 and k.plan.KS3 > 1 and k.plan.KSQ > 1
        assert k.plan.KS9 > 1
        assert (k.plan.FIX1, k.plan.FIX3, k.plan.FIX9) == tuple(fix and n in knobs for n in ("qkva_fixup", "qb_fixup",
                                                                                              "oproj_fixup"))
        got[fix] = [kernel_out(c, k, "staged") for _ in range(2)]
        k.set_sync(2 ** 31 // 5 - 1)
        got[fix].append(kernel_out(c, k, "staged"))
        if fix:
            k.guard.check()
    for (a, ca), (b, cb) in zip(got[False], got[True]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)


def test_folded_stages_give_the_default_bits():
    """norm_in_qkva (Plan.AQ: addnorm's work done by the q_a/kv_a programs, no stage or
    hand-off of its own), hist_in_scores (Plan.TKF: the top-k's first radix pass done by the
    index scores, its histograms zeroed two stages before) and latent_late (Plan.LQ: the MLA
    cache rows and index keys written in the absorb stage), alone and together, with the
    q_a/kv_a spans beside the index tiles and without producer-quantised inputs: the default's
    outputs, caches and top-k, three steps in a row (the histograms start from zero each
    step), rows above and at or below the top-k."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(moe_inter=64, index_topk=32)
    c = build_case(s, 3, 40, True, seed=37, ctxs=[40, 20, 33])

    def steps(**knobs):
        k = GlmLayerKernel(s, c.w, 4, max_seq_len=40, nprog=24, device="cpu", **knobs)
        return k, [kernel_out(c, k, "staged") for _ in range(3)], k.topk.clone()

    _, want, want_topk = steps()
    assert (want_topk[:3] >= 0).sum(1).tolist() == [32, 20, 32]
    for knobs in (dict(norm_in_qkva=True, hist_in_scores=True, qkva_programs=20, index_split=2),
                  dict(norm_in_qkva=True, xq_producer=False), dict(hist_in_scores=True, latent_late=True)):
        k, got, topk = steps(**knobs)
        assert (k.plan.AQ, k.plan.TKF, k.plan.LQ) == tuple(n in knobs for n in ("norm_in_qkva", "hist_in_scores",
                                                                               "latent_late"))
        for (a, ca), (b, cb) in zip(want, got):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), knobs
            assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k), knobs
        assert torch.equal(want_topk, topk), knobs


@triton.jit
def _aq_probe(out_ptr, NKBP: tl.constexpr, H: tl.constexpr, NQKV: tl.constexpr, BNS: tl.constexpr,
              BLK: tl.constexpr, PER1: tl.constexpr, P1: tl.constexpr, KSI: tl.constexpr, T23: tl.constexpr):
    pid = tl.program_id(0)
    b = tl.arange(0, NKBP)
    need = _aq_blocks(b, pid, tl.num_programs(0), H, NQKV, BNS, BLK, PER1, P1, KSI, T23)
    tl.store(out_ptr + pid * NKBP + b, need.to(tl.int32))


def _aq_blocks_of_every_program(plan, s, nprog):
    """`stages._aq_blocks` evaluated for every program over every K block of the hidden size."""
    import torch

    nkb = s.hidden // s.block
    t2 = -(-(s.index_head_dim + s.index_heads) // plan.BN) * plan.KSI if s.indexer_fused else (
        (-(-s.index_head_dim // plan.BN) + -(-s.index_heads // plan.BN)) * plan.KSI)

    nkbp = triton.next_power_of_2(nkb)
    out = torch.zeros(nprog, nkbp, dtype=torch.int32)
    _aq_probe[(nprog,)](out, nkbp, s.hidden, s.qkv_a_out, plan.BNS, s.block, plan.PER1, plan.P1, plan.KSI, t2)
    return [set(torch.nonzero(r[:nkb]).flatten().tolist()) for r in out], t2


@pytest.mark.parametrize("tp,width,programs", [(8, 1, 264), (8, 8, 264), (1, 2, 264), (8, 2, 8)])
def test_folded_norm_stores_exactly_the_k_blocks_each_program_reads(tp, width, programs):
    """norm_in_qkva: a program's stores of the normed row must cover every K block its q_a/kv_a
    span and its index tiles read (the interpreter runs programs one after another, so a
    launch there cannot show a block left to another program), and together the programs
    store every block (resid1 is read whole by postnorm). At GLM-5.3's TP8 and TP1 shapes
    (spans beside index tiles, and a grid too small for that split), against the spans' and
    tiles' own arithmetic."""
    from mono_glm53.config import REAL
    from mono_glm53.kernels.layer import make_plan

    s = REAL.tp_shard(tp, 0) if tp > 1 else REAL
    plan = make_plan(s, width, True, programs)
    got, t23 = _aq_blocks_of_every_program(plan, s, programs)
    nkb, nks = s.hidden // s.block, s.hidden // s.block // plan.KSI
    nt = -(-s.qkv_a_out // plan.BNS)
    for p in range(programs):
        want = set()
        if plan.P1 == 0 or p < plan.P1:
            want |= {i % nkb for i in range(p * plan.PER1, min((p + 1) * plan.PER1, nt * nkb))}
        ip, inp = (p, programs) if plan.P1 == 0 else (p - plan.P1, programs - plan.P1)
        if ip >= 0:
            for t in range(ip, t23, inp):
                want |= set(range((t % plan.KSI) * nks, (t % plan.KSI + 1) * nks))
        assert got[p] == want, (p, sorted(got[p] ^ want))
    assert set().union(*got) == set(range(nkb))
    assert (plan.P1 == 0) == (programs == 8)  # the index tiles dealt over every program
