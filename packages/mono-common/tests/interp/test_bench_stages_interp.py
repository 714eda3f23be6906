"""`mono bench stages`' host side under the interpreter, at tiny sizes: every stage's case builds
its inputs, runs its check against the CPU reference and its timed launches (graph timing
replaced by one plain call: the interpreter has no CUDA graphs), and the warm-up runs cases in
worker processes. One program: a linked launch's hand-offs cannot complete here otherwise."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from mono_common import graph_timing  # noqa: E402
from mono_common.bench import stages as B  # noqa: E402

TINY = [
    B.Job("gemv", (256, 256), 1, "s128f", 1),
    B.Job("gemv", (256, 256), 2, "k64", 1),
    B.Job("topk", (600, 128), 3, "radix", 1),
    B.Job("mla", (4, 128, 64, 64, 128, 16), 2, "ct16", 1),
    B.Job("handoff", (5,), None, "grid1", 1),
    B.Job("gemv", (256, 256), 1, "s128fqh", 1),  # the flag hand-off after each weight set
]


@pytest.fixture
def one_call_timer(monkeypatch):
    calls = []

    def median_us(fn, launches=1, replays=60, warmup=5):
        fn()
        calls.append(fn)
        return 10.0

    monkeypatch.setattr(graph_timing, "graph_median_us", median_us)
    monkeypatch.setattr(B, "MAX_SETS", 4)
    return calls


def test_every_stage_checks_and_times_its_case(one_call_timer, tmp_path):
    printed = []
    res = B.bench_jobs(torch, torch.device("cpu"), TINY, ceiling=4.0, replays=3, out=printed.append)
    assert [r.get("error") for r in res] == [None] * len(TINY), printed
    gemv, gemv2, topk, mla, hand, gemvh = res
    assert gemv["rel_err"] < 1e-3 and gemv2["rel_err"] < 1e-6
    assert topk["check"] == "exact" and topk["L"] == 4 and topk["bytes"] == 3 * 600 * 4
    assert mla["rel_err"] < B.MLA_REL_BOUND and mla["L"] == 4
    assert hand["check"] == "counter" and hand["handoffs"] == 5
    # per set: a launch's time over its sets, against the floor of one set's bytes
    assert topk["us_bar"] == 10.0 / 4 and topk["frac_bar"] == pytest.approx(topk["floor_us"] / 2.5)
    assert {"us_bar", "us_nobar", "frac_nobar"} <= set(mla) and "us_nobar" not in topk
    # a hand-off: (launch of 5 - launch of none) / 5
    assert hand["us_bar"] == 0.0 and hand["us_launch"] == 10.0 and hand["meets_target"]
    # and the flag hand-off beside it, on the same grid
    assert hand["us_flag"] == 0.0 and hand["meets_target_flag"]
    # and the split hand-off's forms a CPU can run (the acquire-load ones are NVIDIA's)
    assert hand["us_forms"] == {"split8": 0.0}
    assert gemv["handoff"] == "counter" and gemvh["handoff"] == "flag" and gemvh["xq"] and gemvh["rel_err"] < 1e-3
    assert len(one_call_timer) == 2 + 2 + 1 + 2 + 4 + 2 and len(printed) == len(TINY)
    json.dumps(res)  # what main writes
    assert B.summary(res)
    B.plot(res, str(tmp_path / "stages_bench.png"))


def test_the_row_topk_variant_checks_and_hands_off_once_a_set(one_call_timer):
    """`row`: the sets' whole top-k by one program a row (`topk.topk_rows_one`), one hand-off a
    set; the same integers as the reference (ties in index order)."""
    job = B.Job("topk", (600, 128), 3, "row", 1)
    (row,) = B.bench_jobs(torch, torch.device("cpu"), [job], ceiling=4.0, replays=3, out=lambda s: None)
    assert row.get("error") is None and row["check"] == "exact", row
    assert row["variant"] == "row" and row["handoffs_per_set"] == 1 and row["L"] == 4


def test_the_seeded_row_topk_variant_checks_and_hands_off_twice_a_set(one_call_timer):
    """`rowh`: radix pass 0, a hand-off, then the row search seeded by its histogram, a hand-
    off: the reference's integers, over 4 sets whose histogram slices zero each other."""
    job = B.Job("topk", (600, 128), 3, "rowh", 1)
    (row,) = B.bench_jobs(torch, torch.device("cpu"), [job], ceiling=4.0, replays=3, out=lambda s: None)
    assert row.get("error") is None and row["check"] == "exact", row
    assert row["variant"] == "rowh" and row["handoffs_per_set"] == 2 and row["L"] == 4


