"""How the layer kernel's GEMVs are split over the programs: split-K factors (`layer._pick_ks`) and
the dense FP8 GEMVs' stream-K spans (`make_plan`, `mono_common.stages.gemv.span_slots`)."""

import dataclasses

import pytest

from mono_common.stages.gemv import span_slots
from mono_glm53.config import REAL
from mono_glm53.kernels.layer import _pick_ks, _qkva_split, addnorm_chunks, make_plan


def test_first_rule_takes_the_smallest_divisor_covering_the_grid():
    # qkv_a of a TP8 shard: 41 column tiles, 48 K blocks, 264 programs: 41 * 8 >= 264
    assert _pick_ks(41, 48, 264) == 8
    assert _pick_ks(41, 48, 132) == 4
    assert _pick_ks(320, 16, 264) == 1  # already enough tiles
    assert _pick_ks(3, 7, 264) == 7  # a prime K: its only divisors are 1 and 7


def test_balanced_rule_minimises_the_busiest_programs_blocks():
    # 41 tiles x ks on 264 programs: ks 6 -> 1 round of 8 blocks; ks 8 -> 2 rounds of 6 = 12;
    # ks 12 -> 2 x 4 = 8; ks 16 -> 3 x 3 = 9: 6 and 12 tie at 8, the fewer tiles win
    assert _pick_ks(41, 48, 264, rule="balanced") == 6
    # q_b + index q of a TP8 shard: 96 tiles, 16 blocks: ks 8 -> 3 x 2 = 6 (ks 4 -> 2 x 4 = 8)
    assert _pick_ks(96, 16, 264, rule="balanced") == 8
    for ntiles, kblocks, target in [(41, 48, 264), (96, 16, 264), (7, 8, 3), (256 + 64, 16, 264)]:
        got = _pick_ks(ntiles, kblocks, target, rule="balanced")
        cost = -(-ntiles * got // target) * (kblocks // got)
        for ks in range(1, min(kblocks, 16) + 1):
            if kblocks % ks == 0:
                assert cost <= -(-ntiles * ks // target) * (kblocks // ks), (ntiles, kblocks, ks)


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="split-K rule 'fast'"):
        _pick_ks(41, 48, 264, rule="fast")


def test_plan_streams_the_dense_gemvs_and_splits_the_qkva_programs_from_the_index_tiles():
    s = REAL.tp_shard(8, 0)
    p = make_plan(s, 2, True, 264)
    # the index wk | weights_proj (3 column tiles of 64, 48 K blocks) in tiles of 3 K blocks
    # (fewer than the 4 items a q_a/kv_a span has on all 264 programs) on programs 216..263
    assert (p.KSI, p.P1) == (16, 264 - 3 * 16)
    assert _qkva_split(s.qkv_a_out, s.hidden, s.block, s.index_head_dim + s.index_heads, 64, 264) == (216, 16)
    # (column tile of 128, K block) items: q_a/kv_a 21 x 48 = 1008 on the P1 programs, q_b
    # 16 x 16 = 256, the index wq_b 32 x 16 = 512, o_proj 48 x 16 = 768 on all 264: each
    # program one span of ceil(items / programs)
    assert (p.BNS, p.PER1, p.PER3, p.PERQ, p.PER9) == (128, 5, 1, 2, 3)
    for items, per, n in ((1008, p.PER1, p.P1), (256, p.PER3, 264), (512, p.PERQ, 264), (768, p.PER9, 264)):
        assert per * n >= items > (per - 1) * n
    # a column tile's partials land in as many slots as spans can touch it
    assert (p.KS1, p.KS3, p.KSQ, p.KS9) == (span_slots(6144, 128, 5), span_slots(2048, 128, 1),
                                            span_slots(2048, 128, 2), span_slots(2048, 128, 3)) == (11, 16, 9, 6)
    # gate_up: 72 column tiles for one row's 9 experts; split 3 is 216 tiles of 16 blocks,
    # one a program (split 4: 288 tiles, 24 programs with two, 24 blocks)
    assert (p.KSR, p.KSG) == (8, 3)
    assert p.KSG == _pick_ks(72, 48, 264, cap=6, rule="balanced")
    # the ks_rule no longer moves the TP8 plan: the index split is `_qkva_split`'s
    assert make_plan(s, 2, True, 264, "balanced") == p
    # without the indexer there are no index tiles: every program runs a span
    assert make_plan(s, 2, False, 264).P1 == 0


def test_small_grids_keep_the_index_tiles_on_every_program_and_the_rule_picks_their_split():
    s = REAL.tp_shard(8, 0)
    # on 8 programs the 3 finest-possible tiles would take more than a quarter of the grid
    assert _qkva_split(s.qkv_a_out, s.hidden, s.block, s.index_head_dim + s.index_heads, 64, 8) is None
    p8, bal8 = make_plan(s, 2, True, 8), make_plan(s, 2, True, 8, "balanced")
    assert p8.P1 == bal8.P1 == 0
    assert p8.KSI == _pick_ks(3, 48, 8, cap=48) == 3
    assert bal8.KSI == _pick_ks(3, 48, 8, cap=48, rule="balanced")
    assert dataclasses.replace(bal8, KSI=p8.KSI) == p8


def test_down_takes_two_slots_a_step_at_eight_rows_only():
    s = REAL.tp_shard(8, 0)
    assert [make_plan(s, w, True, 264).DSTEP for w in (1, 2, 4, 8)] == [1, 1, 1, 2]


def test_span_slots_count_the_spans_a_tile_can_touch():
    # a 48-block tile and spans of 4: starting on the last item of a span it meets 1 + 12 spans
    assert span_slots(6144, 128, 4) == 13
    assert span_slots(2048, 128, 16) == 2 and span_slots(2048, 128, 32) == 2
    for nkb in (1, 5, 16, 48):
        for per in (1, 2, 3, 7, 64):
            worst = max(len({(i0 + j) // per for j in range(nkb)}) for i0 in range(per))
            assert span_slots(nkb * 128, 128, per) >= worst


def test_isa_options_pipeline_down_and_convert_fast_on_a_tp8_rank_of_sm90_only_and_quantise_in_producers_on_sm90():
    from mono_glm53.kernels.layer import isa_options

    tp8, tp4 = REAL.tp_shard(8, 0), REAL.tp_shard(4, 0)
    assert tp8.moe_inter_per_rank <= 2 * tp8.block < tp4.moe_inter_per_rank
    assert isa_options("sm_90", tp8) == {"DSTG": 3, "FASTCVT": True, "XQP": True, "HWQ": True, "OHQ": True,
                                         "TKF": True, "MF16": True, "IF16": True, "TKP": True, "PFN": -1}
    # a TP4 rank and the whole layer: more K blocks a slot, which spilled on sm_90
    assert isa_options("sm_90", tp4) == {"DSTG": 0, "FASTCVT": False, "XQP": True, "HWQ": True, "OHQ": True,
                                         "TKF": True, "MF16": False, "IF16": False, "TKP": False, "PFN": 0}
    assert isa_options("sm_90", REAL) == {"DSTG": 0, "FASTCVT": False, "XQP": True, "HWQ": True, "OHQ": True,
                                          "TKF": True, "MF16": False, "IF16": False, "TKP": False, "PFN": 0}
    # gfx950: the PTX conversion does not exist, the pipelined loop is not resource-checked,
    # and producer quantisation spilled its scalar registers
    assert isa_options("gfx950", tp8) == {"DSTG": 0, "FASTCVT": False, "XQP": False, "HWQ": False, "OHQ": False,
                                          "TKF": False, "MF16": False, "IF16": False, "TKP": False, "PFN": 0}


def test_hist_in_scores_is_sm90s_default_and_its_knob_turns_it_off_or_on():
    """Plan.TKF comes on with sm_90's options; hist_in_scores False gives the first radix pass
    its own stage back (and a code_pad at its hand-off is then allowed), True sets it on a
    plan without it (gfx950's)."""
    from mono_glm53.kernels.layer import _with_knobs, folded_handoffs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    assert sm.TKF and folded_handoffs(sm) == (6,) and not hip.TKF and folded_handoffs(hip) == ()
    off = _with_knobs(sm, s, 264, {"hist_in_scores": False})
    assert not off.TKF and folded_handoffs(off) == ()
    assert _with_knobs(sm, s, 264, {"hist_in_scores": False, "code_pad": ["tkhist0", 8]}).PADS == 6
    with pytest.raises(ValueError, match=r"code_pad \['tkhist0', 8\] is not"):
        _with_knobs(sm, s, 264, {"code_pad": ["tkhist0", 8]})
    assert _with_knobs(hip, s, 264, {"hist_in_scores": True}, hip=True).TKF


def test_norm_spread_cuts_each_row_into_the_most_chunks_that_give_every_item_a_program():
    """norm_spread: Plan.ANC chunks a row, each a power-of-two count of blocks dividing the
    hidden size, as many as keep (rows x chunks) within the grid (the fewest otherwise); a
    hidden size past the [4, HB] row tile is refused with what the knob needs."""
    from mono_glm53.kernels.layer import _with_knobs

    s = REAL.tp_shard(8, 0)
    assert [addnorm_chunks(s, w, 264, 2048) for w in (1, 2, 4, 8)] == [48, 48, 48, 24]
    assert addnorm_chunks(s, 8, 16, 2048) == 3  # 2048-wide chunks: 24 items on 16 programs
    assert addnorm_chunks(s, 1, 264, 1024) == 0  # 6 row tiles of 1024: not the [4, HB] form
    plan = make_plan(s, 8, True, 264)
    assert plan.ANC == 0 and _with_knobs(plan, s, 264, {"norm_spread": True}).ANC == 24
    with pytest.raises(ValueError, match=r"norm_spread needs the hidden size 6144 in at most 4 row tiles of 1024"):
        _with_knobs(dataclasses.replace(plan, HB=1024), s, 264, {"norm_spread": True})


def test_index_prefetch_needs_the_indexer_and_sm90():
    """index_prefetch sets Plan.ISP; a layer without the indexer and gfx950 (no L2 prefetch)
    refuse it, each with its reason."""
    from mono_glm53.kernels.layer import _with_knobs

    s = REAL.tp_shard(8, 0)
    plan = make_plan(s, 2, True, 264)
    assert not plan.ISP and _with_knobs(plan, s, 264, {"index_prefetch": True}).ISP
    assert not _with_knobs(plan, s, 264, {"index_prefetch": False}).ISP
    with pytest.raises(ValueError, match=r"index_prefetch needs the indexer"):
        _with_knobs(make_plan(s, 2, False, 264), s, 264, {"index_prefetch": True})
    with pytest.raises(ValueError, match=r"index_prefetch is sm_90's L2 prefetch: gfx950 has none"):
        _with_knobs(plan, s, 264, {"index_prefetch": True}, hip=True)


def test_radix_prefix_once_takes_the_unrolled_passes_on_sm90():
    """radix_prefix_once sets Plan.TKP (a TP8 rank's sm_90 default); False and radix_loop (the
    passes' runtime loop, per-tile) turn the default off; True with radix_loop and on gfx950 is
    refused, each with its reason."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(8, 0)
    plan = make_plan(s, 8, True, 264)
    assert not plan.TKP and _with_knobs(plan, s, 264, {"radix_prefix_once": True}).TKP
    sm = dataclasses.replace(plan, **isa_options("sm_90", s))
    assert sm.TKP and not _with_knobs(sm, s, 264, {"radix_prefix_once": False}).TKP
    looped = _with_knobs(sm, s, 264, {"radix_loop": True})
    assert looped.TKL and not looped.TKP
    assert _with_knobs(sm, s, 264, {"index_prefetch": True}).TKP
    with pytest.raises(ValueError, match=r"radix_prefix_once takes the unrolled radix passes"):
        _with_knobs(plan, s, 264, {"radix_prefix_once": True, "radix_loop": True})
    with pytest.raises(ValueError, match=r"radix_prefix_once is not resource-checked on gfx950"):
        _with_knobs(plan, s, 264, {"radix_prefix_once": True}, hip=True)


def test_topk_row_takes_a_power_of_two_with_the_first_pass_in_the_scores_on_sm90():
    """topk_row sets Plan.TKR (true: 4096); a value not a power of two in 256..4096, a build
    without the first radix pass in the index scores or with radix_loop, a layer without the
    indexer and gfx950 are refused, each with its reason."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    assert sm.TKR == 0 and _with_knobs(sm, s, 264, {"topk_row": True}).TKR == 4096
    assert _with_knobs(sm, s, 264, {"topk_row": 512}).TKR == 512
    for bad in (128, 3000, 8192, "4096"):
        with pytest.raises(ValueError, match=r"topk_row .* is not true or a power of two in 256..4096"):
            _with_knobs(sm, s, 264, {"topk_row": bad})
    for extra in ({"hist_in_scores": False}, {"radix_loop": True}):
        with pytest.raises(ValueError, match=r"topk_row takes the first radix pass in the index scores"):
            _with_knobs(sm, s, 264, {"topk_row": True, **extra})
    nidx = dataclasses.replace(make_plan(s, 2, False, 264), **isa_options("sm_90", s))
    with pytest.raises(ValueError, match=r"topk_row needs the indexer"):
        _with_knobs(nidx, s, 264, {"topk_row": True})
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"topk_row spills gfx950's registers"):
        _with_knobs(hip, s, 264, {"topk_row": True}, hip=True)


def test_topk_spread_takes_a_power_of_two_with_the_first_pass_in_the_scores_on_sm90():
    """topk_spread sets Plan.TKS (true: 4096) and its keys a tile (RKS: the rows in about one
    tile a program, 16..128); a bad value, a build without the first radix pass in the index
    scores or with radix_loop, beside topk_row, without the indexer and on gfx950 are refused,
    each with its reason."""
    from mono_common.stages.topk import spread_keys
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    p = _with_knobs(sm, s, 264, {"topk_spread": True})
    assert sm.TKS == 0 and (p.TKS, p.RKS) == (4096, 32) and p.TKR == 0
    assert dataclasses.replace(p, TKS=0, RKS=16) == sm
    assert _with_knobs(sm, s, 264, {"topk_spread": 512}).TKS == 512
    sm8 = dataclasses.replace(make_plan(s, 8, True, 264), **isa_options("sm_90", s))
    assert _with_knobs(sm8, s, 264, {"topk_spread": True}).RKS == 128
    assert [spread_keys(w, 4096, 264) for w in (1, 2, 4, 8, 32)] == [16, 32, 64, 128, 128]
    for bad in (128, 3000, 8192, "4096"):
        with pytest.raises(ValueError, match=r"topk_spread .* is not true or a power of two in 256..4096"):
            _with_knobs(sm, s, 264, {"topk_spread": bad})
    for extra in ({"hist_in_scores": False}, {"radix_loop": True}):
        with pytest.raises(ValueError, match=r"topk_spread takes the first radix pass in the index scores"):
            _with_knobs(sm, s, 264, {"topk_spread": True, **extra})
    with pytest.raises(ValueError, match=r"topk_row and topk_spread each take a short step's top-k"):
        _with_knobs(sm, s, 264, {"topk_spread": True, "topk_row": True})
    nidx = dataclasses.replace(make_plan(s, 2, False, 264), **isa_options("sm_90", s))
    with pytest.raises(ValueError, match=r"topk_spread needs the indexer"):
        _with_knobs(nidx, s, 264, {"topk_spread": True})
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"topk_spread is not resource-checked on gfx950"):
        _with_knobs(hip, s, 264, {"topk_spread": True}, hip=True)


def test_a_tp8_rank_on_sm90_defaults_to_the_spread_top_k_and_the_gathered_absorption():
    """default_knobs: sm_90 at a TP8 rank takes topk_spread and qb_joint (with the indexer) and
    absorb_gather (at most 8 rows); other shapes and gfx950 none. A named knob wins over its
    default (None keeps it); topk_row, topk_row_absorb, radix_loop, count_in_write and
    hist_in_scores false leave the spread top-k out, qb_pair the joint q_b GEMV, and each such
    build is built (the variant's constexprs)."""
    from mono_glm53.kernels.layer import default_knobs, knobs_with_defaults, variant_constexprs

    tp8, tp4 = REAL.tp_shard(8, 0), REAL.tp_shard(4, 0)
    d = default_knobs("sm_90", tp8, 2, True)
    assert d == {"topk_spread": True, "qb_joint": True, "absorb_gather": True}
    assert default_knobs("sm_90", tp8, 2, False) == {"absorb_gather": True}
    assert default_knobs("sm_90", tp8, 4, True) == d == default_knobs("sm_90", tp8, 8, True)
    assert default_knobs("sm_90", tp8, 16, True) == {"topk_spread": True, "qb_joint": True}
    assert default_knobs("gfx950", tp8, 2, True) == {} == default_knobs("sm_90", tp4, 2, True)
    assert default_knobs("sm_90", REAL, 2, True) == {}
    assert knobs_with_defaults(d, {}) == d == knobs_with_defaults(d, {"topk_spread": None})
    assert knobs_with_defaults(d, {"topk_spread": 512, "absorb_gather": False}) == {
        "topk_spread": 512, "qb_joint": True, "absorb_gather": False}
    assert knobs_with_defaults(d, {"hist_in_scores": True})["topk_spread"] is True
    yields = ({"topk_row": True}, {"topk_row": 1024, "topk_row_absorb": True}, {"radix_loop": True},
              {"count_in_write": True}, {"hist_in_scores": False})
    for extra in yields:
        assert knobs_with_defaults(d, extra) == {**extra, "qb_joint": True, "absorb_gather": True}, extra
    assert knobs_with_defaults(d, {"topk_row": False})["topk_spread"] is True
    assert knobs_with_defaults(d, {"qb_pair": True}) == {"qb_pair": True, "topk_spread": True, "absorb_gather": True}
    assert knobs_with_defaults(d, {"qb_pair": False})["qb_joint"] is True
    ce = variant_constexprs(tp8, 2, True, 264, "sm_90")
    assert (ce["TKS"], ce["RKS"], ce["ABG"], ce["QBP"]) == (4096, 32, True, 2)
    for extra in yields:
        ce = variant_constexprs(tp8, 2, True, 264, "sm_90", knobs=extra)
        assert ce["TKS"] == 0 and ce["ABG"] and ce["QBP"] == 2, extra
    assert variant_constexprs(tp8, 2, True, 264, "sm_90", knobs={"qb_pair": True})["QBP"] == 1
    off = variant_constexprs(tp8, 2, True, 264, "sm_90",
                             knobs={"topk_spread": False, "absorb_gather": False, "qb_joint": False})
    assert (off["TKS"], off["ABG"], off["QBP"]) == (0, False, 0)
    assert variant_constexprs(tp8, 2, False, 264, "sm_90")["QBP"] == 0
    ce = variant_constexprs(tp8, 2, True, 256, "gfx950")
    assert (ce["TKS"], ce["ABG"], ce["QBP"]) == (0, False, 0)


def test_topk_spread_select_is_a_form_of_the_spread_top_k():
    """topk_spread_select sets Plan.TSS over the spread top-k (a TP8 rank's sm_90 default, or
    named); without it (topk_spread false, a knob it yields to, a shape without the default)
    and on gfx950 it is refused with its reason."""
    from mono_glm53.kernels.layer import variant_constexprs

    tp8, tp4 = REAL.tp_shard(8, 0), REAL.tp_shard(4, 0)
    ce = variant_constexprs(tp8, 2, True, 264, "sm_90", knobs={"topk_spread_select": True})
    assert ce["TSS"] and ce["TKS"] == 4096 and not variant_constexprs(tp8, 2, True, 264, "sm_90")["TSS"]
    ce = variant_constexprs(tp4, 2, True, 264, "sm_90", knobs={"topk_spread": 1024, "topk_spread_select": True})
    assert ce["TSS"] and ce["TKS"] == 1024
    for s, extra in ((tp8, {"topk_spread": False}), (tp8, {"topk_row": True}), (tp8, {"radix_loop": True}),
                     (tp8, {"hist_in_scores": False}), (tp4, {})):
        with pytest.raises(ValueError, match=r"topk_spread_select is a form of the spread top-k: build it with "):
            variant_constexprs(s, 2, True, 264, "sm_90", knobs={"topk_spread_select": True, **extra})
    with pytest.raises(ValueError, match=r"topk_spread_select is not resource-checked on gfx950"):
        variant_constexprs(tp8, 2, True, 256, "gfx950", knobs={"topk_spread_select": True})


def test_mla_chunk_sets_the_chunk_of_the_streamed_form_on_sm90():
    """mla_chunk sets Plan.CT (16 or 32), not HOLD; a value that is not 16 or 32, beside mla_hold
    and on gfx950 are refused, each with its reason."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    assert sm.CT == 64
    for ct in (16, 32):
        assert _with_knobs(sm, s, 264, {"mla_chunk": ct}) == dataclasses.replace(sm, CT=ct)
    for bad in (8, 64, True, "32"):
        with pytest.raises(ValueError, match=r"mla_chunk .* is not 16 or 32 tokens a chunk"):
            _with_knobs(sm, s, 264, {"mla_chunk": bad})
    with pytest.raises(ValueError, match=r"mla_chunk and mla_hold each set the MLA stage's chunk"):
        _with_knobs(sm, s, 264, {"mla_chunk": 32, "mla_hold": 32})
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"mla_chunk is not resource-checked on gfx950"):
        _with_knobs(hip, s, 264, {"mla_chunk": 32}, hip=True)


def test_topk_row_absorb_moves_the_absorption_with_topk_row_on_sm90():
    """topk_row_absorb sets Plan.TKA beside topk_row; without topk_row or on gfx950 refused."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    p = _with_knobs(sm, s, 264, {"topk_row": True, "topk_row_absorb": True})
    assert not sm.TKA and p.TKA and dataclasses.replace(p, TKA=False) == _with_knobs(sm, s, 264, {"topk_row": True})
    with pytest.raises(ValueError, match=r"topk_row_absorb needs topk_row"):
        _with_knobs(sm, s, 264, {"topk_row_absorb": True})
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"topk_row_absorb is sm_90's") as e:
        _with_knobs(hip, s, 264, {"topk_row": 2048, "topk_row_absorb": True}, hip=True)
    assert "topk_row spills gfx950's registers" in str(e.value)  # every reason at once


def test_postnorm_spread_chunks_like_norm_spread_on_one_rank_of_sm90_only():
    """postnorm_spread sets Plan.PNC to `addnorm_chunks`'s count (24 at 8 rows of a TP8 rank on
    264 programs); a rank of a world (its all-reduced rows have no test in that form yet), a
    hidden size past the [4, HB] row tile and gfx950 are refused, each with its reason."""
    from mono_glm53.kernels.layer import _with_knobs, make_tp_plan

    s = REAL.tp_shard(8, 0)
    plan = make_plan(s, 8, True, 264)
    assert plan.PNC == 0 and _with_knobs(plan, s, 264, {"postnorm_spread": True}).PNC == 24
    assert _with_knobs(plan, s, 264, {"postnorm_spread": False}).PNC == 0
    with pytest.raises(ValueError, match=r"postnorm_spread is built for one rank alone .* its 8-rank form"):
        _with_knobs(make_tp_plan(s, 8, True, 264, 8), s, 264, {"postnorm_spread": True})
    with pytest.raises(ValueError, match=r"postnorm_spread needs the hidden size 6144 in at most 4 row tiles of 1024"):
        _with_knobs(dataclasses.replace(plan, HB=1024), s, 264, {"postnorm_spread": True})
    with pytest.raises(ValueError, match=r"postnorm_spread is not resource-checked on gfx950"):
        _with_knobs(plan, s, 264, {"postnorm_spread": True}, hip=True)


def test_post_attention_norm_and_combine_forms_are_sm90_knobs_each_refused_with_its_reason():
    """postnorm_loop (Plan.PNL), postnorm_split (Plan.PNS: 128-column chunks, one rank) and
    mlacomb_vec (Plan.MCV) set their plan fields on sm_90; gfx950, a rank of a world
    (postnorm_split), two placements of the post-attention norm at once and mlacomb_vec beside
    wuv_combine (which leaves the combine stage empty) are refused, every reason at once."""
    from mono_glm53.kernels.layer import _with_knobs, make_tp_plan

    s = REAL.tp_shard(8, 0)
    plan = make_plan(s, 8, True, 264)
    assert (plan.PNL, plan.PNS, plan.MCV) == (False, 0, False)
    got = [_with_knobs(plan, s, 264, {k: True}) for k in ("postnorm_loop", "postnorm_split", "mlacomb_vec")]
    assert (got[0].PNL, got[1].PNS, got[2].MCV) == (True, 128, True)
    with pytest.raises(ValueError, match=r"postnorm_split is built for one rank alone .* its 8-rank form"):
        _with_knobs(make_tp_plan(s, 8, True, 264, 8), s, 264, {"postnorm_split": True})
    with pytest.raises(ValueError) as e:
        _with_knobs(plan, s, 264, {"postnorm_split": True, "postnorm_loop": True, "mlacomb_vec": True,
                                   "wuv_combine": True})
    # the one conflict told once, by postnorm_split's check
    assert str(e.value).count("each place the post-attention norm") == 1
    assert "postnorm_split and postnorm_loop each place the post-attention norm" in str(e.value)
    assert "mlacomb_vec is the combine stage's form" in str(e.value)
    with pytest.raises(ValueError, match=r"postnorm_loop, postnorm_spread and norm_in_router each place"):
        _with_knobs(plan, s, 264, {"postnorm_loop": True, "postnorm_spread": True})
    with pytest.raises(ValueError) as e:
        _with_knobs(plan, s, 264, {"postnorm_split": True, "mlacomb_vec": True}, hip=True)
    assert "postnorm_split is not resource-checked on gfx950" in str(e.value)
    assert "mlacomb_vec is not resource-checked on gfx950" in str(e.value)
    with pytest.raises(ValueError, match=r"postnorm_loop is not resource-checked on gfx950"):
        _with_knobs(plan, s, 264, {"postnorm_loop": True}, hip=True)


def test_addnorm_is_spread_by_default_on_sm90_only_and_the_knob_turns_it_off():
    """sm_90's builds spread addnorm's rows (Plan.ANC by `addnorm_chunks`) on every shape, the
    launcher's plan and the compiled variant's alike; gfx950's keep one program a row; the
    knob norm_spread False gives one program a row back on sm_90."""
    from mono_glm53.kernels.layer import _with_knobs, addnorm_default, variant_constexprs

    for s in (REAL.tp_shard(8, 0), REAL.tp_shard(4, 0), REAL):
        for w in (1, 2, 8):
            want = addnorm_chunks(s, w, 264, make_plan(s, w, True, 264).HB)
            assert want > 0 and addnorm_default("sm_90", s, w, 264, 2048) == want
            assert addnorm_default("gfx950", s, w, 256, 2048) == 0
            assert variant_constexprs(s, w, True, 264, "sm_90")["ANC"] == want
            assert variant_constexprs(s, w, True, 256, "gfx950")["ANC"] == 0
    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), ANC=48)
    assert _with_knobs(sm, s, 264, {"norm_spread": False}).ANC == 0
    assert _with_knobs(sm, s, 264, {"norm_spread": True}).ANC == 48


