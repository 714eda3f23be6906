"""GPU (H200) tests of the fused GLM-5.3 layer kernel at real shapes on random weights.

Fused == reference within NUMERICS at the TP8-rank shard and the whole TP1 layer, widths
2/4/8 (full and with a pad row), contexts 1000 / 4096 / 65536, and steps whose rows have very
different contexts (1, a few tokens, just below / at / above the top-k, beyond 65536); fused
== staged bit for bit (width 2); the same at the TP8 shard with the GLM-5.x checkpoints'
interleaved indexer rope (the fused indexer path a served checkpoint launches); random per-program stage delays change no bit; 1000 replays
of one captured graph with changing inputs equal eager fused AND staged launches; a pointer
table first built inside a graph capture replays correctly; pad rows leave every other cache
row untouched; with every buffer fenced by poisoned bands no launch reads or writes past one;
launches started just below the int32 wraps of the targets and of the epoch run through them;
a 1 % error in the down projection's scales fails the numerics; the producer-quantised GEMV
inputs (Plan.XQP) give the default's bits; a stopped launch raises
before its outputs are returned and the kernel refuses until recovered; at TP 2 a fault on
rank 1 stops rank 0 on the abort flag (its error word says so, and when).
"""

import pytest
import torch

# No skipif here: the mono pytest plugin marks tests/kernels `gpu`, skips them without a GPU
# and fails them under --require-gpu (a skipif would turn a GPU-less GPU run into a pass).

_W = {}


def _report(label, m):
    """Print the stream's relative errors and cosines (run with -s): the GPU measurements the
    NUMERICS rel_l2 bounds still need (kernels/numerics.py)."""
    keys = ("hidden.rel_l2_max", "residual.rel_l2_max", "moe_given_h2.rel_l2_max", "hidden.cosine_min",
            "moe_given_h2.cosine_min", "moe_gateup_given_h2.rel_l2_max", "moe_inter_given_gateup.codes_equal_min",
            "moe_inter_given_gateup.scales_equal_min", "moe_down_given_inter.rel_l2_max")
    vals = ", ".join(f"{k} {m['glm53_layer.' + k]:.5g}" for k in keys if "glm53_layer." + k in m)
    print(f"\nNUMERICS {label}: {vals}")


def _weights(sname):
    from mono_glm53.config import named_shape
    from mono_glm53.weights import make_weights

    if sname not in _W:
        _W.clear()
        torch.cuda.empty_cache()
        s = named_shape(sname)
        _W[sname] = (s, make_weights(s, device="cuda", seed=0))
    return _W[sname]


@pytest.mark.parametrize("ctx", (1000, 4096, 65536))
@pytest.mark.parametrize("width", (2, 4, 8))
@pytest.mark.parametrize("sname", ("tp8", "tp1"))
def test_fused_matches_reference(sname, width, ctx):
    _check_reference(sname, width, ctx)


def _check_reference(sname, width, ctx, knobs=None):
    """Fused (and with stage delays; staged too at width 2, all rows) == the reference within
    NUMERICS at every row count of the width and one fewer (a pad row); `knobs`: the kernel's
    measurement knobs."""
    from mono_glm53.kernels.harness import run_case
    from mono_glm53.kernels.numerics import failures

    s, w = _weights(sname)
    for rows in sorted({width, width - 1}):
        modes = ["fused", "fused+delay"]
        if width == 2 and rows == width:
            modes.append("staged")
        m = run_case(s, width, rows, ctx, True, modes=tuple(modes), device="cuda",
                     seed=ctx + rows, delay=20000, weights=w, knobs=knobs)
        _report(f"{sname} w{width} rows {rows} ctx {ctx}{' ' + str(knobs) if knobs else ''}", m)
        assert not failures(m), (rows, m)


# The GLM-5.x checkpoints' indexer (interleaved rope: the fused indexer path SGLang serves them
# with, no Hadamard, one bf16 wk / weights_proj GEMM) at the TP8 shard: what a served
# checkpoint launches, beside the HF default's path above
@pytest.mark.parametrize("width,ctx", ((2, 1000), (2, 4096), (8, 4096), (2, 65536), (8, 65536)))
def test_checkpoint_indexer_path_matches_reference(width, ctx):
    s, _ = _weights("tp8i")
    assert s.indexer_rope_interleave and not s.indexer_hadamard
    _check_reference("tp8i", width, ctx)