@pytest.mark.parametrize("variant,handoffs", [("spread", 3), ("spreads", 2)])
def test_the_spread_topk_variants_check_and_hand_off_after_each_stage(one_call_timer, variant, handoffs):
    """`spread`: radix pass 0, the spread threshold, the spread write, a hand-off after each;
    `spreads`: radix pass 0, then the threshold and write as one stage: the reference's
    integers over 4 sets whose histogram slices zero each other (the threshold word included)."""
    job = B.Job("topk", (600, 128), 3, variant, 1)
    (row,) = B.bench_jobs(torch, torch.device("cpu"), [job], ceiling=4.0, replays=3, out=lambda s: None)
    assert row.get("error") is None and row["check"] == "exact", row
    assert row["variant"] == variant and row["handoffs_per_set"] == handoffs and row["L"] == 4


def test_a_row_top_k_longer_than_its_rows_is_refused():
    from mono_common.stages import linked_host as LH

    bufs = LH.topk_buffers(1, 600, 128, "cpu")
    seqlen = torch.full((1,), 600, dtype=torch.int32)
    for row in (512, 768):
        with pytest.raises(ValueError, match=f"row {row} must be a power of two of at least the rows' 600 keys"):
            LH.launch_topk_linked(torch.zeros(2, 1, 600), seqlen, bufs, 1, row)
    with pytest.raises(ValueError, match="hist seeds the one-program-a-row search: give row"):
        LH.launch_topk_linked(torch.zeros(2, 1, 600), seqlen, bufs, 1, 0, hist=True)
    for spread in (512, 768):
        with pytest.raises(ValueError, match=f"spread {spread} must be a power of two of at least the rows' 600"):
            LH.launch_topk_linked(torch.zeros(2, 1, 600), seqlen, bufs, 1, spread=spread)
    with pytest.raises(ValueError, match=r"spread needs the fine histograms: make the buffers with topk_buffers"):
        LH.launch_topk_linked(torch.zeros(2, 1, 600), seqlen, bufs, 1, spread=1024)
    with pytest.raises(ValueError, match=r"select is a form of the spread top-k: give spread"):
        LH.launch_topk_linked(torch.zeros(2, 1, 600), seqlen, bufs, 1, select=True)


def test_a_failing_check_is_reported_and_still_timed(one_call_timer, monkeypatch):
    from mono_common.ref import topk as ref_topk

    monkeypatch.setattr(ref_topk, "topk_index_order", lambda s, n, k: torch.zeros(s.shape[0], k, dtype=torch.long))
    job = B.Job("topk", (300, 128), 2, "radix", 1)
    (row,) = B.bench_jobs(torch, torch.device("cpu"), [job], ceiling=4.0, replays=3, out=lambda s: None)
    assert row["error"] == "2 of 2 rows differ from the reference" and "us_bar" in row


def test_warm_up_runs_cases_in_worker_processes(monkeypatch):
    printed = []
    # the workers import the module afresh (MAX_SETS back to 512 sets): hand-offs only there
    B.warm([TINY[4], B.Job("handoff", (3,), None, "grid1", 1)], 2, out=printed.append, device="cpu")
    assert printed == []
    monkeypatch.setattr(B, "MAX_SETS", 4)
    B._warm_one(TINY[3], device="cpu")
