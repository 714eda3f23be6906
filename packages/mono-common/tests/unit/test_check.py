"""The check-mode comparator: metrics, bound names and violations."""

import math

import pytest
import torch

from mono_common.check import BoundName, compare, metrics


def test_bound_names_parse_like_sglang():
    from sglang.kernels.plugin_kernels.amd.spec import Numerics, NumericsKind

    for good in ("layer.stream.cosine", "layer.mla_kv.max_abs", "a.b.c.rel"):
        BoundName.parse(good)
        Numerics(kind=NumericsKind.TOLERANCE, bounds={good: 1.0})
    for bad in ("layer.cosine", "layer.stream.l2", "..cosine"):
        with pytest.raises(ValueError):
            BoundName.parse(bad)
    # rel_l2 is ours: SGLang's Numerics refuses it, so check mode keeps such bounds beside it
    assert BoundName.parse("layer.stream.rel_l2").metric == "rel_l2"
    with pytest.raises(ValueError):
        Numerics(kind=NumericsKind.TOLERANCE, bounds={"layer.stream.rel_l2": 0.01})


def test_metrics_of_random_tensors():
    g = torch.Generator().manual_seed(0)
    e = torch.randn(64, 128, generator=g)
    noise = 1e-3 * torch.randn(64, 128, generator=g)
    got = metrics(e + noise, e)
    assert got["cosine"] > 0.9999
    assert math.isclose(got["max_abs"], float(noise.abs().max()), rel_tol=1e-4)
    assert math.isclose(got["rel"], float(noise.abs().max() / e.abs().max()), rel_tol=1e-4)
    assert math.isclose(got["rel_l2"], float(noise.norm() / e.norm()), rel_tol=1e-6)


def test_a_one_percent_scale_error_passes_the_cosine_and_fails_rel_l2():
    g = torch.Generator().manual_seed(1)
    e = torch.randn(4, 6144, generator=g).bfloat16()
    wrong = (e.float() * 1.01).bfloat16()
    bounds = {"layer.stream.cosine": 0.99999, "layer.stream.rel_l2": 0.005}
    got = metrics(wrong, e)
    assert got["cosine"] > 0.99999  # a uniform scale leaves the direction (bf16 rounding aside)
    assert 0.009 < got["rel_l2"] < 0.011
    assert [v.bound for v in compare("layer", "stream", wrong, e, bounds)] == ["layer.stream.rel_l2"]
    assert compare("layer", "stream", e.clone(), e, bounds) == []


def test_compare_reports_every_violation_and_nan_fails():
    e = torch.randn(8, 16)
    bounds = {"layer.stream.cosine": 0.999, "layer.stream.max_abs": 1e-3, "layer.other.rel": 0.1}
    assert compare("layer", "stream", e.clone(), e, bounds) == []
    bad = compare("layer", "stream", -e, e, bounds)
    assert {v.bound for v in bad} == {"layer.stream.cosine", "layer.stream.max_abs"}
    nan = e.clone()
    nan[0, 0] = float("nan")
    assert len(compare("layer", "stream", nan, e, bounds)) == 2
    with pytest.raises(KeyError, match="no bound named layer.kv"):
        compare("layer", "kv", e, e, bounds)
