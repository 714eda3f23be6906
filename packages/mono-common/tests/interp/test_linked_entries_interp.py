"""The linked entries (stages.linked_entries) under the interpreter: sparse MLA staged and linked
against its reference, the six top-k stages in one launch over two score sets (the tkh slices
they zero for each other) against the index-order reference, and the hand-off counter. A
linked launch runs on ONE program here: the interpreter runs programs one after another, so a
hand-off between two of them would never complete."""

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402,F401  (the interpreter finds the language in a runner's globals)

from mono_common.ref.mla import sparse_mla, topk_to_slots  # noqa: E402
from mono_common.ref.topk import topk_index_order  # noqa: E402
from mono_common.stages import linked_host as LH  # noqa: E402
from mono_common.stages.handoff import BAR_WORDS, FLAG_WORD, LINE_WORDS, SPLIT_WORDS, grid_handoff_flag  # noqa: E402
from mono_common.testing.stage_inputs import mla_inputs  # noqa: E402


def mla_rel_err(plan, got, q, kv, topk, req, rtt, scale):
    ref = sparse_mla(q.double(), kv.double(), topk_to_slots(topk, req, rtt), plan.KVL, scale)
    return ((got.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("hold", [False, True], ids=["chunked", "hold"])
@pytest.mark.parametrize("linked", [False, True], ids=["staged", "linked"])
def test_sparse_mla_matches_the_reference(linked, hold):
    # hold: each chunk's keys loaded once for both products (stages.mla HOLD)
    plan = LH.MlaPlan(W=3, NH=20, KVL=128, RD=64, TOPK=64, CT=16, HG=16, HOLD=hold)
    g = torch.Generator().manual_seed(7)
    q, kv, topk, req, rtt = mla_inputs(plan, 96, 16, g, short_row=1)
    got = LH.run_mla(plan, q, kv, topk, req, rtt, 0.06, nprog=1 if linked else 3, linked=linked)
    # bf16 P and bf16 output: ~2^-9 relative each
    assert mla_rel_err(plan, got, q, kv, topk, req, rtt, 0.06) < 4e-3


def test_held_keys_beyond_the_register_budget_are_refused():
    """HOLD keeps a chunk's [CT, KVL] keys in registers: a plan past CT * KVL = 16384 is refused
    with the largest chunk that fits, before anything launches."""
    plan = LH.MlaPlan(W=1, NH=8, KVL=512, RD=64, TOPK=2048, CT=64, HOLD=True)
    q = torch.zeros(1, 8, 576)
    kv = torch.zeros(1, 4096, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"CT \* KVL must be at most 16384 \(CT <= 32\)"):
        LH.launch_mla(plan, q, kv, torch.zeros(1, 2048, dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                      torch.zeros(1, 4096, dtype=torch.int32), 0.1, LH.mla_buffers(plan, "cpu"), 1, LH.MLA_PARTIAL)


def test_linked_topk_over_two_sets_matches_the_reference():
    k, rows, n = 128, 3, 700
    g = torch.Generator().manual_seed(11)
    scores = torch.randn(2, rows, n, generator=g)
    scores[1, 0] = (scores[1, 0] * 4).round() / 4  # ties at the threshold
    seqlen = torch.tensor([n, 300, 129], dtype=torch.int32)
    got = LH.run_topk_linked(scores[0], seqlen, k, nprog=1)
    assert got.long().tolist() == topk_index_order(scores[0], seqlen, k).tolist()
    # two sets a launch, launched twice on the same buffers (a graph's replays): set 1 runs on
    # the tkh slice set 0 zeroed and zeroes slice 0 back for the next launch
    bufs = LH.topk_buffers(rows, n, k, "cpu")
    for _ in range(2):
        LH.launch_topk_linked(scores, seqlen, bufs, nprog=1)
        assert bufs.topk.long().tolist() == topk_index_order(scores[1], seqlen, k).tolist()
        assert not bufs.tkh[0].any()


def test_handoffs_count_the_grid():
    bar = torch.zeros(2, dtype=torch.int32)
    LH.launch_handoffs(bar, 5, nprog=1)
    assert bar.tolist() == [5, 0]


def test_the_spin_hand_off_is_refused_where_its_assembly_cannot_run():
    """`handoff.grid_handoff_spin` is sm_90 inline assembly (its GPU test: test_spin_handoff_gpu):
    refused on the CPU with the reason, and with the flag or split forms in one launch."""
    bar = torch.zeros(BAR_WORDS, dtype=torch.int32)
    with pytest.raises(ValueError, match="spin hand-off's poll loop is sm_90 inline assembly: cpu cannot run it"):
        LH.launch_handoffs(bar, 1, nprog=1, spin=True)
    with pytest.raises(ValueError, match="not with the flag or split forms"):
        LH.launch_handoffs(bar, 1, nprog=1, spin=True, flag=True)
    with pytest.raises(ValueError, match="not with the flag or split forms"):
        LH.launch_handoffs(bar, 1, nprog=1, spin=True, split=2)
    assert not bar.any()


# The flag hand-off (stages.handoff.grid_handoff_flag) beside the counter one. Several programs
# at once: the interpreter runs programs one after another, so these tests run each program of
# the grid in its own thread (the hand-off entry reads no program id, only the grid size), and
# a hand-off that never completes fails the join instead of hanging the run.
def _threaded_handoffs(bar, n, nprog, flag, split=0):
    import inspect
    import threading

    from triton.runtime.interpreter import GridExecutor

    from mono_common.stages.linked_entries import handoff_entry

    ex = GridExecutor(handoff_entry.rewrite(), handoff_entry.arg_names, (nprog,), [])
    real = ex.fn
    threads, errors = [], []

    def one(**args):
        try:
            real(**args)
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    def program(**args):
        t = threading.Thread(target=one, kwargs=args, daemon=True)
        threads.append(t)
        t.start()
        if len(threads) == nprog:  # the last program launched: wait for the grid
            for t in threads:
                t.join(timeout=120)

    program.__signature__ = inspect.signature(real)
    ex.fn = program
    bar.zero_()
    ex(bar, n, FLAG=flag, AMD=False, SPLIT=split, LD=False)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a hand-off never completed"
    return bar


def test_flag_handoffs_count_the_grid_and_publish_the_last_target():
    bar = torch.zeros(BAR_WORDS, dtype=torch.int32)
    LH.launch_handoffs(bar, 5, nprog=1, flag=True)
    f = FLAG_WORD.value
    assert bar[0] == 5 and bar[f] == 5 and bar[1] == 0 and bar[f + 1] == 0 and int(bar.abs().sum()) == 10
    with pytest.raises(ValueError, match="64 int32 words"):
        LH.launch_handoffs(torch.zeros(2, dtype=torch.int32), 1, nprog=1, flag=True)


@pytest.mark.parametrize("nprog", [2, 3, 5])
@pytest.mark.parametrize("flag", [False, True], ids=["counter", "flag"])
def test_handoffs_between_concurrent_programs(nprog, flag):
    n = 4
    bar = _threaded_handoffs(torch.zeros(BAR_WORDS, dtype=torch.int32), n, nprog, flag)
    assert bar[0] == n * nprog and bar[1] == 0
    # the flag holds the last target (n hand-offs of nprog arrivals), the counter hand-off leaves it
    assert bar[FLAG_WORD.value] == (n * nprog if flag else 0) and bar[FLAG_WORD.value + 1] == 0


# The split hand-off (stages.handoff.grid_handoff_split: the layer's `guard.signal_split` and
# `guard.wait_ge` polls, here with RMW polls, as the interpreter has no ld.acquire). The
# interpreter gives every thread the same program id, so the arrivals all land on one of the
# counters; the waits are on the counters' sum either way.
@pytest.mark.parametrize("nprog", [2, 5])
@pytest.mark.parametrize("split", [1, 2, 8])
def test_split_handoffs_between_concurrent_programs(nprog, split):
    n = 4
    bar = _threaded_handoffs(torch.zeros(SPLIT_WORDS, dtype=torch.int32), n, nprog, False, split)
    counters = bar[: split * LINE_WORDS.value: LINE_WORDS.value]
    assert int(counters.sum()) == n * nprog and int(bar.abs().sum()) == n * nprog


def test_split_handoffs_refuse_what_they_cannot_run():
    bar = torch.zeros(SPLIT_WORDS, dtype=torch.int32)
    LH.launch_handoffs(bar, 3, nprog=1, split=8)
    assert bar[0] == 3 and int(bar.abs().sum()) == 3
    with pytest.raises(ValueError, match="1..8 counters, not 9"):
        LH.launch_handoffs(bar, 1, nprog=1, split=9)
    with pytest.raises(ValueError, match="needs a bar of 258 int32 words, not 64"):
        LH.launch_handoffs(torch.zeros(BAR_WORDS, dtype=torch.int32), 1, nprog=1, split=8)
    with pytest.raises(ValueError, match="cannot run them"):
        LH.launch_handoffs(bar, 1, nprog=1, split=2, ld=True)
    with pytest.raises(ValueError, match="not both"):
        LH.launch_handoffs(bar, 1, nprog=1, split=2, flag=True)


@triton.jit
def one_handoff(bar_ptr, target):
    grid_handoff_flag(bar_ptr, target)


def test_flag_handoff_targets_wrap_modulo_2_32():
    f = FLAG_WORD.value
    # the last arriver of a hand-off whose target passes 2^31 (int32 wrap): it publishes
    bar = torch.zeros(BAR_WORDS, dtype=torch.int32)
    bar[0] = 2**31 - 1  # int32 max: the counter before the last arrival
    bar[f] = 2**31 - 9
    one_handoff[(1,)](bar, 2**31)
    assert bar[0] == -(2**31) and bar[f] == -(2**31)
    # a program that is not the last, with the flag already up: it arrives and passes
    bar = torch.zeros(BAR_WORDS, dtype=torch.int32)
    bar[0], bar[f] = 7, 8
    one_handoff[(1,)](bar, 8)
    assert bar[0] == 8 and bar[f] == 8


@pytest.mark.parametrize("span", [True, False], ids=["span", "splitk"])
def test_gemv_with_the_flag_handoff_gives_the_counter_handoffs_bits(span):
    from mono_common.stages.gemv_host import GemvPlan, alloc_out, launch_gemv
    n, k, rows, L = 200, 512, 2, 3
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(L, n, k, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    s = torch.rand(L, -(-n // 128), k // 128, generator=g) * 1e-3 + 1e-4
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
    plan = GemvPlan.make(n, k, rows, nprog=1, bn=128, span=span, **({} if span else dict(ks=2)))
    outs, bars = [], []
    for flag in (False, True):
        bar = torch.zeros(BAR_WORDS, dtype=torch.int32)
        out = alloc_out(plan, L, "cpu")
        launch_gemv(plan, x, w, s, out, bar, barrier=True, flag=flag)
        outs.append(out)
        bars.append(bar)
    nobar = alloc_out(plan, L, "cpu")
    launch_gemv(plan, x, w, s, nobar)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], nobar)
    f = FLAG_WORD.value
    assert bars[0][0] == L and bars[0][f] == 0 and bars[1][0] == L and bars[1][f] == L
