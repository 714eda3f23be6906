"""GPU (H200) tests of the fused GLM-5.3 layer kernel at real shapes on random weights.

Fused == reference within NUMERICS at the TP8-rank shard and the whole TP1 layer, widths
2/4/8 (full and with a pad row), contexts 1000 / 4096 / 65536; fused == staged bit for bit
(width 2); random per-program stage delays change no bit; 1000 replays of one captured graph
with changing inputs equal eager launches; pad rows leave every other cache row untouched.
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

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


def test_graph_replays():
    from mono_glm53.kernels.harness import graph_replay_check

    s, w = _weights("tp8")
    r = graph_replay_check(s, 2, 4096, replays=1000, weights=w)
    assert r["checks"] == 10 and r["glm53_layer.graph_replay_vs_eager.max_abs"] == 0.0, r