@pytest.mark.parametrize("knob,field", [("moe_f16", "MF16"), ("index_f16", "IF16")])
def test_f16_conversions_are_tp8_ranks_sm90_defaults_their_knobs_turn_them_off_and_gfx950_refuses_them(knob, field):
    """Plan.MF16 (the MoE's weights) and Plan.IF16 (the index keys) to f16 for f16 MMAs come
    with sm_90's options where the down loop is pipelined (a TP8 rank); the knob False gives
    the bf16 form back, True sets it elsewhere on sm_90; gfx950 has it off, refuses it on (it
    is sm_90's conversion) and takes it off."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    tp8, tp4 = REAL.tp_shard(8, 0), REAL.tp_shard(4, 0)
    sm = dataclasses.replace(make_plan(tp8, 2, True, 264), **isa_options("sm_90", tp8))
    assert getattr(sm, field) and not getattr(_with_knobs(sm, tp8, 264, {knob: False}), field)
    sm4 = dataclasses.replace(make_plan(tp4, 2, True, 264), **isa_options("sm_90", tp4))
    assert not getattr(sm4, field) and getattr(_with_knobs(sm4, tp4, 264, {knob: True}), field)
    hip = dataclasses.replace(make_plan(tp8, 2, True, 264), **isa_options("gfx950", tp8))
    assert not getattr(hip, field) and not getattr(_with_knobs(hip, tp8, 264, {knob: False}, hip=True), field)
    with pytest.raises(ValueError, match=rf"{knob} is sm_90's e4m3 -> f16 conversion"):
        _with_knobs(hip, tp8, 264, {knob: True}, hip=True)


def test_down_ids_is_a_knob_of_the_pipelined_down_loop_only():
    """down_ids (down's slot ids read once as a vector) sets Plan.DIDV where down's slot loop is
    pipelined (sm_90 at a TP8 rank); where it is not (a TP4 rank, gfx950) it is refused with the
    reason, beside the other bad knobs; off is allowed anywhere."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    tp8, tp4 = REAL.tp_shard(8, 0), REAL.tp_shard(4, 0)
    sm = dataclasses.replace(make_plan(tp8, 8, True, 264), **isa_options("sm_90", tp8))
    assert not sm.DIDV and _with_knobs(sm, tp8, 264, {"down_ids": True}).DIDV
    for s, plan, hip in ((tp4, dataclasses.replace(make_plan(tp4, 2, True, 264), **isa_options("sm_90", tp4)), False),
                         (tp8, dataclasses.replace(make_plan(tp8, 2, True, 264), **isa_options("gfx950", tp8)), True)):
        assert not _with_knobs(plan, s, 264, {"down_ids": False}, hip=hip).DIDV
        with pytest.raises(ValueError, match=r"down_step 3 is not 1 or 2.*down_ids is a form of down's pipelined "
                                             r"slot loop, which this build does not have"):
            _with_knobs(plan, s, 264, {"down_ids": True, "down_step": 3}, hip=hip)


def test_down_items_sets_its_tile_and_is_a_knob_of_the_pipelined_down_only():
    """down_items sets Plan.DIT with 32-column tiles (true or 32) or 64 (BND, the all-reduce's
    blocks too), its loop as deep as the slot loop's (DSTG: 3 at a TP8 rank on sm_90, 3 where
    down is not pipelined, a TP4 rank); another tile and gfx950 are refused with the reason;
    off changes nothing."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    tp8, tp4 = REAL.tp_shard(8, 0), REAL.tp_shard(4, 0)
    sm = dataclasses.replace(make_plan(tp8, 8, True, 264), **isa_options("sm_90", tp8))
    assert not sm.DIT and sm.BND == 32
    for v, bnd in ((True, 32), (32, 32), (64, 64)):
        p = _with_knobs(sm, tp8, 264, {"down_items": v})
        assert p.DIT and p.BND == bnd
    assert _with_knobs(sm, tp8, 264, {"down_items": False}) == sm
    with pytest.raises(ValueError, match=r"down_items 48 is not true, 32 or 64"):
        _with_knobs(sm, tp8, 264, {"down_items": 48})
    small = dataclasses.replace(sm, BLK=32)  # a tile spans one scale block
    with pytest.raises(ValueError, match=r"down_items 64 is wider than the weights' scale block 32"):
        _with_knobs(small, tp8, 264, {"down_items": 64})
    sm4 = dataclasses.replace(make_plan(tp4, 2, True, 264), **isa_options("sm_90", tp4))
    assert not sm4.DSTG and _with_knobs(sm4, tp4, 264, {"down_items": True}).DSTG == 3
    hip = dataclasses.replace(make_plan(tp8, 2, True, 264), **isa_options("gfx950", tp8))
    with pytest.raises(ValueError, match=r"down_items is an sm_90 form"):
        _with_knobs(hip, tp8, 264, {"down_items": True}, hip=True)


def test_gateup_spans_cut_one_rows_slots_into_one_span_a_program():
    """gateup_spans sets Plan.GSP with 128-column swap-AB spans (gateup_bn / gateup_dot change
    them), PERG the items of one row's 1 + top_k slots over the grid and KSG the partial slots a
    column tile can then receive; with gateup_split, silu_fold, a bad tile, over width 2 or on
    gfx950 it is refused with the reason."""
    from mono_common.stages.gemv import span_slots
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    tp8 = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(tp8, 2, True, 264), **isa_options("sm_90", tp8))
    p = _with_knobs(sm, tp8, 264, {"gateup_spans": True})
    kb = tp8.hidden // tp8.block
    assert p.GSP and p.BNG == 128 and p.GDOT == 1
    assert p.PERG == -(-(1 + tp8.top_k) * (2 * tp8.moe_inter_per_rank // 128) * kb // 264)
    assert p.KSG == span_slots(tp8.hidden, tp8.block, p.PERG)
    q = _with_knobs(sm, tp8, 264, {"gateup_spans": True, "gateup_bn": 64, "gateup_dot": 0})
    assert q.BNG == 64 and q.GDOT == 0 and q.PERG > p.PERG // 2
    for bad, msg in (({"gateup_split": 3}, "has no split-K"), ({"silu_fold": True}, "silu_fold counts split-K"),
                     ({"gateup_bn": 48}, "gateup_bn 48 is not 16, 32, 64 or 128")):
        with pytest.raises(ValueError, match=msg):
            _with_knobs(sm, tp8, 264, {"gateup_spans": True, **bad})
    w4 = dataclasses.replace(make_plan(tp8, 4, True, 264), **isa_options("sm_90", tp8))
    with pytest.raises(ValueError, match="gateup_spans is a form for widths up to 2, not 4"):
        _with_knobs(w4, tp8, 264, {"gateup_spans": True})
    hip = dataclasses.replace(make_plan(tp8, 2, True, 264), **isa_options("gfx950", tp8))
    with pytest.raises(ValueError, match="gateup_spans is not resource-checked on gfx950"):
        _with_knobs(hip, tp8, 264, {"gateup_spans": True}, hip=True)


def test_count_in_write_takes_true_or_a_power_of_two_and_is_refused_on_gfx950():
    """count_in_write sets Plan.TKW (true: 4096); a value that is not a power of two in 16..8192
    is refused with what the knob takes, and gfx950 refuses it (not resource-checked there)."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    assert sm.TKW == 0
    assert _with_knobs(sm, s, 264, {"count_in_write": True}).TKW == 4096
    assert _with_knobs(sm, s, 264, {"count_in_write": 512}).TKW == 512
    assert _with_knobs(sm, s, 264, {"count_in_write": False}).TKW == 0
    for bad in (48, 8, 16384, "4096"):
        with pytest.raises(ValueError, match=rf"count_in_write {bad} is not true or a power of two in 16..8192"):
            _with_knobs(sm, s, 264, {"count_in_write": bad})
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"count_in_write is not resource-checked on gfx950"):
        _with_knobs(hip, s, 264, {"count_in_write": True}, hip=True)