# The knob builds checked against the reference (suite groups `hold0` and `hold1`): test name ->
# its cases (shape, width, ctx, knobs). bench/gpu_suite.sh's warm step compiles every one of
# them (fused, and staged at width 2 as `_check_reference` runs it) before the groups start:
# compiled one after another inside the tests, 5 of the 18 passed in a 10-minute call (H100,
# session 42).
HOLD_CASES = {
    # mla_hold: the MLA chunks' keys held for both products, a build whose scores may round
    # otherwise than the default's (so not in the knob test's same-bits sets)
    "mla_hold": [("tp8i", 2, 4096, {"mla_hold": 16}), ("tp8i", 8, 4096, {"mla_hold": 32}),
                 ("tp8i", 2, 65536, {"mla_hold": 32})],
    # postnorm_loop: the post-attention norm's row walked in chunks by its program, its squares
    # summed in an order of its own; at the whole layer too (its 7 o_proj slots a chunk in
    # flight together, 112 values a thread)
    "postnorm_loop": [(sn, w, 4096, {"postnorm_loop": True}) for sn, w in (("tp8i", 2), ("tp8i", 8), ("tp1", 2))],
    # postnorm_split: the post-attention norm in two passes over 128-column chunks on every
    # program, a hand-off between (its squares summed in chunk order)
    "postnorm_split": [(sn, w, 4096, {"postnorm_split": True}) for sn, w in (("tp8i", 2), ("tp8i", 8), ("tp1", 2))],
    # mla_chunk: the MLA stage's chunks of 16 or 32 tokens (the sums over other chunks), with
    # mlacomb_vec's combine
    "mla_chunk": [("tp8i", w, 4096, {"mla_chunk": ct, "mlacomb_vec": True}) for w, ct in ((2, 32), (8, 32), (2, 16))],
    # gateup_spans: gate_up as 128-column stream-K spans on f16 swap-AB MMAs (exact products
    # summed in another order than the split-K tiles')
    "gateup_spans": [("tp8i", 2, 4096, {"gateup_spans": True})],
    # qb_joint, a TP8 rank's sm_90 default (q_b's column tiles then wq_b's as one stream-K
    # GEMV), off: q_b and wq_b as two span loops, each tile's partials in more slots (other sums
    # of the same products; the default's are the tests above)
    "qb_joint_off": [("tp8i", w, 4096, {"qb_joint": False}) for w in (2, 8)],
    # mlacomb_vec: the MLA combine's chunks as one load and block reductions (sums in their own
    # order), at 1000 tokens too (fewer selected tokens than the top-k: chunks with nothing valid)
    "mlacomb_vec": [("tp8i", w, ctx, {"mlacomb_vec": True}) for w, ctx in ((2, 4096), (8, 4096), (2, 1000))],
}


# the suite groups `hold0` and `hold1` (bench/gpu_suite.sh reads them): every name in one, with
# about equal work each
HOLD_GROUPS = (("mla_hold", "mla_chunk", "gateup_spans", "qb_joint_off"),
               ("postnorm_loop", "postnorm_split", "mlacomb_vec"))
assert sorted(n for g in HOLD_GROUPS for n in g) == sorted(HOLD_CASES), "a HOLD_CASES name in no hold group"
_HOLD = [(name, case) for name, cases in HOLD_CASES.items() for case in cases]


# each: fused == fused with delays == staged, and the reference within NUMERICS; an id is
# "<HOLD_CASES name>__<shape>-<width>-<ctx>-<knobs>" (`-k "mla_hold__"` picks one name's cases)
@pytest.mark.parametrize("case", [c for _, c in _HOLD],
                         ids=[f"{n}__{sn}-{w}-{ctx}" + "".join(f"-{k}={v}" for k, v in kn.items())
                              for n, (sn, w, ctx, kn) in _HOLD])
def test_knob_build_matches_reference(case):
    _check_reference(*case)


