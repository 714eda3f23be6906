"""Which rows the stream bound (glm53_layer.hidden.cosine_min) covers when routing flips.

A row whose routed experts differ from the reference's (a near-tie that a bf16 flip of h2
decides) is checked by the metrics conditioned on the kernel's own h2 instead of the stream
cosine. On the H200 the tiny demo layer's one real row flipped (hidden cosine 0.73, h2 cosine
0.999993, tie gap 0): the stream bound must then cover no row rather than the flipped one, as
long as the conditioned checks run; where they cannot (no kernel object, R > 1), every row is
compared as before.
"""

import types

import pytest
import torch

from mono_glm53.config import tiny
from mono_glm53.kernels import harness


@pytest.fixture(scope="module")
def case():
    c = harness.build_case(tiny(), 2, 24, True, "cpu", seed=5)
    r_out, r_caches = harness.reference_out(c)
    # a "kernel" whose first row is wrong and second right
    bad = r_out.hidden.clone()
    bad[0] = -bad[0]
    return c, r_out, r_caches, (bad, r_out.residual, r_out.topk)


def _compare(monkeypatch, case, same_rows, world):
    c, r_out, r_caches, k_out = case
    conditioned_calls = []
    monkeypatch.setattr(harness, "_rows_same_routing", lambda c_, r_, k_: list(same_rows))
    monkeypatch.setattr(harness, "conditioned",
                        lambda *a: conditioned_calls.append(1) or {"glm53_layer.h2.cosine_min": 1.0})
    k = types.SimpleNamespace(world=world)
    m = harness.compare(c, r_out, r_caches, k_out, r_caches, k)
    return m, conditioned_calls


def test_flipped_row_is_left_to_the_conditioned_checks(monkeypatch, case):
    m, calls = _compare(monkeypatch, case, [1], world=1)
    assert m["glm53_layer.hidden.cosine_min"] > 0.9999  # row 1 only
    assert m["glm53_layer.routing.flipped_rows"] == 1.0
    assert calls == [1]


def test_every_row_flipped_has_no_stream_bound_but_conditioned_checks(monkeypatch, case):
    m, calls = _compare(monkeypatch, case, [], world=1)
    assert "glm53_layer.hidden.cosine_min" not in m
    assert m["glm53_layer.routing.flipped_rows"] == 2.0
    assert calls == [1] and "glm53_layer.h2.cosine_min" in m


def test_without_conditioned_checks_every_row_is_compared(monkeypatch, case):
    m, calls = _compare(monkeypatch, case, [], world=2)
    assert m["glm53_layer.hidden.cosine_min"] < 0.0  # row 0 is negated
    assert calls == []
    c, r_out, r_caches, k_out = case
    m = harness.compare(c, r_out, r_caches, k_out, r_caches, None)
    assert m["glm53_layer.hidden.cosine_min"] < 0.0
    assert torch.equal(k_out[1], r_out.residual)
