"""`mono bench stages` on the CPU: its arguments, the plan of cases they make, the input sets
that rotate past the L2, the rows it prints and the expert stage's hook (no GPU, no kernel)."""

import dataclasses
import sys
import types

import pytest

from mono_common.bench import stages as B
from mono_common.stages.gemv_host import GemvPlan

L2 = 60 << 20


def plan(*argv, nprog=264):
    return B.make_plan(B.parse_args(list(argv)), nprog)


def test_the_default_plan_runs_every_stage_at_glm53_shapes():
    jobs = plan()
    by = {s: [j for j in jobs if j.stage == s] for s in B.STAGES}
    assert len(by["gemv"]) == len(B.GEMV_SHAPES) * 3 * len(B.GEMV_VARIANTS)
    # s128fq with each hand-off form: the plan is the same, only the hand-off differs
    assert {k: v for k, v in B.GEMV_VARIANTS["s128fqh"].items() if k != "hflag"} == B.GEMV_VARIANTS["s128fq"]
    assert B.variant_plan("s128fqh", 2624, 6144, 1, 264) == B.variant_plan("s128fq", 2624, 6144, 1, 264)
    # s128fqn: s128fq's tiling, each weight set's successor requested into the L2 ahead
    ahead, xq = B.variant_plan("s128fqn", 2624, 6144, 1, 264)
    assert ahead.l2_ahead and xq and ahead == dataclasses.replace(B.variant_plan("s128fq", 2624, 6144, 1, 264)[0],
                                                                  l2_ahead=True)
    # s128fh: s128f's tiling, x quantised in the loop on the conversion unit
    hw, xq = B.variant_plan("s128fh", 6144, 2048, 1, 264)
    assert hw.hwx and not xq and hw == dataclasses.replace(B.variant_plan("s128f", 6144, 2048, 1, 264)[0], hwx=True)
    # s128fqb: the same requests as bulk prefetches
    bulk, xq = B.variant_plan("s128fqb", 2624, 6144, 1, 264)
    assert bulk.l2_ahead == 2 and xq and bulk == dataclasses.replace(ahead, l2_ahead=2)
    with pytest.raises(ValueError, match=r"l2_ahead 3: 0 \(none\), 1 \(a line a lane\) or 2 \(bulk prefetches\)"):
        GemvPlan.make(2624, 6144, 1, 264, l2_ahead=3)
    # the radix stages at every length, one program a row (`row`, and `rowh` seeded by radix
    # pass 0) and the spread form (`spread`, and `spreads` in one stage) where the rows fit
    # their 4096 keys
    assert {(j.shape, j.rows, j.variant) for j in by["topk"]} == \
        {((n, 2048), r, "radix") for n in (4096, 65536, 200000) for r in (1, 8)} | \
        {((4096, 2048), r, v) for r in (1, 8) for v in ("row", "rowh", "spread", "spreads")}
    assert {(j.rows, j.variant) for j in by["mla"]} == {(r, v) for r in (1, 8) for v in ("ct64", "ct16", "ct16h", "ct32h")}
    heads, latent, rope, selected, ctx, page = B.MLA_SHAPE
    assert (heads, latent, rope, selected, page) == (64 // 8, 512, 64, 2048, 64) and ctx > selected
    # 2 and 1 programs per SM, 1000 hand-offs a launch
    assert [(j.nprog, j.shape) for j in by["handoff"]] == [(264, (1000,)), (132, (1000,))]
    assert by["expert"] == []  # its module times it, after the planned cases
    assert [j.stage for j in jobs] == sorted((j.stage for j in jobs), key=["gemv", "topk", "mla", "handoff"].index)


def test_a_subset_of_stages_rows_and_keys():
    jobs = plan("--stages", "topk,handoff", "--rows", "8", "--keys", "4096", "--handoffs", "50", nprog=100)
    assert [(j.stage, j.shape, j.rows, j.nprog, j.variant) for j in jobs] == [
        ("topk", (4096, 2048), 8, 100, "radix"), ("topk", (4096, 2048), 8, 100, "row"),
        ("topk", (4096, 2048), 8, 100, "rowh"), ("topk", (4096, 2048), 8, 100, "spread"),
        ("topk", (4096, 2048), 8, 100, "spreads"),
        ("handoff", (50,), None, 100, "grid100"), ("handoff", (50,), None, 50, "grid50")]
    assert [j.variant for j in plan("--stages", "topk", "--rows", "1", "--keys", "4097")] == ["radix"]
    jobs = plan("--stages", "gemv,mla", "--shapes", "2048x2048", "--variants", "s128f", "--rows", "2",
                "--mla-variants", "ct64")
    assert [(j.stage, j.shape, j.rows, j.variant) for j in jobs] == [
        ("gemv", (2048, 2048), 2, "s128f"), ("mla", B.MLA_SHAPE, 2, "ct64")]
    assert plan("--stages", "expert") == []


@pytest.mark.parametrize("argv", [["--stages", "gemv,bogus"], ["--rows", "1,x"], ["--rows", "0"],
                                  ["--shapes", "2048"], ["--variants", "nope"], ["--mla-variants", "ct8"],
                                  ["--handoffs", "0"], ["--stages", ""], ["--expert-variants", "fused,nope"],
                                  ["--expert-shapes", "glm53-tp3"]])
def test_bad_arguments_exit_2_with_a_reason(argv, capsys):
    with pytest.raises(SystemExit) as e:
        B.parse_args(argv)
    assert e.value.code == 2
    assert "error: argument" in capsys.readouterr().err


def test_expert_variants_and_shapes_are_picked_by_name():
    from mono_common.bench.expert import EXPERT_SHAPES, EXPERT_VARIANTS

    a = B.parse_args(["--stages", "expert", "--expert-variants", "fused,pipe3cvt", "--expert-shapes", "glm53-tp8"])
    assert a.expert_variants == ["fused", "pipe3cvt"] and a.expert_shapes == ["glm53-tp8"]
    a = B.parse_args([])
    assert a.expert_variants is None and a.expert_shapes is None  # every one of them
    assert {"fused", "pipe3cvt", "tiles2"} <= set(EXPERT_VARIANTS) and "glm53-tp4" in EXPERT_SHAPES


def test_sets_rotate_past_3x_the_l2_where_the_bytes_matter():
    for job in plan():
        if job.stage == "gemv":
            n, k = job.shape
            set_bytes = n * k
        elif job.stage == "topk":
            set_bytes = job.rows * job.shape[0] * 4
        elif job.stage == "mla":
            heads, latent, rope, selected, _, _ = job.shape
            set_bytes = job.rows * selected * (latent + rope) * 2
        else:
            continue
        sets = B.sets_for(set_bytes, even=job.stage == "topk")
        assert 4 <= sets <= B.MAX_SETS + 1
        if job.stage == "topk":
            assert sets % 2 == 0  # its sets zero each other's histograms in turn
        # a set of a few kB is latency-bound: capped, it may stay in the L2 (rows say so)
        if set_bytes * B.MAX_SETS >= B.ROTATE_BYTES:
            assert sets * set_bytes > 3 * L2, job


def test_rows_print_time_floor_and_check():
    gemv = dict(stage="gemv_fp8", shape="2624x6144", rows=1, variant="s128f", BN=128, KS=1, PER=4, us_bar=9.0,
                frac_bar=0.4, us_nobar=7.5, frac_nobar=0.5, floor_us=3.6, rel_err=1e-4, seconds=1.0)
    line = B.format_row(gemv)
    assert "9.00 us" in line and "40.0 %" in line and "no hand-off" in line and "floor 3.60 us" in line
    topk = dict(stage="topk", shape="2048of200000", rows=8, variant="radix", us_bar=30.0, frac_bar=0.05,
                floor_us=1.5, check="exact")
    assert "exact" in B.format_row(topk) and "no hand-off" not in B.format_row(topk)
    hand = dict(stage="handoff", shape="1000x", rows=None, variant="grid264", nprog=264, handoffs=1000,
                us_bar=1.2, us_flag=0.8, us_launch=3.0, target_us=1.0, meets_target=False, meets_target_flag=True)
    assert "1.200 us a hand-off" in B.format_row(hand) and "NOT met" in B.format_row(hand)
    assert "flag hand-off 0.800 us (met)" in B.format_row(hand)
    failed = dict(stage="mla", shape="2048tok8h", rows=1, variant="ct16", error="OutOfResources: shared")
    assert "FAILED: OutOfResources" in B.format_row(failed)
    lines = B.summary([gemv, dict(gemv, variant="k64", us_bar=20.0, frac_bar=0.18), topk, hand, failed])
    assert any("gemv_fp8" in ln and "s128f" in ln and "9.00 us" in ln for ln in lines)
    assert any("264 programs: 1.200 us (misses" in ln for ln in lines)
    assert any("flag hand-off on 264 programs: 0.800 us (meets" in ln for ln in lines)
    assert any("1 row(s) with an error" in ln for ln in lines)


def test_the_expert_stage_is_its_modules(monkeypatch):
    seen = {}

    def bench_expert(torch, dev, nprog, ceiling, replays, shapes=None, variants=None):
        seen.update(nprog=nprog, ceiling=ceiling, replays=replays, shapes=shapes, variants=variants)
        return [dict(stage="expert", shape="9x2048x6144", rows=1, variant="slots", us_bar=40.0, frac_bar=0.7)]

    fake = types.ModuleType("mono_common.bench.expert")
    fake.bench_expert = bench_expert
    fake.warm_expert = lambda nprog, workers, shapes, variants: seen.update(warm=(nprog, workers, shapes, variants))
    monkeypatch.setitem(sys.modules, "mono_common.bench.expert", fake)
    printed = []
    rows = B.bench_expert_rows(None, "cuda", 264, 4.2, 30, out=printed.append, shapes=["glm53-tp8"],
                               variants=["fused"])
    assert rows[0]["us_bar"] == 40.0
    assert seen == dict(nprog=264, ceiling=4.2, replays=30, shapes=["glm53-tp8"], variants=["fused"])
    assert printed == []  # its module prints its rows
    B.warm_expert(264, 8, ["glm53-tp8"], None)
    assert seen["warm"] == (264, 8, ["glm53-tp8"], None)

    def broken(*args, **kw):
        raise RuntimeError("no such tile")

    fake.bench_expert = broken
    rows = B.bench_expert_rows(None, "cuda", 264, 4.2, 30, out=printed.append)
    assert rows == [dict(stage="expert", error="RuntimeError: no such tile")]
    monkeypatch.setitem(sys.modules, "mono_common.bench.expert", None)  # not installed
    (row,) = B.bench_expert_rows(None, "cuda", 264, 4.2, 30, out=printed.append)
    assert row["stage"] == "expert" and "not available" in row["error"]
    assert len(printed) == 2 and all("FAILED" in p for p in printed)
    B.warm_expert(264, 8)  # no module, no hook: nothing to do


def test_without_a_gpu_the_bench_says_so(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert B.main(["--stages", "handoff"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


def test_every_expert_variant_plans_at_every_shape_and_row_count():
    """Each EXPERT_VARIANTS entry is a valid MoePlan at every bench shape and row count (a
    variant whose options contradict each other would only fail on the GPU, as its row)."""
    from mono_common.bench.expert import EXPERT_SHAPES, EXPERT_VARIANTS
    from mono_common.stages.moe_host import MoePlan

    for name, opts in EXPERT_VARIANTS.items():
        for H, I, E, K in EXPERT_SHAPES.values():  # noqa: E741
            for rows in (1, 2, 8):
                plan = MoePlan.make(H, I, E, K, rows, 264, **opts)
                assert plan.NSLOT == 1 + min(E, rows * K), name