def test_prefetch_programs_deals_the_prefetches_over_the_last_programs_or_none():
    """prefetch_programs N sets Plan.PFN: the last N programs issue the weights' L2 prefetches
    (N = the grid or true: every program, 0), 0 none (-1, a TP8 rank's sm_90 default; a TP4
    rank's is every program); a count outside 0..nprog or not an integer is refused with what
    the knob takes, and gfx950, which has no L2 prefetch, refuses it."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    tp4 = REAL.tp_shard(4, 0)
    assert sm.PFN == -1 and dataclasses.replace(make_plan(tp4, 2, True, 264), **isa_options("sm_90", tp4)).PFN == 0
    assert _with_knobs(sm, s, 264, {"prefetch_programs": 64}).PFN == 64
    assert _with_knobs(sm, s, 264, {"prefetch_programs": 264}).PFN == 0
    assert _with_knobs(sm, s, 264, {"prefetch_programs": True}).PFN == 0
    assert _with_knobs(sm, s, 264, {"prefetch_programs": 0}).PFN == -1
    for bad in (-1, 265, False, "64", 1.5):
        with pytest.raises(ValueError, match=r"prefetch_programs .* is not 0 \(no weight prefetch\), a program "
                                             r"count in 1..264 or true \(every program\)"):
            _with_knobs(sm, s, 264, {"prefetch_programs": bad})
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"prefetch_programs deals sm_90's L2 prefetches: gfx950 has none"):
        _with_knobs(hip, s, 264, {"prefetch_programs": 64}, hip=True)


@pytest.mark.parametrize("tp", [8, 4, 1])
def test_oproj_hw_quant_is_the_sm_90_default(tp):
    """Plan.OHQ (o_proj's input rounded to e4m3 on the conversion unit in its spans) is every
    sm_90 shape's default, which the knob oproj_hw_quant false turns off; gfx950, which has no
    such unit, builds without it and refuses the knob true."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(tp, 0) if tp > 1 else REAL
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    assert sm.OHQ and _with_knobs(sm, s, 264, {"oproj_hw_quant": True}).OHQ
    assert not _with_knobs(sm, s, 264, {"oproj_hw_quant": False}).OHQ
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    assert not hip.OHQ and not _with_knobs(hip, s, 264, {"oproj_hw_quant": False}, hip=True).OHQ
    with pytest.raises(ValueError, match=r"oproj_hw_quant is sm_90's conversion unit: gfx950 has none"):
        _with_knobs(hip, s, 264, {"oproj_hw_quant": True}, hip=True)


def test_qb_pair_needs_the_indexer():
    """qb_pair sets Plan.QBP (q_b and wq_b as one loop); a build without the indexer, whose
    stage runs q_b alone, refuses it."""
    from mono_glm53.kernels.layer import _with_knobs

    s = REAL.tp_shard(8, 0)
    plan = make_plan(s, 2, True, 264)
    assert not plan.QBP and _with_knobs(plan, s, 264, {"qb_pair": True}).QBP == 1
    with pytest.raises(ValueError, match=r"qb_pair runs q_b beside the indexer's wq_b: a build without the indexer"):
        _with_knobs(make_plan(s, 2, False, 264), s, 264, {"qb_pair": True})


def test_qb_joint_spans_both_gemvs_tiles_and_sums_fewer_slots():
    """qb_joint sets Plan.QBP 2: at a TP8 rank on 264 programs q_b's 16 column tiles and wq_b's 32,
    16 K blocks each, in one span of 3 items a program (each alone: 1 and 2), so a tile gets 6
    partial slots (16 and 9 alone) and the scratch holds that many; it needs the indexer and is
    not named beside qb_pair."""
    from mono_glm53.kernels.layer import _with_knobs

    s = REAL.tp_shard(8, 0)
    plan = make_plan(s, 2, True, 264)
    assert (plan.PER3, plan.PERQ, plan.KS3, plan.KSQ) == (1, 2, 16, 9)
    j = _with_knobs(plan, s, 264, {"qb_joint": True})
    assert (j.QBP, j.PER3, j.PERQ, j.KS3, j.KSQ) == (2, 3, 3, 6, 6)
    # every item in one span: (16 + 32) tiles x 16 K blocks over 264 programs
    assert j.PER3 * 264 >= 48 * 16 > (j.PER3 - 1) * 264
    with pytest.raises(ValueError, match=r"qb_joint runs q_b beside the indexer's wq_b: a build without the indexer"):
        _with_knobs(make_plan(s, 2, False, 264), s, 264, {"qb_joint": True})
    with pytest.raises(ValueError, match=r"qb_pair and qb_joint are two forms of the q_b and wq_b spans: name one"):
        _with_knobs(plan, s, 264, {"qb_joint": True, "qb_pair": True})


def test_prefetch_bulk_needs_prefetches_and_sm_90():
    """prefetch_bulk sets Plan.PFB where the build issues prefetches (prefetch_sites or
    prefetch_programs at a TP8 rank, whose sm_90 default issues none; a TP4 rank's default
    does); without any it is refused with the knobs that add them, and gfx950 refuses it."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    assert not sm.PFB
    p = _with_knobs(sm, s, 264, {"prefetch_sites": ["qb"], "prefetch_bulk": True})
    assert p.PFB and (p.PFS, p.PFN) == (2, 0)
    assert _with_knobs(sm, s, 264, {"prefetch_programs": 64, "prefetch_bulk": True}).PFB
    tp4 = REAL.tp_shard(4, 0)
    p4 = dataclasses.replace(make_plan(tp4, 2, True, 264), **isa_options("sm_90", tp4))
    assert _with_knobs(p4, tp4, 264, {"prefetch_bulk": True}).PFB
    for knobs in ({"prefetch_bulk": True}, {"prefetch_bulk": True, "prefetch_programs": 0}):
        with pytest.raises(ValueError, match=r"prefetch_bulk changes how the weights' L2 prefetches are issued, "
                                             r"and this build issues none: name prefetch_sites or prefetch_programs"):
            _with_knobs(sm, s, 264, knobs)
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"prefetch_bulk is sm_90's bulk L2 prefetch: gfx950 has none"):
        _with_knobs(hip, s, 264, {"prefetch_bulk": True}, hip=True)


def test_prefetch_sites_sets_the_site_bits_and_refuses_what_requests_nothing_or_twice():
    """prefetch_sites sets Plan.PFS to its sites' bits (stages.PFS_SITES); at a TP8 rank on
    sm_90 (no prefetch by default) every program then issues them unless prefetch_programs
    says otherwise. Unknown or repeated sites, oproj beside oproj_late (the same weights), an
    empty list, prefetch_programs 0 and gfx950 are refused, every reason at once."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options
    from mono_glm53.kernels.stages import PFS_SITES

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    assert sm.PFS == PFS_SITES["start"] + PFS_SITES["qb"] + PFS_SITES["oproj"] + PFS_SITES["down"] == 15
    p = _with_knobs(sm, s, 264, {"prefetch_sites": ["qb", "oproj_late"]})
    assert (p.PFS, p.PFN) == (2 + 16, 0)
    p = _with_knobs(sm, s, 264, {"prefetch_sites": ["down"], "prefetch_programs": 64})
    assert (p.PFS, p.PFN) == (8, 64)
    tp4 = REAL.tp_shard(4, 0)
    p4 = dataclasses.replace(make_plan(tp4, 2, True, 264), **isa_options("sm_90", tp4))
    assert _with_knobs(p4, tp4, 264, {"prefetch_sites": ["start"]}).PFS == 1
    with pytest.raises(ValueError) as e:
        _with_knobs(sm, s, 264, {"prefetch_sites": ["qb", "qb", "oproj", "oproj_late", "mla"],
                                 "prefetch_programs": 0})
    msg = str(e.value)
    for part in ("prefetch_sites ['mla'] are not sites (known: ['down', 'latent', 'oproj', 'oproj_late', 'qb', "
                 "'start', 'topk'])",
                 "names a site twice", "oproj and oproj_late request the same weights",
                 "with prefetch_programs 0 (no prefetch) requests nothing"):
        assert msg.count(part) == 1, (part, msg)
    # the sites after hand-offs 2 and 7: each alone, not beside another that requests the same weights
    p = _with_knobs(sm, s, 264, {"prefetch_sites": ["latent", "topk"], "prefetch_bulk": True})
    assert (p.PFS, p.PFN, p.PFB) == (PFS_SITES["latent"] + PFS_SITES["topk"], 0, True)
    with pytest.raises(ValueError) as e:
        _with_knobs(sm, s, 264, {"prefetch_sites": ["qb", "latent", "oproj_late", "topk"]})
    msg = str(e.value)
    for part in ("prefetch_sites oproj_late and topk request the same weights",
                 "prefetch_sites qb and latent request the same weights"):
        assert msg.count(part) == 1, (part, msg)
    for bad in ([], "qb", [2]):
        with pytest.raises(ValueError, match=r"is not a non-empty list of site names .*prefetch_programs 0"):
            _with_knobs(sm, s, 264, {"prefetch_sites": bad})
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"prefetch_sites places sm_90's L2 prefetches: gfx950 has none"):
        _with_knobs(hip, s, 264, {"prefetch_sites": ["qb"]}, hip=True)


