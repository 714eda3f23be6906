"""GLM-5.3's layer at TP 2, 4 and 8 with every rank its own PROCESS on the one H200, through
the serving path's peer buffers (build.layer_peers: CUDA IPC handles over a gloo group, the
abort flag in a peer region) and its launcher (build.KernelLayer); tp_rank_child.py is one
rank. Start the CUDA MPS daemon first (`nvidia-cuda-mps-control -d`): without it the ranks'
kernels time-slice instead of running at once.

- every rank's layer output, residual, top-k and written KV rows hold the same bits, launch
  after launch, and rank 0's output is within NUMERICS of `reference.decoder_layer_tp`
  (width 2; tp_rank_child.py takes a list of widths: build allocates every width's regions);
- a wait fault on rank 1 (program 0 never signals the hand-off into the MLA stage, its
  deadline 0.5 s, every other rank's 10 s) stops every rank within 0.5 s + margin: rank 1
  names the timeout at stage 12, every other rank the abort flag rank 1 raised.
"""

import os

import pytest

from mono_common.testing.ranks import run_ranks

CHILD = os.path.join(os.path.dirname(__file__), "tp_rank_child.py")
CTX = 4096
SHORT_S = 0.5
# The other ranks stop this long after rank 1's deadline at most: the abort fan-out takes
# microseconds under MPS, the rest is the barrier's release skew and the launch/synchronize
# calls; rank 0's own deadline (10 s) is far beyond it, so passing proves the abort reached it.
MARGIN_S = 1.0


def _ok(results):
    bad = [r for r in results if r.get("exit") != 0 or "rank" not in r]
    assert not bad, "\n\n".join(f"exit {r.get('exit')}:\n{r.get('log')}" for r in bad)


# (world, widths, seconds): each world compiles its own kernel variant (~30-60 s, every rank at
# once) after every rank made the real layer's random weights
@pytest.mark.parametrize("world,widths,limit_s", [(2, "2", 300), (4, "2", 360), (8, "2", 480)])
def test_tp_rank_processes_match_the_reference_and_each_other(world, widths, limit_s):
    res = run_ranks(CHILD, world, "layer", widths, str(CTX), timeout_s=limit_s)
    _ok(res)
    for width in widths.split(","):
        per_rank = [r["widths"][width] for r in res]
        m = per_rank[0]["metrics"]
        assert per_rank[0]["failures"] == {}, (width, per_rank[0]["failures"], m)
        assert "glm53_layer.hidden.cosine_min" in m, m  # the stream was compared on some row
        launches = [d for r in per_rank for d in r["digests"]]
        assert all(d == launches[0] for d in launches), f"width {width}: ranks or launches differ"
        assert all(r["ranks_equal_max_abs"] == 0.0 for r in per_rank)


def test_a_wait_fault_on_one_rank_process_stops_every_rank():
    res = run_ranks(CHILD, 2, "fault", "2", str(CTX), timeout_s=300)
    _ok(res)
    for r in res:
        assert r["stopped"], r
        assert r["flag"] == 2, "rank 1 (+1) raised every rank's abort flag"
        assert r["wall_s"] < SHORT_S + MARGIN_S, (r["rank"], r["wall_s"])
    one, zero = res[1], res[0]
    assert one["code"] == 1 and one["word_rank"] == 1 and one["stage"] == 12, one
    assert "guarded wait timed out: stage 12 (mla), rank 1" in one["message"], one["message"]
    assert zero["code"] == 2 and zero["origin"] == 1 and zero["word_rank"] == 0, zero
    assert "stopped on the abort flag raised by rank 1" in zero["message"], zero["message"]
    # the device clock (%globaltimer, ns, one clock for both processes) at each rank's stop
    assert 0 <= (zero["stamp"] - one["stamp"]) / 1e9 < MARGIN_S, (zero["stamp"], one["stamp"])
