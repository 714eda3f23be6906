"""Staged mode of the GLM-5.3 layer kernel under TRITON_INTERPRET=1 equals the reference.

Tiny config (mono_glm53.config.tiny), 3 programs. On the CPU the reference's GEMMs are the
exact fp32 dequantised ones; the kernel's per-block accumulation differs from them only in
fp32 summation order, so the caches are within one bf16 ulp (bit-identical for most seeds:
seed 0 gives identical MLA rows, index-K bytes and scales) and everything is within NUMERICS.
"""

import pytest

from mono_glm53.config import tiny
from mono_glm53.kernels.harness import run_case
from mono_glm53.kernels.numerics import failures

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
    shard's plan takes; this grid is too small for `make_plan` to take it), the gate_up forms
    norm_spread False (addnorm's rows one program each, where sm_90's default cuts them in
    chunks over the programs), postnorm_spread (the post-attention norm's rows in chunks over
    the programs) and moe_f16 False (the MoE's
    weights to bf16 and bf16 MMAs, where sm_90's default converts to f16 for f16 MMAs of the
    same exact products; the f16 form also with gate_up swap-AB and two down slots a step),
    index_f16 False (the index keys to bf16 for bf16 MMAs, where sm_90's default converts them
    to f16 for f16 MMAs of the same products) and down_ids (down's slot ids read once as a
    vector, one and two slots a step) and count_in_write (the top-k's write counting rows of at
    most 64 tokens itself, the count stage left out; at 32 the rows are longer and the count
    stage counts them) and silu_fold (each slot's last gate_up tile runs its SiLU) and qb_pair
    (q_b and the indexer's wq_b as one loop over each program's spans of both) write
    the default launch's outputs, MLA rows, index keys and top-k; out-of-range values are
    refused, all at once."""
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
    assert k0.plan.DSTG > 0 and k0.plan.DSTEP == 1 and k0.plan.P1 == 0 and k0.plan.KSI > 2 and k0.plan.MF16
    assert k0.plan.IF16 and k0.plan.ANC == 4  # 4 rows x 4 chunks of 64 on 24 programs (8 of 32 would not fit)
    for kw in (dict(down_step=2), dict(gateup_split=1), dict(index_tile=32), dict(gateup_bn=16),
               dict(gateup_dot=1), dict(qkva_programs=20, index_split=2), dict(norm_spread=False), dict(postnorm_spread=True),
               dict(moe_f16=False), dict(gateup_dot=1, down_step=2), dict(index_f16=False),
               dict(down_ids=True), dict(down_ids=True, down_step=2), dict(count_in_write=64),
               dict(count_in_write=32), dict(silu_fold=True), dict(silu_fold=True, down_step=2), dict(qb_pair=True)):
        k, b, cb = run(**kw)
        assert all(torch.equal(x[:3], y[:3]) for x, y in zip(a, b)), kw
        assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k), kw
        assert torch.equal(k0.topk[:3], k.topk[:3]), kw
        if "qkva_programs" in kw:
            assert (k.plan.P1, k.plan.KSI) == (20, 2)
        if "norm_spread" in kw:
            assert k.plan.ANC == 0
        if "postnorm_spread" in kw:
            assert k.plan.PNC == 4
        if "qb_pair" in kw:
            assert k.plan.QBP
    with pytest.raises(ValueError, match=r"unknown knobs \['gate_split'\].*; down_step 3 is not 1 or 2; gateup_dot 2 "
                                         r"is not 0 or 1.*; gateup_split 5 does not divide the 8 K blocks.*; "
                                         r"qkva_programs 24 is not 0 \(no split\) or in 1..23"):
        run(gate_split=2, down_step=3, gateup_split=5, qkva_programs=24, gateup_dot=2)
    # the knobs removed after their H200 timing are unknown names now, refused with the rest
    with pytest.raises(ValueError, match=r"unknown knobs \['handoff_flag', 'norm_in_qkva'\].*; index_tile 48 is "
                                         r"not a power of two in 16..256; gateup_bn 48 is not 16, 32, 64 or 128"):
        run(handoff_flag=True, norm_in_qkva=True, index_tile=48, gateup_bn=48)


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


def test_index_prefetch_reads_the_tiles_ahead_and_gives_the_default_bits():
    """index_prefetch (Plan.ISP): the index scores' loop reads the page table two tiles ahead
    and carries two tiles (the interpreter runs the lookahead, not sm_90's prefetch). On 3
    programs over 16-token tiles of rows of 40, 9 and 33 tokens (3 + 1 + 3 tiles: a program runs
    two or three, across rows, the last ahead past the end), the scores, the top-k and the whole
    layer are the default's bits."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8, index_topk=16)
    c = build_case(s, 3, 40, True, seed=23, ctxs=[40, 9, 33])
    got = []
    for isp in (False, True):
        k = GlmLayerKernel(s, c.w, 4, max_seq_len=40, nprog=3, device="cpu", index_tile=16, index_prefetch=isp)
        assert k.plan.ISP == isp and k.plan.TB == 16
        got.append((kernel_out(c, k, "staged"), k.scores.clone()))
    ((a, ca), sa), ((b, cb), sb) = got
    assert torch.equal(sa, sb)
    assert all(torch.equal(x[:3], y[:3]) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)


def test_radix_prefix_once_derives_each_rows_threshold_once_and_gives_the_default_bits():
    """radix_prefix_once (Plan.TKP): the radix passes, the counts and the write run each
    program's tiles as a contiguous run and derive a row's threshold digits once a run
    (`topk.tk_span`, `tk_prefix_cached`), not once a tile. On 4 programs over rows of 600, 530
    and 9 tokens (3 + 3 chunks of 256 keys, runs of 2: the second program's run crosses from
    one long row to the other, whose thresholds differ), the histograms, chunk counts, top-k
    and the layer are the default's."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8, index_topk=16)
    c = build_case(s, 3, 600, True, seed=29, ctxs=[600, 530, 9])
    got = []
    for once in (False, True):
        k = GlmLayerKernel(s, c.w, 4, max_seq_len=600, nprog=4, device="cpu", radix_prefix_once=once)
        assert k.plan.TKP == once
        got.append((kernel_out(c, k, "staged"), k.tkh.clone(), k.tkc.clone(), k.topk.clone()))
    ((a, ca), ha, na, ta), ((b, cb), hb, nb, tb) = got
    assert torch.equal(ha, hb) and torch.equal(na, nb) and torch.equal(ta, tb)
    assert all(torch.equal(x[:3], y[:3]) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)
    assert (ta[:3] >= 0).sum() == 16 + 16 + 9


@pytest.mark.parametrize("tkr,row_path", [(1024, True), (512, False)], ids=["rows-fit", "a-row-too-long"])
def test_topk_row_gives_each_short_row_to_one_program_and_the_default_bits(tkr, row_path):
    """topk_row (Plan.TKR): a step whose rows all have at most TKR tokens takes its whole top-k
    in stage 7, one program a row, stages 8-11 only signalling; a step with a longer row takes
    the radix stages. Rows of 600, 530 and 9 tokens (top 16) on 4 programs: with TKR 1024 the
    row path (pass 0's histogram seeding each row's search), with 512 the radix stages (the
    600-token row is longer); the top-k and the layer are the default's either way."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8, index_topk=16)
    c = build_case(s, 3, 600, True, seed=31, ctxs=[600, 530, 9])
    got = []
    for knob in (None, tkr):
        k = GlmLayerKernel(s, c.w, 4, max_seq_len=600, nprog=4, device="cpu", topk_row=knob)
        assert k.plan.TKF and k.plan.TKR == (knob or 0)
        got.append((kernel_out(c, k, "staged"), k.tkh.clone(), k.topk.clone()))
    ((a, ca), ha, ta), ((b, cb), hb, tb) = got
    assert torch.equal(ta, tb) and (ta[:3] >= 0).sum() == 16 + 16 + 9
    assert all(torch.equal(x[:3], y[:3]) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)
    # pass 0's histogram comes from the index scores either way
    assert torch.equal(hb[:3, :256], ha[:3, :256])
    # without the row path the radix passes 1-3 fill the other bins as the default's (with it
    # they are the row search's scratch, the packed candidates)
    assert ha[:2, 256:].sum() > 0 and torch.equal(hb[:2, 256:], ha[:2, 256:]) == (not row_path)


@pytest.mark.parametrize("tks,spread_path", [(1024, True), (512, False)], ids=["rows-fit", "a-row-too-long"])
@pytest.mark.parametrize("select", [False, True], ids=["two-stages", "select"])
def test_topk_spread_finds_the_threshold_on_every_program_and_gives_the_default_bits(tks, spread_path, select):
    """topk_spread (Plan.TKS): a step whose rows all have at most TKS tokens finds each long
    row's threshold in stage 7 (the tiles holding keys of its top digit) and places every row's
    keys in stage 8, on every program, stages 9-11 only signalling; with topk_spread_select
    (Plan.TSS) every tile finds its row's threshold itself and places its keys in stage 7,
    stages 8-11 only signalling; a step with a longer row takes the radix stages. Rows of 600,
    530 and 9 tokens (top 16) on 4 programs: the top-k and the layer are the default's either
    way; on the spread path the index scores fill the long rows' fine histograms (their keys
    by top 16 bits) and, in two stages, each long row's threshold word holds its 16th largest
    key."""
    import torch

    from mono_common.stages.topk import TKS_WORD
    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8, index_topk=16)
    c = build_case(s, 3, 600, True, seed=31, ctxs=[600, 530, 9])
    got = []
    for knob in (False, tks):
        k = GlmLayerKernel(s, c.w, 4, max_seq_len=600, nprog=4, device="cpu", topk_spread=knob,
                           topk_spread_select=bool(knob) and select)
        assert k.plan.TKF and k.plan.TKS == (knob or 0) and k.plan.RKS == (128 if knob else 16)
        assert k.plan.TSS == (bool(knob) and select)
        got.append((kernel_out(c, k, "staged"), k.tkh.clone(), k.topk.clone(), k.scores.clone(), k.tkf.clone()))
    ((a, ca), ha, ta, _, _), ((b, cb), hb, tb, sb, fb) = got
    assert torch.equal(ta, tb) and (ta[:3] >= 0).sum() == 16 + 16 + 9
    assert all(torch.equal(x[:3], y[:3]) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)
    assert torch.equal(hb[:3, :256], ha[:3, :256])
    for m, n in ((0, 600), (1, 530)):
        kth = torch.topk(sb[m, :n], 16).values[-1].view(torch.int32)
        key = int(kth) ^ ((int(kth) >> 31) & 0x7FFFFFFF)
        assert (int(hb[m, TKS_WORD.value]) == key) == (spread_path and not select), m
    # the radix passes 1-3 fill the bins after pass 0's only without the spread path
    assert ha[:2, 256:512].sum() > 0 and (hb[:2, 256:512].sum() == 0) == spread_path
    # the index scores fill the fine histograms of the rows longer than the top-k in a step
    # that takes the spread path only (a longer step's keys add nothing there)
    assert fb[:3].sum(1).tolist() == ([600, 530, 0] if spread_path else [0, 0, 0])


@pytest.mark.parametrize("tkr,row_path,nprog", [(1024, True, 5), (1024, True, 4), (512, False, 5)],
                         ids=["rows-fit", "no-program-without-a-row", "a-row-too-long"])
def test_topk_row_absorb_runs_the_absorption_beside_the_row_topk_and_gives_the_default_bits(tkr, row_path, nprog):
    """topk_row_absorb (Plan.TKA): in a row top-k step the absorption and q_pe RoPE tiles run in
    stage 7 on the programs without a row (all programs, after their rows, where there are no
    more programs than rows: 4 programs at width 4), stage 4 the index tiles alone; a step with
    a longer row runs them all in stage 4 as the default. q_abs poisoned before the step: a
    tile that ran nowhere leaves NaN. Outputs, caches and q_abs are the default's bits; after
    stages 0-4 alone q_abs is still poisoned on the row path (its tiles moved) and filled
    without."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8, index_topk=16)
    c = build_case(s, 3, 600, True, seed=37, ctxs=[600, 530, 9])
    got = []
    for knobs in ({}, {"topk_row": tkr, "topk_row_absorb": True}):
        k = GlmLayerKernel(s, c.w, 4, max_seq_len=600, nprog=nprog, device="cpu", **knobs)
        assert k.plan.TKA == bool(knobs)
        k.qabs.fill_(float("nan"))
        got.append((kernel_out(c, k, "staged"), k.qabs[:3].clone()))
    ((a, ca), qa), ((b, cb), qb) = got
    assert all(torch.equal(x[:3], y[:3]) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)
    assert torch.equal(qa, qb) and not torch.isnan(qb.float()).any()
    # stages 0-4 alone: the row path left the absorption to stage 7
    from mono_glm53 import reference as ref

    k.qabs.fill_(float("nan"))
    k.set_inputs(c.hidden, c.residual, c.inputs)
    k.launch(ref.LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone()), mode="staged",
             stages=range(5))
    assert bool(torch.isnan(k.qabs[:3].float()).all()) == row_path
    assert row_path or not torch.isnan(k.qabs[:3].float()).any()


def test_oproj_fixup_sums_each_column_tile_once_and_gives_the_default_bits():
    """oproj_fixup (Plan.FIX9): each o_proj column tile's last span sums the tile's partial
    slots into slot 0 and postnorm reads that slot alone; the outputs and caches are the
    default's, two steps in a row (the tile counters count on: epoch times the tile's spans),
    and from a restart near the counters' 2**31 wrap (`set_sync`)."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny()
    c = build_case(s, 2, 40, True, seed=29)
    got = {}
    for fix in (False, True):
        k = GlmLayerKernel(s, c.w, 2, max_seq_len=40, nprog=5, device="cpu", oproj_fixup=fix)
        assert k.plan.KS9 > 1 and k.plan.FIX9 == fix
        got[fix] = [kernel_out(c, k, "staged") for _ in range(2)]
        k.set_sync(2 ** 31 // 5 - 1)
        got[fix].append(kernel_out(c, k, "staged"))
        if fix:
            k.guard.check()
    for (a, ca), (b, cb) in zip(got[False], got[True]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)


def test_wuv_combine_combines_each_head_in_the_value_projection_and_gives_the_default_bits():
    """wuv_combine (Plan.WCB): the value projection's tiles combine their head's MLA chunks
    themselves (two 64-token chunks a row here: top-k 128 of ctx 700) and the combine stage
    writes nothing: with the combine's output buffer poisoned (NaN), the outputs and caches are
    the default's bits, and the buffer is still untouched."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8, index_topk=128)
    c = build_case(s, 2, 700, True, seed=7)
    got = {}
    for wcb in (False, True):
        k = GlmLayerKernel(s, c.w, 2, max_seq_len=700, nprog=5, device="cpu", wuv_combine=wcb)
        assert k.plan.WCB == wcb and k.plan.TOPK // k.plan.CT == 2
        if wcb:
            k.attn.fill_(float("nan"))
        got[wcb] = kernel_out(c, k, "staged")
        if wcb:
            assert torch.isnan(k.attn.float()).all()
    (a, ca), (b, cb) = got[False], got[True]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)


@pytest.mark.parametrize("ct", [16, 32])
def test_mla_hold_meets_the_reference(ct):
    """mla_hold (Plan.HOLD, CT): the MLA chunks' keys held for both products, 16 or 32 tokens
    a chunk (8 or 4 chunks of top-k 128 to combine): a build of its own bits, within the
    bounds the default's staged launch meets (test_staged_equals_reference_several_chunks)."""
    s = tiny(index_heads=8, index_topk=128)
    m = run_case(s, 2, 2, 700, True, modes=("staged",), nprog=3, seed=7, knobs={"mla_hold": ct})
    assert not failures(m), m
    assert m["glm53_layer.mla_cache.max_abs_ulps"] <= 1.0, m
    assert m["glm53_layer.residual.cosine_min"] > 0.99999, m


def _norm_form_against_the_default(knob, width, rows, nprog, seed):
    """A post-attention norm form (`knob` True, hidden 384) against the reference within the
    default staged launch's bounds, and against the default: res_out its bits, h2 (poisoned
    first) within a bf16 step, every value written. Returns the knob's kernel (its plan)."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8, hidden=384)
    m = run_case(s, width, rows, 40, True, modes=("staged",), nprog=nprog, seed=seed, knobs={knob: True})
    assert not failures(m), m
    assert m["glm53_layer.residual.cosine_min"] > 0.99999, m
    c = build_case(s, rows, 40, True, seed=seed + 1)
    got = {}
    for on in (False, True):
        k = GlmLayerKernel(s, c.w, width, max_seq_len=40, nprog=nprog, device="cpu", **{knob: on})
        k.h2.fill_(float("nan"))
        kernel_out(c, k, "staged")
        got[on] = (k.res_out[:rows].clone(), k.h2[:rows].float())
    (ra, ha), (rb, hb) = got[False], got[True]
    assert torch.equal(ra, rb)
    # an rstd of another summation order (an fp32 ulp or so) moves an h2 value by at most one
    # bf16 step: 2^-7 of it at most
    assert torch.allclose(ha, hb, rtol=2**-7, atol=0.0) and not torch.isnan(hb).any()
    return k


@pytest.mark.parametrize("width,rows,nprog", [(2, 2, 3), (4, 3, 2)])
def test_postnorm_loop_walks_each_row_in_chunks_and_meets_the_reference(width, rows, nprog):
    """postnorm_loop (Plan.PNL): a row's program walks the post-attention norm in HB-column
    chunks (hidden 384: three chunks of 128, as a TP8 rank's 6144 in three of 2048; 2 programs
    for 3 rows: one program norms two). Its squares are summed in an order of its own, so the
    residual stream it writes is the default's bits and the rest is held to the reference's
    bounds, as the default is."""
    k = _norm_form_against_the_default("postnorm_loop", width, rows, nprog, 23)
    assert k.plan.PNL and k.plan.H // k.plan.HB == 3


@pytest.mark.parametrize("width,rows,nprog", [(2, 2, 5), (4, 3, 7)])
def test_postnorm_split_norms_in_two_passes_over_chunks_and_meets_the_reference(width, rows, nprog):
    """postnorm_split (Plan.PNS): the post-attention norm as two passes over (row, 32-column
    chunk) items on every program (hidden 384: twelve chunks a row), a hand-off between, the
    chunks' sums of squares in ap; the staged launch's second pass makes a row's chunk sums
    itself. Its squares are summed in an order of its own: as postnorm_loop's test."""
    k = _norm_form_against_the_default("postnorm_split", width, rows, nprog, 29)
    assert k.plan.PNS == 32


def test_mlacomb_vec_meets_the_reference():
    """mlacomb_vec (Plan.MCV): the MLA combine's chunks as one load and block reductions
    (top-k 128 at 700 tokens: two chunks of 64 to combine), its sums in their own order: within
    the bounds the default's staged launch meets."""
    s = tiny(index_heads=8, index_topk=128)
    m = run_case(s, 2, 2, 700, True, modes=("staged",), nprog=3, seed=7, knobs={"mlacomb_vec": True})
    assert not failures(m), m
    assert m["glm53_layer.mla_cache.max_abs_ulps"] <= 1.0, m
    assert m["glm53_layer.residual.cosine_min"] > 0.99999, m


@pytest.mark.parametrize("width,rows,nprog", [(2, 2, 5), (4, 3, 7)])
def test_qb_joint_meets_the_reference(width, rows, nprog):
    """qb_joint (Plan.QBP 2): q_b's column tiles then wq_b's as one stream-K GEMV (mono-common
    `gemv_span_joint`), each tile's partials in fewer slots than each GEMV's own spans give it,
    which absorb and the index scores sum: other sums of the same products, within the bounds
    the default's staged launch meets, the top-k of the index scores so made checked as the
    default's is."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8)
    m = run_case(s, width, rows, 40, True, modes=("staged",), nprog=nprog, seed=37, knobs={"qb_joint": True})
    assert not failures(m), m
    assert m["glm53_layer.residual.cosine_min"] > 0.99999, m
    # the joint spans ran (longer spans, fewer slots) and their slot sums are the GEMVs' values
    c = build_case(s, rows, 40, True, seed=38)
    sums = {}
    for on in (False, True):
        k = GlmLayerKernel(s, c.w, width, max_seq_len=40, nprog=nprog, device="cpu", qb_joint=on)
        kernel_out(c, k, "staged")
        sums[on] = (k.qb.sum(0)[:rows], k.iq.sum(0)[:rows], k.plan)
    (qa, ia, pa), (qj, ij, pj) = sums[False], sums[True]
    assert pj.QBP == 2 and pj.PER3 > pa.PER3 and pj.KS3 < pa.KS3
    assert torch.allclose(qa, qj, rtol=1e-5, atol=1e-6) and torch.allclose(ia, ij, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("knobs", [{"mla_chunk": 16}, {"mla_chunk": 32, "mlacomb_vec": True}], ids=["16", "32-vec"])
def test_mla_chunk_meets_the_reference(knobs):
    """mla_chunk (Plan.CT): the MLA stage's chunks of 16 or 32 selected tokens (top-k 128 at 700
    tokens: eight or four chunks to combine, with mlacomb_vec's combine too), its sums over
    other chunks: within the bounds the default's staged launch meets."""
    s = tiny(index_heads=8, index_topk=128)
    m = run_case(s, 2, 2, 700, True, modes=("staged",), nprog=3, seed=7, knobs=knobs)
    assert not failures(m), m
    assert m["glm53_layer.mla_cache.max_abs_ulps"] <= 1.0, m
    assert m["glm53_layer.residual.cosine_min"] > 0.99999, m


def test_an_exact_tie_at_the_kth_index_score_is_checked_on_the_kernels_selection():
    """At 1 row, ctx 40, 5 programs, seed 12 puts the k-th index score in an exact tie (twelve
    scores of exactly 0.0: every head's ReLU zero), which the kernel breaks by position and
    torch.topk otherwise: the overlap counts the swaps as agreeing (`harness.topk_overlap`) and
    the stream is checked against the reference attending over the kernel's own selection,
    within every bound (against the reference's own selection the residual's cosine was
    0.99966, session 39)."""
    s = tiny(moe_inter=64)
    m = run_case(s, 2, 1, 40, True, modes=("staged",), nprog=5, seed=12)
    assert m["glm53_layer.topk.tie_swaps_max"] > 0, m
    assert not failures(m), m


# seed 12 at one row: the exact tie above (session 39)
@pytest.mark.parametrize("width,rows,seed,knobs", [(2, 2, 13, {"gateup_spans": True, "gateup_bn": 64}),
                                                   (2, 1, 12, {"gateup_spans": True, "gateup_bn": 32,
                                                               "gateup_dot": 0})],
                         ids=["64-swap-ab", "32-x-w"])
def test_gateup_spans_meet_the_reference(width, rows, seed, knobs):
    """gateup_spans (Plan.GSP): gate_up as stream-K spans dealt over the slots in use (at 2 rows
    more slots than one row's, so programs run several spans; one row beside a pad row), their
    partials summed by the SiLU stage: exact products summed in another order than the tiles',
    so within the bounds the default's staged launch meets, with the MoE's own checks given the
    kernel's h2. (The tiny shape's scale block is 32: tiles of at most 64 columns.)"""
    s = tiny(moe_inter=64)
    m = run_case(s, width, rows, 40, True, modes=("staged",), nprog=5, seed=seed, knobs=knobs)
    assert not failures(m), m
    assert m["glm53_layer.residual.cosine_min"] > 0.99999, m


@pytest.mark.parametrize("width,rows", [(2, 2), (4, 3)])
def test_norm_in_router_norms_in_the_routers_programs_and_gives_the_default_bits(width, rows):
    """norm_in_router (Plan.NIR): the norm stage writes nothing, the router's programs derive
    the rows' rstd and h2 themselves and its (row, block) items write res_out and h2. With h2
    poisoned (NaN) before the step, so a router tile reading it before the items write it
    would spread NaN, the outputs, the caches and h2 are the default's bits, with a pad row at
    width 4."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8)
    c = build_case(s, rows, 40, True, seed=17)
    got = {}
    for nir in (False, True):
        k = GlmLayerKernel(s, c.w, width, max_seq_len=40, nprog=5, device="cpu", norm_in_router=nir)
        assert k.plan.NIR == nir and k.plan.FIX9 == nir
        k.h2.fill_(float("nan"))
        got[nir] = (kernel_out(c, k, "staged"), k.h2[:rows].clone())
    ((a, ca), ha), ((b, cb), hb) = got[False], got[True]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)
    assert torch.equal(ha, hb) and not torch.isnan(hb.float()).any()


@pytest.mark.parametrize("width,rows,nprog", [(2, 2, 5), (8, 7, 5)])
def test_absorb_gather_sums_q_nope_once_a_tile_and_gives_the_default_bits(width, rows, nprog):
    """absorb_gather (Plan.ABG): each absorption tile sums q_nope's q_b partial slots once for
    all its chunks into its scratch rows (3 slots: one group of 3 at width 2, a group of 2 and
    a remainder of 1 at width 8), and the q_pe RoPE items are tiles of their own after the
    index tiles. With q_abs poisoned (NaN) before the step, so a RoPE item or an absorption
    block left unwritten would spread NaN, the outputs and caches are the default's bits, with
    a pad row at width 8."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(index_heads=8)
    c = build_case(s, rows, 40, True, seed=23)
    got = {}
    for abg in (False, True):
        k = GlmLayerKernel(s, c.w, width, max_seq_len=40, nprog=nprog, device="cpu", absorb_gather=abg)
        assert k.plan.ABG == abg and k.plan.KS3 == 3
        k.qabs.fill_(float("nan"))
        got[abg] = (kernel_out(c, k, "staged"), k.qabs[:rows].clone())
    ((a, ca), qa), ((b, cb), qb) = got[False], got[True]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)
    assert torch.equal(qa, qb) and not torch.isnan(qb.float()).any()