def test_silu_fold_folds_hand_off_19_and_is_refused_on_gfx950():
    """silu_fold sets Plan.SFO, whose launch does not run hand-off 19 (the SiLU in gate_up's
    stage), beside TKF's 6; gfx950 refuses it (not resource-checked there)."""
    from mono_glm53.kernels.layer import _with_knobs, folded_handoffs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 8, True, 264), **isa_options("sm_90", s))
    fold = _with_knobs(sm, s, 264, {"silu_fold": True})
    assert fold.SFO and not sm.SFO and folded_handoffs(fold) == (6, 19) and folded_handoffs(sm) == (6,)
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"silu_fold is not resource-checked on gfx950"):
        _with_knobs(hip, s, 264, {"silu_fold": True}, hip=True)


def test_wuv_combine_folds_hand_off_14_and_mla_hold_sets_the_chunk():
    """wuv_combine sets Plan.WCB, whose launch does not run hand-off 14 (the MLA combine in the
    value projection's tiles); mla_hold sets Plan.HOLD and the chunk CT (true: 32). A chunk
    whose keys pass HOLD's budget, or that is not 16 or 32 tokens, is refused, and gfx950
    refuses both (not resource-checked there), every reason at once."""
    from mono_glm53.kernels.layer import _with_knobs, folded_handoffs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 8, True, 264), **isa_options("sm_90", s))
    wcb = _with_knobs(sm, s, 264, {"wuv_combine": True, "silu_fold": True})
    assert wcb.WCB and not sm.WCB and folded_handoffs(wcb) == (6, 14, 19)
    assert sm.CT == 64 and not sm.HOLD
    for v, ct in ((16, 16), (32, 32), (True, 32)):
        p = _with_knobs(sm, s, 264, {"mla_hold": v})
        assert p.HOLD and p.CT == ct and folded_handoffs(p) == (6,)
    for bad in (8, 64, 24):
        with pytest.raises(ValueError, match=rf"mla_hold {bad} is not 16 or 32 tokens a chunk .* at most 16384 "
                                             r"values and dividing the top-k 2048"):
            _with_knobs(sm, s, 264, {"mla_hold": bad})
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"wuv_combine is not resource-checked on gfx950.*; mla_hold is not "
                                         r"resource-checked on gfx950"):
        _with_knobs(hip, s, 264, {"wuv_combine": True, "mla_hold": 16}, hip=True)