# Rows of very different contexts in ONE step: 1 token, a few, just below / at / above the
# top-k (2048), and beyond 65536; with and without pad rows; the TP8 shard and the whole layer.
MIXED = [
    ("tp8", 8, (1, 5, 2047, 2048, 2049, 65537, 300, 70000)),
    ("tp8", 4, (70000, 1, 2049)),
    ("tp8", 2, (1, 66000)),
    ("tp1", 4, (3, 2048, 2049, 65600)),
]


@pytest.mark.parametrize("sname,width,ctxs", MIXED)
def test_fused_matches_reference_with_mixed_context_lengths(sname, width, ctxs):
    from mono_glm53.kernels.harness import run_case
    from mono_glm53.kernels.numerics import failures

    s, w = _weights(sname)
    modes = ("fused", "staged") if width == 2 else ("fused",)
    m = run_case(s, width, len(ctxs), max(ctxs), True, modes=modes, device="cuda", seed=sum(ctxs) % 1000,
                 weights=w, ctxs=ctxs)
    _report(f"{sname} w{width} ctxs {ctxs}", m)
    assert not failures(m), (ctxs, m)


@pytest.mark.parametrize("where", ["targets", "epoch"])
def test_fused_launches_run_through_the_wraps(where, monkeypatch):
    """Epochs and counters set as after `start` launches, just below where the int32 targets
    epoch * nprog ("targets", after 2**31 / 264 = 8.1 M launches) or the epoch itself
    ("epoch") wrap; five launches from there (fused, one staged among them) give a fresh
    kernel's outputs bit for bit, and the counters hold the wrapped values."""
    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel, folded_handoffs
    from mono_glm53.kernels.stages import NSTAGES

    monkeypatch.setenv("MONO_GUARD_MODE", "report")  # a stop raises at the launch
    s, w = _weights("tp8")
    c = build_case(s, 2, 1000, True, "cuda", seed=9, weights=w)
    want, _ = kernel_out(c, GlmLayerKernel(s, w, 2, max_seq_len=1000), "fused")
    k = GlmLayerKernel(s, w, 2, max_seq_len=1000)
    start = (2 ** 31 - 1) // k.nprog - 2 if where == "targets" else 2 ** 31 - 3
    k.set_sync(start)

    def wrap(v):
        return (v + 2 ** 31) % 2 ** 32 - 2 ** 31

    for n in range(1, 6):
        got, _ = kernel_out(c, k, "staged" if n == 3 else "fused")
        assert all(torch.equal(a, b) for a, b in zip(got, want)), n
        assert k.epoch.eq(wrap(start + n)).all(), n
        # hand-off h's counter is h - 1; a folded hand-off (sm_90's default Plan.TKF folds 6)
        # has none: its word stays where set_sync put it
        folded = [h - 1 for h in folded_handoffs(k.plan)]
        ran = [i for i in range(NSTAGES - 1) if i not in folded]
        assert k.cnt[ran].eq(wrap((start + n) * k.nprog)).all(), n
        assert k.cnt[folded].eq(wrap(start * k.nprog)).all(), n


def test_one_percent_down_scale_error_fails_at_real_shape():
    """The kernel reads the routed experts' down-projection scales 1 % too large: NUMERICS must
    fail (the down projection given the kernel's own SiLU output off by ~1 % in norm), whatever
    the cosines say, and the gate_up before it must not."""
    from mono_glm53.kernels.harness import build_case, compare, kernel_out, reference_out
    from mono_glm53.kernels.layer import GlmLayerKernel
    from mono_glm53.kernels.numerics import failures

    s, w = _weights("tp8")
    c = build_case(s, 2, 4096, True, "cuda", seed=17, weights=w)
    r_out, r_caches = reference_out(c)
    key = "mlp.experts.w2_weight_scale_inv"
    wrong = dict(w, **{key: w[key] * 1.01})
    k = GlmLayerKernel(s, wrong, 2, max_seq_len=4096)
    k_out, k_caches = kernel_out(c, k, "fused")
    m = compare(c, r_out, r_caches, k_out, k_caches, k)
    print("\n" + "\n".join(f"  {n} = {v:.6g}" for n, v in sorted(m.items()) if "rel_l2" in n or "cosine" in n))
    bad = failures(m)
    assert "glm53_layer.moe_down_given_inter.rel_l2_max" in bad, m
    assert "glm53_layer.moe_gateup_given_h2.rel_l2_max" not in bad, m


