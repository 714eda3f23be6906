"""Peer buffers across rank PROCESSES on one GPU (mono_common.peer.allocate: CUDA IPC handles
over a gloo group) and fail-stop through the peer abort flag.

Each rank is its own process (peer_rank_child.py, started by mono_common.testing.ranks); run
with the CUDA MPS daemon up (`nvidia-cuda-mps-control -d`) so the ranks' kernels run at once
(without it they time-slice and the fault test's margin may not hold).
- every rank's address tables hold every rank's pool, its own at its own index, and the
  one-shot all-reduce over them gives every rank the fp32 rank-order sum, bit for bit, launch
  after launch (both mailbox halves);
- rank 1 stalls with a 0.3 s deadline while the others wait with 10 s: rank 1's timeout raises
  the abort flag in every rank's peer region and every rank stops within 0.3 s + margin,
  naming rank 1 as the origin.
"""

import os

import pytest

from mono_common.testing.ranks import run_ranks

CHILD = os.path.join(os.path.dirname(__file__), "peer_rank_child.py")
SHORT_S = 0.3
# A launch of the waiting ranks ends this long after rank 1's deadline at most: the abort
# fan-out takes microseconds under MPS; the rest is the barrier's release skew and the launch
# and synchronize calls. Far below the others' own 10 s deadline.
MARGIN_S = 0.7


def _ok(results):
    bad = [r for r in results if r.get("exit") != 0 or "rank" not in r]
    assert not bad, "\n".join(f"exit {r.get('exit')}: {r.get('log')}" for r in bad)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_processes_all_reduce_through_ipc_peer_tables(world):
    res = run_ranks(CHILD, world, "allreduce", timeout_s=240)
    _ok(res)
    for name in ("mbox", "flags"):
        for q, r in enumerate(res):
            assert r["tables"][name][q] == r["local"][name], "a rank's own entry is its own pool"
            assert len(set(r["tables"][name])) == world
    for r in res:
        assert r["max_abs"] == 0.0, r
    digests = {d for r in res for d in r["digests"]}
    assert len(digests) == 1, "every rank and every launch must hold the same bits"


@pytest.mark.parametrize("world", [2, 4])
def test_a_timeout_on_one_process_stops_every_process(world):
    res = run_ranks(CHILD, world, "fault", timeout_s=240)
    _ok(res)
    for r in res:
        assert r["stopped"], r
        assert r["flag"] == 2, "rank 1 (+1) raised every rank's abort flag"
        assert r["wall_s"] < SHORT_S + MARGIN_S, (r["rank"], r["wall_s"])
    one = res[1]
    assert one["code"] == 1 and one["word_rank"] == 1 and one["origin"] == 1, one
    assert "guarded wait timed out: stage 7, rank 1, program 0" in one["message"], one["message"]
    for r in res[:1] + res[2:]:
        assert r["code"] == 2 and r["origin"] == 1 and r["word_rank"] == r["rank"], r
        assert "stopped on the abort flag raised by rank 1" in r["message"], r["message"]