def test_norm_in_router_folds_hand_off_17_with_one_o_proj_slot_a_row():
    """norm_in_router sets Plan.NIR (hand-off 17 folded: the norm in the router's programs) and
    FIX9 (a row is one o_proj slot to read). Refused: beside postnorm_spread, with
    oproj_fixup False, at a launch of several ranks (its all-reduce form has not run), on
    gfx950."""
    from mono_glm53.kernels.layer import _with_knobs, folded_handoffs, isa_options, make_tp_plan

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    nir = _with_knobs(sm, s, 264, {"norm_in_router": True})
    assert nir.NIR and nir.FIX9 and not sm.NIR and not sm.FIX9 and folded_handoffs(nir) == (6, 17)
    with pytest.raises(ValueError, match=r"norm_in_router and postnorm_spread both place"):
        _with_knobs(sm, s, 264, {"norm_in_router": True, "postnorm_spread": True})
    with pytest.raises(ValueError, match=r"norm_in_router reads one o_proj slot a row \(oproj_fixup\)"):
        _with_knobs(sm, s, 264, {"norm_in_router": True, "oproj_fixup": False})
    tp = dataclasses.replace(make_tp_plan(s, 2, True, 264, 8), **isa_options("sm_90", s))
    with pytest.raises(ValueError, match=r"norm_in_router is built for one rank alone .* its 8-rank"):
        _with_knobs(tp, s, 264, {"norm_in_router": True})
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"norm_in_router is not resource-checked on gfx950"):
        _with_knobs(hip, s, 264, {"norm_in_router": True}, hip=True)