def _counted_steps_give_the_default_bits(knob, field, scratch, counters_from, seed):
    """A knob whose stage counts arrivals on counter words that are zero between launches:
    three steps, the last from a restart near the stage counters' 2**31 wrap (`set_sync`), with
    the knob's scratch buffers zeroed before each step, give the default's outputs and caches
    (so the knob's work ran in every step), and leave the counter words from `counters_from`
    at zero after every launch."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(moe_inter=64)
    c = build_case(s, 2, 40, True, seed=seed)
    got = {}
    for on in (False, True):
        k = GlmLayerKernel(s, c.w, 2, max_seq_len=40, nprog=7, device="cpu", **{knob: on})
        assert getattr(k.plan, field) == on
        got[on] = []
        for step in range(3):
            if step == 2:
                k.set_sync(2 ** 31 // 7 - 1)
            for name in scratch:
                getattr(k, name).zero_()
            got[on].append(kernel_out(c, k, "staged"))
            assert (k.cnt[counters_from:] == 0).all(), step
    for (a, ca), (b, cb) in zip(got[False], got[True]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)


def test_silu_fold_runs_each_slots_silu_every_step_and_gives_the_default_bits():
    """silu_fold (Plan.SFO): each slot's last gate_up tile runs the slot's SiLU and sets the
    slot's counter back to zero: the default's bits in three steps with the SiLU buffers
    zeroed before each (`_counted_steps_give_the_default_bits`)."""
    from mono_glm53.kernels.stages import SLOTC

    _counted_steps_give_the_default_bits("silu_fold", "SFO", ("inter", "inters"), SLOTC.value, 23)


def test_down_items_sum_each_column_tile_once_and_give_the_default_bits():
    """down_items (Plan.DIT): down's (column tile, slot) items over every program, each tile
    summed by its last item's program, which sets the tile's counter back to zero: the
    default's bits in three steps with the weighted tiles zeroed before each, every tile
    counter at zero after each (`_counted_steps_give_the_default_bits`). 32-column tiles: the
    tiny shape's scale block is 32; the 64-column tiles are the GPU knob set's."""
    from mono_glm53.kernels.stages import DITC

    _counted_steps_give_the_default_bits("down_items", "DIT", ("mz",), DITC.value, 29)


def test_first_radix_pass_in_the_scores_and_the_radix_loop_give_the_default_bits():
    """hist_in_scores (Plan.TKF: the top-k's first radix pass done by the index scores, its
    histograms zeroed two stages before; sm_90's default) against the pass as a stage of its
    own, with the q_a/kv_a spans beside the index tiles and without producer-quantised inputs,
    and radix_loop (Plan.TKL: the passes as one runtime loop, each staged launch one trip of it
    with a runtime pass number) alone and with it: the
    default's outputs, caches and top-k, three steps in a row (the histograms start from zero
    each step), rows above and at or below the top-k."""
    import torch

    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s = tiny(moe_inter=64, index_topk=32)
    c = build_case(s, 3, 40, True, seed=37, ctxs=[40, 20, 33])

    def steps(**knobs):
        k = GlmLayerKernel(s, c.w, 4, max_seq_len=40, nprog=24, device="cpu", **knobs)
        return k, [kernel_out(c, k, "staged") for _ in range(3)], k.topk.clone()

    k_default, want, want_topk = steps()
    assert (want_topk[:3] >= 0).sum(1).tolist() == [32, 20, 32]
    # the default (sm_90's options on the interpreter) has the pass in the scores: each form
    # against it, the pass as a stage of its own among them
    assert k_default.plan.TKF
    for knobs in (dict(hist_in_scores=False), dict(qkva_programs=20, index_split=2),
                  dict(hist_in_scores=False, xq_producer=False), dict(radix_loop=True),
                  dict(radix_loop=True, hist_in_scores=False)):
        k, got, topk = steps(**knobs)
        assert k.plan.TKF == knobs.get("hist_in_scores", True) and k.plan.TKL == knobs.get("radix_loop", False)
        for (a, ca), (b, cb) in zip(want, got):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), knobs
            assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k), knobs
        assert torch.equal(want_topk, topk), knobs