def test_producer_quantised_gemv_inputs_give_the_same_bits_at_real_shape():
    """Plan.XQP (GlmLayerKernel xq_producer, sm_90's default): the fused launch whose
    q_a/kv_a and q_b/wq_b GEMVs read their producers' quantised inputs writes the bits of the
    launch that quantises x in every K block (TP8 shard, width 2, ctx 4096)."""
    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s, w = _weights("tp8")
    c = build_case(s, 2, 4096, True, "cuda", seed=23, weights=w)
    outs = []
    for xqp in (False, True):
        k = GlmLayerKernel(s, w, 2, max_seq_len=4096, xq_producer=xqp)
        out, caches = kernel_out(c, k, "fused")
        k.guard.check()
        outs.append((out, caches))
    (a, ca), (b, cb) = outs
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k)


def test_co_residency_check_matches_the_h200():
    """The host check a plain launch runs (`layer.check_co_resident`) on the real compiled
    kernel: the default grid (2 programs an SM) fits, one program more does not."""
    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel, check_co_resident

    s, w = _weights("tp8")
    c = build_case(s, 2, 1000, True, "cuda", seed=5, weights=w)
    k = GlmLayerKernel(s, w, 2, max_seq_len=1000)
    kernel_out(c, k, "fused")
    compiled = k.compiled["fused"]
    check_co_resident(compiled, k.nprog, k.device)
    with pytest.raises(RuntimeError, match=f"{k.nprog + 1} programs cannot be co-resident"):
        check_co_resident(compiled, k.nprog + 1, k.device)


@pytest.mark.parametrize("sname", ("tp8",))
def test_no_indexer_layer(sname):
    from mono_glm53.kernels.harness import run_case
    from mono_glm53.kernels.numerics import failures

    s, w = _weights(sname)
    m = run_case(s, 2, 2, 4096, False, modes=("fused", "staged"), device="cuda", weights=w)
    _report(f"{sname} no indexer w2 rows 2 ctx 4096", m)
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
    _report(f"{sname} fenced w{width} rows {rows} ctx {ctx}", m)
    assert bad == [], bad
    assert not failures(m), m


def test_graph_replays():
    from mono_glm53.kernels.harness import graph_replay_check

    s, w = _weights("tp8")
    r = graph_replay_check(s, 2, 4096, replays=1000, weights=w)
    assert r["checks"] == 10, r
    assert r["glm53_layer.graph_replay_vs_eager.max_abs"] == 0.0, r
    assert r["glm53_layer.graph_replay_vs_staged.max_abs"] == 0.0, r


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
        _report(f"TP{world} side by side w2 rows {rows} ctx 4096", m)
        assert not failures(m), (rows, m)
        assert m["glm53_layer.tp_ranks_equal.max_abs"] == 0.0, m


def test_tp8_ranks_all_reduce_in_kernel_with_down_items():
    """down_items at world 8: a tile's last item's program (not the tile's owner) pushes it to
    the all-reduce; every rank equals decoder_layer_tp within NUMERICS and all ranks hold the
    same bits, with random stage delays (64-column tiles: the all-reduce's blocks too)."""
    from mono_glm53.config import REAL
    from mono_glm53.kernels.harness import run_tp_case
    from mono_glm53.kernels.numerics import failures

    for rows in (2, 1):
        m = run_tp_case(REAL, 8, 2, rows, 4096, full_weights=_full_weights(), seed=8 + rows, delay=20000,
                        knobs={"down_items": 64})
        _report(f"TP8 side by side down_items 64 w2 rows {rows} ctx 4096", m)
        assert not failures(m), (rows, m)
        assert m["glm53_layer.tp_ranks_equal.max_abs"] == 0.0, m


@pytest.mark.parametrize("stage,knobs", [(12, {}), (12, {"sync_call": True}), (8, {"sync_call": True, "radix_loop": True})],
                         ids=["inline", "sync_call", "sync_call-radix_loop"])