def test_absorb_gather_sets_its_plan_and_refuses_what_it_cannot_build():
    """absorb_gather sets Plan.ABG (no hand-off folded, the default's tiles otherwise); refused
    on gfx950 (not resource-checked there) and where q_nope is not at most 4 blocks of 256
    columns at most."""
    from mono_glm53.kernels.layer import _with_knobs, folded_handoffs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    p = _with_knobs(sm, s, 264, {"absorb_gather": True})
    assert p.ABG and not sm.ABG and folded_handoffs(p) == folded_handoffs(sm)
    assert dataclasses.replace(p, ABG=False) == sm
    wide = dataclasses.replace(s, qk_nope=320)
    with pytest.raises(ValueError, match=r"absorb_gather takes q_nope \(320\) in at most 4 blocks of 64"):
        _with_knobs(sm, wide, 264, {"absorb_gather": True})
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"absorb_gather is not resource-checked on gfx950"):
        _with_knobs(hip, s, 264, {"absorb_gather": True}, hip=True)


def test_handoff_spin_sets_its_plan_on_sm90_and_is_refused_on_gfx950():
    """handoff_spin sets Plan.HSP and nothing else; gfx950 cannot run its sm_90 assembly."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(8, 0)
    sm = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    p = _with_knobs(sm, s, 264, {"handoff_spin": True})
    assert p.HSP and not sm.HSP
    assert dataclasses.replace(p, HSP=False) == sm
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    with pytest.raises(ValueError, match=r"handoff_spin is sm_90 inline assembly: gfx950 builds without it"):
        _with_knobs(hip, s, 264, {"handoff_spin": True}, hip=True)


def test_knobs_that_are_sm90_only_are_refused_on_gfx950_with_the_rest():
    """hw_quant is sm_90's conversion unit (gfx950's cast is unchecked against torch here): on
    by default there (`isa_options`), off with the knob, and refused on a HIP device beside
    every other bad knob; off is allowed anywhere. radix_loop and sync_call: sm_90 only."""
    from mono_glm53.kernels.layer import _with_knobs, isa_options

    s = REAL.tp_shard(8, 0)
    plan = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("sm_90", s))
    assert plan.HWQ and not _with_knobs(plan, s, 264, {"hw_quant": False}).HWQ
    hip = dataclasses.replace(make_plan(s, 2, True, 264), **isa_options("gfx950", s))
    assert not _with_knobs(hip, s, 264, {"hw_quant": False}, hip=True).HWQ
    with pytest.raises(ValueError, match=r"unknown knobs \['weights_before_wait'\] .known: .*\); down_step 3 is not 1 "
                                         r"or 2; hw_quant is sm_90's conversion unit: on gfx950 build without it"):
        _with_knobs(hip, s, 264, {"hw_quant": True, "down_step": 3, "weights_before_wait": True}, hip=True)
    # the code-size knobs: sm_90's call and a loop that spilled gfx950's registers
    with pytest.raises(ValueError, match=r"radix_loop spills gfx950's registers: .*; sync_call is sm_90's: "):
        _with_knobs(hip, s, 264, {"radix_loop": True, "sync_call": True}, hip=True)
    both = _with_knobs(plan, s, 264, {"radix_loop": True, "sync_call": True})
    assert both.TKL and both.SYC and not (plan.TKL or plan.SYC)


def test_code_pad_takes_a_stage_by_name_or_number_and_refuses_the_rest_at_once():
    """The code_pad probe: [stage, KB] sets Plan.PADS / PADKB (a stage's name or number, KB of
    either sign); a stage out of range, the hand-off hist_in_scores folds away, a zero or
    oversized KB and a malformed value are each refused with what the knob takes."""
    from mono_glm53.kernels.layer import PAD_MAX_KB, _with_knobs

    s = REAL.tp_shard(8, 0)
    plan = make_plan(s, 2, True, 264)
    assert (plan.PADS, plan.PADKB) == (0, 0)
    p = _with_knobs(plan, s, 264, {"code_pad": ["mla", 16]})
    assert (p.PADS, p.PADKB) == (12, 16)
    p = _with_knobs(plan, s, 264, {"code_pad": [20, -PAD_MAX_KB]})
    assert (p.PADS, p.PADKB) == (20, -PAD_MAX_KB)
    # without the fold, hand-off 6 runs: a pad there is allowed
    assert _with_knobs(plan, s, 264, {"code_pad": ["tkhist0", 8]}).PADS == 6
    for bad in (["addnorm", 8], [21, 8], ["mla", 0], ["mla", PAD_MAX_KB + 1], "mla", ["nope", 4], ["mla", 1.5]):
        with pytest.raises(ValueError, match=r"code_pad .* is not \[stage, KB\]"):
            _with_knobs(plan, s, 264, {"code_pad": bad})
    with pytest.raises(ValueError, match=r"code_pad \['tkhist0', 8\] is not .*"):
        _with_knobs(plan, s, 264, {"code_pad": ["tkhist0", 8], "hist_in_scores": True})


def test_next_layer_prefetch_takes_one_of_its_stages_and_is_sm90_only():
    """next_layer_prefetch: mla / gateup / down set Plan.NXS to that stage; any other value is
    refused with the ones allowed, and gfx950 (no L2-only prefetch) refuses it."""
    from mono_glm53.kernels.layer import NEXT_PREFETCH_STAGES, _with_knobs

    s = REAL.tp_shard(8, 0)
    plan = make_plan(s, 2, True, 264)
    assert plan.NXS == 0
    for name, st in NEXT_PREFETCH_STAGES.items():
        assert _with_knobs(plan, s, 264, {"next_layer_prefetch": name}).NXS == st
    with pytest.raises(ValueError, match=r"next_layer_prefetch 'oproj' is not one of \['down', 'gateup', 'mla'\]"):
        _with_knobs(plan, s, 264, {"next_layer_prefetch": "oproj"})
    with pytest.raises(ValueError, match="next_layer_prefetch is sm_90's L2 prefetch"):
        _with_knobs(plan, s, 264, {"next_layer_prefetch": "down"}, hip=True)
