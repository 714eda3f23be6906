"""GPU (H200) tests of the fused GLM-5.3 layer kernel at real shapes on random weights.

Fused == reference within NUMERICS at the TP8-rank shard and the whole TP1 layer, widths
2/4/8 (full and with a pad row), contexts 1000 / 4096 / 65536; fused == staged bit for bit
(width 2); random per-program stage delays change no bit; 1000 replays of one captured graph
with changing inputs equal eager launches; a pointer table first built inside a graph capture
replays correctly; pad rows leave every other cache row untouched; with every buffer fenced
by poisoned bands no launch reads or writes past one.
"""

import pytest
import torch

# No skipif here: the mono pytest plugin marks tests/kernels `gpu`, skips them without a GPU
# and fails them under --require-gpu (a skipif would turn a GPU-less GPU run into a pass).

_W = {}


def _weights(sname):
    from mono_glm53.config import REAL
    from mono_glm53.weights import make_weights

    if sname not in _W:
        _W.clear()
        torch.cuda.empty_cache()
        s = REAL.tp_shard(8, 0) if sname == "tp8" else REAL
        _W[sname] = (s, make_weights(s, device="cuda", seed=0))
    return _W[sname]


@pytest.mark.parametrize("ctx", (1000, 4096, 65536))
@pytest.mark.parametrize("width", (2, 4, 8))
@pytest.mark.parametrize("sname", ("tp8", "tp1"))
def test_fused_matches_reference(sname, width, ctx):
    from mono_glm53.kernels.harness import run_case
    from mono_glm53.kernels.numerics import failures

    s, w = _weights(sname)
    for rows in sorted({width, width - 1}):
        modes = ["fused", "fused+delay"]
        if width == 2 and rows == width:
            modes.append("staged")
        m = run_case(s, width, rows, ctx, True, modes=tuple(modes), device="cuda",
                     seed=ctx + rows, delay=20000, weights=w)
        assert not failures(m), (rows, m)


@pytest.mark.parametrize("sname", ("tp8",))
def test_no_indexer_layer(sname):
    from mono_glm53.kernels.harness import run_case
    from mono_glm53.kernels.numerics import failures

    s, w = _weights(sname)
    m = run_case(s, 2, 2, 4096, False, modes=("fused", "staged"), device="cuda", weights=w)
    assert not failures(m), m


@pytest.mark.parametrize("sname,width,rows,ctx", [("tp8", 2, 1, 65536), ("tp8", 8, 7, 4096), ("tp1", 2, 2, 4096)])
def test_launches_stay_inside_their_buffers(sname, width, rows, ctx):
    """Every buffer, weight, cache and the page table fenced by poisoned bands
    (harness.fenced_case), fused then staged: no band written, no poison read into a result."""
    from mono_glm53.kernels.harness import fenced_case
    from mono_glm53.kernels.numerics import failures

    s, w = _weights(sname)
    m, bad = fenced_case(s, width, rows, ctx, True, modes=("fused", "staged"), device="cuda",
                         seed=ctx + rows, weights=w)
    assert bad == [], bad
    assert not failures(m), m


def test_graph_replays():
    from mono_glm53.kernels.harness import graph_replay_check

    s, w = _weights("tp8")
    r = graph_replay_check(s, 2, 4096, replays=1000, weights=w)
    assert r["checks"] == 10 and r["glm53_layer.graph_replay_vs_eager.max_abs"] == 0.0, r


def test_table_built_inside_graph_capture():
    """A layer's pointer table first built during capture (new caches) replays correctly."""
    from mono_glm53.kernels.harness import captured_table_check

    s, w = _weights("tp8")
    r = captured_table_check(s, 2, 4096, weights=w)
    assert r["tables_built_in_capture"] == 1.0 and r["glm53_layer.captured_table_vs_eager.max_abs"] == 0.0, r


_FULL = {}


def _full_weights():
    from mono_glm53.config import REAL
    from mono_glm53.weights import make_weights

    if not _FULL:
        _W.clear()
        torch.cuda.empty_cache()
        _FULL["w"] = make_weights(REAL, device="cuda", seed=0)
    return _FULL["w"]


@pytest.mark.parametrize("world", (2, 4, 8))
def test_tp_ranks_all_reduce_in_kernel(world):
    """TP 2/4/8: the ranks side by side on the one H200 (SMs // world programs each, in one
    launch: layer.launch_side_by_side) all-reduce inside the fused launch; every rank equals decoder_layer_tp within
    NUMERICS and all ranks hold the same bits, with and without random stage delays."""
    from mono_glm53.config import REAL
    from mono_glm53.kernels.harness import run_tp_case
    from mono_glm53.kernels.numerics import failures

    for rows in (2, 1):
        m = run_tp_case(REAL, world, 2, rows, 4096, full_weights=_full_weights(), seed=world + rows,
                        delay=20000)
        assert not failures(m), (rows, m)
        assert m["glm53_layer.tp_ranks_equal.max_abs"] == 0.0, m


def test_injected_wait_fault_names_the_stage(monkeypatch):
    """MONO_GLM53_FAULT=stage12: program 0 never signals the hand-off into the MLA stage; every
    other program's guarded wait expires and the error word names that stage (report mode)."""
    from mono_common.errors import MonoWaitTimeout
    from mono_glm53.kernels.harness import build_case
    from mono_glm53.kernels.layer import GlmLayerKernel
    from mono_glm53.reference import LayerCaches

    monkeypatch.setenv("MONO_GUARD_MODE", "report")
    monkeypatch.setenv("MONO_GLM53_FAULT", "stage12")
    s, w = _weights("tp8")
    c = build_case(s, 2, 1000, True, "cuda", seed=3, weights=w)
    k = GlmLayerKernel(s, w, 2, max_seq_len=1000, deadline_s=0.5)
    assert k.stall == 12
    k.set_inputs(c.hidden, c.residual, c.inputs)
    k.launch(LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone()), "fused")
    with pytest.raises(MonoWaitTimeout, match=r"stage 12 \(mla\)"):
        k.guard.check()


def test_tp_injected_fault_on_one_rank_stops_every_rank(monkeypatch):
    """MONO_GLM53_FAULT=rank1:stage12 at TP 2 side by side: rank 1 times out at the MLA
    hand-off, raises the shared abort flag, and rank 0 stops too (no hang)."""
    from mono_glm53.config import REAL
    from mono_glm53.kernels.harness import run_tp_case

    monkeypatch.setenv("MONO_GLM53_FAULT", "rank1:stage12")
    r = run_tp_case(REAL, 2, 2, 2, 1000, full_weights=_full_weights(), expect_stop=True, deadline_s=0.5)
    assert r["stopped"] == 1.0, r
    assert "stage 12 (mla), rank 1" in r["message"] and "rank 0" in r["message"], r