def test_injected_wait_fault_names_the_stage_and_the_kernel_recovers(monkeypatch, stage, knobs):
    """MONO_GLM53_FAULT=stage12: program 0 never signals the hand-off into the MLA stage; every
    other program's guarded wait expires. Report mode: the launch raises, naming the stage,
    before its outputs are returned; the next launch is refused; after recover() (fault
    switch off) the kernel meets NUMERICS again. The same with the hand-offs as calls of one
    copy of their code (sync_call: the stage a runtime value), and at a radix pass of their
    loop (radix_loop, stage 8)."""
    from mono_common.errors import MonoDeviceError, MonoWaitTimeout
    from mono_glm53.kernels.harness import build_case, compare, kernel_out, reference_out
    from mono_glm53.kernels.layer import GlmLayerKernel
    from mono_glm53.kernels.numerics import failures
    from mono_glm53.reference import LayerCaches

    monkeypatch.setenv("MONO_GUARD_MODE", "report")
    from mono_glm53.kernels.stages import STAGE_NAMES

    monkeypatch.setenv("MONO_GLM53_FAULT", f"stage{stage}")
    s, w = _weights("tp8")
    c = build_case(s, 2, 1000, True, "cuda", seed=3, weights=w)
    k = GlmLayerKernel(s, w, 2, max_seq_len=1000, deadline_s=0.5, **knobs)
    assert k.stall == stage
    k.set_inputs(c.hidden, c.residual, c.inputs)
    caches = LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
    with pytest.raises(MonoWaitTimeout, match=rf"stage {stage} \({STAGE_NAMES[stage]}\)"):
        k.launch(caches, "fused")
    with pytest.raises(MonoDeviceError, match="earlier launch stopped"):
        k.launch(caches, "fused")
    k.stall = -1  # the fault switch off
    k.recover()
    r_out, r_caches = reference_out(c)
    k_out, k_caches = kernel_out(c, k, "fused")
    m = compare(c, r_out, r_caches, k_out, k_caches, k)
    assert not failures(m), m


def test_tp_injected_fault_on_one_rank_stops_the_other_on_the_abort_flag(monkeypatch):
    """MONO_GLM53_FAULT=rank1:stage12 at TP 2 side by side: rank 1 (deadline 0.5 s) times out
    at the MLA hand-off and raises the shared abort flag; rank 0 (deadline 10 s; it passed
    stage 12 and waits in the all-reduce of stage 16) must stop ON THAT FLAG: its error word
    says "aborted by rank 1", its wait ran less than its deadline, and its stop is stamped
    after rank 1's timeout, by how long is printed. With one deadline for both ranks (session
    11) rank 0's own deadline expired ~0.1 ms after rank 1's, a race the flag could lose."""
    from mono_common import errors
    from mono_glm53.config import REAL
    from mono_glm53.kernels.harness import run_tp_case

    monkeypatch.setenv("MONO_GLM53_FAULT", "rank1:stage12")
    deadline_s, rank0_s = 0.5, 10.0
    r = run_tp_case(REAL, 2, 2, 2, 1000, full_weights=_full_weights(), expect_stop=True, deadline_s=deadline_s,
                    rank_deadline_s={0: rank0_s})
    assert r["stopped"] == 1.0, r
    w0, w1 = r["words"]
    assert w1 is not None and (w1.code, w1.stage, w1.rank) == (errors.CODE_TIMEOUT, 12, 1), r
    assert w0 is not None, f"rank 0 wrote no error word: {r}"
    assert (w0.code, w0.rank, w0.origin) == (errors.CODE_ABORTED, 0, 1), f"rank 0 did not stop on rank 1's flag: {r}"
    assert w0.waited < rank0_s * 1e9, r  # %globaltimer ns: stopped before its own deadline
    lag_us = (w0.stamp - w1.stamp) / 1e3
    print(f"\nrank 0 stopped on rank 1's abort flag {lag_us:.1f} us after rank 1's timeout "
          f"(rank 0 in stage {w0.stage}, after waiting {w0.waited / 1e6:.3f} ms)")
    assert 0 < lag_us < 0.5 * deadline_s * 1e6, r
