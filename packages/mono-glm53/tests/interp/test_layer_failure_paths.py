"""Issue 21 under TRITON_INTERPRET=1 (tiny config, 3 programs, staged launches): the layer's
epochs and counters run through the points where their int32 values wrap, rows of very
different context lengths share a step, a 1 % error in the down projection's scales fails
the numerics, and the replayed-launch check catches a replay that differs."""

import pytest
import torch

from mono_glm53.config import tiny
from mono_glm53.kernels.harness import build_case, compare, kernel_out, reference_out, replay_check, run_case
from mono_glm53.kernels.layer import GlmLayerKernel, folded_handoffs
from mono_glm53.kernels.numerics import failures
from mono_glm53.kernels.stages import NSTAGES

NPROG = 3


def _wrap32(x):
    return (x + 2 ** 31) % 2 ** 32 - 2 ** 31


@pytest.mark.parametrize("start", [(2 ** 31 - 1) // NPROG, 2 ** 31 - 1], ids=["targets-wrap", "epoch-wraps"])
def test_staged_launches_run_through_the_wraps(start):
    """Launch `start` + 1 is where the targets epoch * nprog (or the epoch itself) pass 2**31:
    two launches from there give the outputs of a fresh kernel's launch bit for bit, and the
    counters and epochs hold the wrapped values the launch count says."""
    s = tiny(index_heads=8)
    c = build_case(s, 2, 10, True, seed=5)
    fresh = GlmLayerKernel(s, c.w, 2, max_seq_len=10, nprog=NPROG, device="cpu")
    want, _ = kernel_out(c, fresh, "staged")
    k = GlmLayerKernel(s, c.w, 2, max_seq_len=10, nprog=NPROG, device="cpu")
    k.set_sync(start)
    for n in (1, 2):
        got, _ = kernel_out(c, k, "staged")
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        assert k.epoch.tolist() == [_wrap32(start + n)] * NPROG
        # every hand-off counter 0..NSTAGES-2 (hand-off h's is h - 1) took one signal per
        # program per launch, but a folded hand-off's (sm_90's default Plan.TKF folds 6, and
        # the interpreter takes sm_90's options): it has none, its word stays as set
        folded = [h - 1 for h in folded_handoffs(k.plan)]
        assert folded == [5]
        assert k.cnt[: NSTAGES - 1].tolist() == [_wrap32((start + (0 if i in folded else n)) * NPROG)
                                                 for i in range(NSTAGES - 1)]
    k.guard.check()


def test_rows_of_very_different_context_lengths_in_one_step():
    """Top-k 16: contexts 1, 3 (a few tokens), 15, 16, 17 (below, at, above the top-k) and 40
    in one width-8 step with two pad rows."""
    s = tiny(index_heads=8)
    ctxs = (1, 3, 15, 16, 17, 40)
    m = run_case(s, 8, len(ctxs), max(ctxs), True, modes=("staged",), nprog=NPROG, seed=11, ctxs=ctxs)
    assert not failures(m), m
    assert m["glm53_layer.mla_cache.max_abs_ulps"] <= 1.0, m
    assert m["glm53_layer.topk.overlap_min"] == 1.0, m


@pytest.mark.parametrize("name, metric", [
    ("mlp.experts.w2_weight_scale_inv", "moe_down_given_inter.rel_l2_max"),
    ("mlp.shared_experts.down_proj.weight_scale_inv", "moe_down_given_inter.rel_l2_max"),
    ("mlp.experts.w13_weight_scale_inv", "moe_gateup_given_h2.rel_l2_max"),
    ("mlp.shared_experts.gate_up_proj.weight_scale_inv", "moe_gateup_given_h2.rel_l2_max"),
])
def test_one_percent_expert_scale_error_fails(name, metric):
    """The kernel reads one expert weight's scales 1 % too large, the reference the right ones:
    every cosine stays in bounds (>= 0.9996 for the MoE given the kernel's h2), the MoE stage
    that reads the weight, checked given the kernel's own input to it, does not (down: 0.0097
    routed, 0.0061 shared; gate_up: 0.0106 routed, 0.0102 shared; bounds 0.002), and the
    stages before it stay exact."""
    s = tiny(index_heads=8)
    c = build_case(s, 2, 40, True, seed=42)
    r_out, r_caches = reference_out(c)
    wrong = dict(c.w)
    wrong[name] = c.w[name] * 1.01
    k = GlmLayerKernel(s, wrong, 2, max_seq_len=40, nprog=NPROG, device="cpu")
    k_out, k_caches = kernel_out(c, k, "staged")
    m = compare(c, r_out, r_caches, k_out, k_caches, k)
    bad = failures(m)
    assert "glm53_layer." + metric in bad, m
    assert not any(key.endswith("cosine_min") for key in bad), bad
    assert m["glm53_layer.moe_inter_given_gateup.codes_equal_min"] == 1.0, m
    if "down" in name:
        assert "glm53_layer.moe_gateup_given_h2.rel_l2_max" not in bad, bad


def test_moe_checks_read_the_f16_form_and_its_scale_error_still_fails():
    """Where the MoE converts its weights to f16 (Plan.MF16: a slot's K in two blocks, as a TP8
    rank's; its quantised inputs are f16 bits in bf16 buffers), the MoE stage checks read those
    inputs as f16: the right kernel passes every stage exactly as the bf16 form does, and a
    1 % error in the down projection's scales still fails down's check alone."""
    s = tiny(index_heads=8, moe_inter=64)
    c = build_case(s, 2, 40, True, seed=42)
    r_out, r_caches = reference_out(c)
    metrics = {}
    for f16 in (True, False):
        k = GlmLayerKernel(s, c.w, 2, max_seq_len=40, nprog=NPROG, device="cpu", moe_f16=f16)
        assert k.plan.MF16 == f16
        k_out, k_caches = kernel_out(c, k, "staged")
        metrics[f16] = m = compare(c, r_out, r_caches, k_out, k_caches, k)
        assert not failures(m), (f16, failures(m))
        assert m["glm53_layer.moe_inter_given_gateup.codes_equal_min"] == 1.0, m
    moe = [key for key in metrics[True] if ".moe_" in key]
    assert moe and all(metrics[True][key] == metrics[False][key] for key in moe), moe
    wrong = dict(c.w)
    wrong["mlp.experts.w2_weight_scale_inv"] = c.w["mlp.experts.w2_weight_scale_inv"] * 1.01
    k = GlmLayerKernel(s, wrong, 2, max_seq_len=40, nprog=NPROG, device="cpu")
    k_out, k_caches = kernel_out(c, k, "staged")
    bad = failures(compare(c, r_out, r_caches, k_out, k_caches, k))
    assert "glm53_layer.moe_down_given_inter.rel_l2_max" in bad and not any("gateup" in b for b in bad), bad


def test_replay_check_compares_with_the_staged_launch():
    s = tiny(index_heads=8)
    c = build_case(s, 2, 10, True, seed=3)
    k = GlmLayerKernel(s, c.w, 2, max_seq_len=10, nprog=NPROG, device="cpu")
    k.set_inputs(c.hidden, c.residual, c.inputs)
    caches = type(c.caches)(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())

    def replay():
        k.launch(caches, "staged")

    r = replay_check(k, caches, replay, lambda i: None, 1, 1, modes=("staged",))
    assert (r["checks"], r["glm53_layer.graph_replay_vs_staged.max_abs"]) == (1, 0.0), r

    def wrong_replay():
        k.launch(caches, "staged")
        k.res_out[0, 0] += 1.0  # a replay that left one value different

    r = replay_check(k, caches, wrong_replay, lambda i: None, 1, 1, modes=("staged",))
    assert r["glm53_layer.graph_replay_vs_staged.max_abs"] >= 1.0, r
    assert failures(r), r
