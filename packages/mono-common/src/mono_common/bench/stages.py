"""`mono bench stages`: each library stage alone on the GPU, against the read ceiling.

    mono bench stages --out results/ [--stages gemv,topk,mla,handoff,expert] [--jobs 8]
        [--rows 1,8] [--shapes 2624x6144,...] [--variants ...] [--keys 4096,...]
        [--mla-variants ct64,ct16,ct16h,ct32h] [--handoffs 1000]

Stages (all by default):
  gemv     the FP8 block-128 GEMV at GLM-5.3's shapes, rows 1, 2, 8, the variants of
           GEMV_VARIANTS side by side, with and without a grid hand-off after each weight set
           (a variant named ...h hands off with `stages.handoff.grid_handoff_flag`)
  topk     the radix top-k of 2048 over 4096 / 65536 / 200000 keys, rows 1 and 8: its six
           stages linked by six hand-offs in one launch (what it costs inside a layer); at
           most ROW_KEYS keys also the "row" variant, one program a row and one hand-off,
           and "rowh": radix pass 0, a hand-off, then the row search seeded by its histogram
           (`topk.topk_row` HIST, as a layer that runs pass 0 in the index scores would), and
           "spread": radix pass 0 with the fine histograms, then the spread form's threshold and
           write on every program
           (`topk.topk_spread_threshold` / `topk_spread_write`), a hand-off after each, and
           "spreads": the same with the threshold and write as one stage (`topk.topk_spread_select`)
  mla      sparse MLA over 2048 selected tokens of one TP8 rank (8 heads, latent 512 + rope 64),
           rows 1 and 8: partials, hand-off, combine, hand-off ("bar"); the partials alone
           ("nobar", the stage's streaming rate)
  handoff  one launch of N back-to-back grid hand-offs with no work (`guard.signal` then
           `guard.poll`, as every entry hands off), at 2 and 1 programs per SM: time per
           hand-off, (launch of N - launch of none) / N, against the 1 us target; beside it
           (us_flag) the same launch with `stages.handoff.grid_handoff_flag` (one arrival RMW,
           waiters polling a separate flag word with plain loads), and (us_forms) with
           `stages.handoff.grid_handoff_split` (arrivals over 1, 2 or 8 counters, polled with RMWs
           or, on NVIDIA, with acquire loads: SPLIT_FORMS), and on NVIDIA with
           `stages.handoff.grid_handoff_spin` (one thread's poll loop, RMWs or loads: SPIN_FORMS)
  expert   `mono_common.bench.expert.bench_expert`, imported when this stage runs

A time is the median of CUDA-graph replays of one launch that runs the stage over L input sets
one after another, divided by L. The sets rotate through more than 3x the H200's 60 MB L2
(ROTATE_BYTES) where the bytes matter; L is capped at MAX_SETS, so a stage whose set is a few
kB runs from the L2 (each row's `rotated_bytes` says which), its time being latency, not bytes.
The floor is the bytes a stage must read (FLOOR_BYTES says what is counted) over the read
ceiling measured in this run (`bench.ceiling`); `frac` is floor / time.

Compiles stay out of the timed replays: with `--jobs N` every case runs its launches once in N
worker processes first, at the sizes the timing uses (Triton specialises on integer values, so
the same sizes give the same kernels, then served from its disk cache); without it, each
case's first eager call compiles before its graph is captured. JSON and PNG go to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable

STAGES = ("gemv", "topk", "mla", "handoff", "expert")
GEMV_SHAPES = ((2624, 6144), (6144, 2048), (4096, 2048), (2048, 2048))
# name -> GemvPlan.make keywords
GEMV_VARIANTS = {
    "k64": dict(bn=64, span=False, num_warps=4),                 # the layer's tile before the library
    "s128x": dict(bn=128, span=True, num_warps=4),               # stream-K, x @ w^T, bf16 MMA
    "s128f": dict(bn=128, span=True, num_warps=4, dot=2),        # stream-K, swap-AB e4m3 MMA
    "s128fq": dict(bn=128, span=True, num_warps=4, dot=2, xq=True),  # + x quantised by its producer
    "s128fqp": dict(bn=128, span=True, num_warps=4, dot=2, xq=True, pre=True),  # + register prefetch
    "s128fqh": dict(bn=128, span=True, num_warps=4, dot=2, xq=True, hflag=True),  # s128fq, flag hand-off
    # s128fq with each column tile summed into slot 0 by its last span (gemv.span_fixup), as
    # mono-glm53's qkva_fixup / qb_fixup / oproj_fixup knobs do (not yet run on the H200)
    "s128fqx": dict(bn=128, span=True, num_warps=4, dot=2, xq=True, fixup=True),
    # the k-loop pipelined 3 deep, every load (scales, and x where the loop quantises it); H200,
    # session 14: 0.2-0.7 us slower than s128f / s128fq at every shape and row count
    "s128fl": dict(bn=128, span=True, num_warps=4, dot=2, lstg=3),
    "s128fql": dict(bn=128, span=True, num_warps=4, dot=2, xq=True, lstg=3),
    # s128fq with each weight set's successor requested into the L2 before the set runs, as a
    # layer requests its stages' weights ahead (issue 19): the HBM streams through the hand-offs
    # s128f with x quantised in the loop on sm_90's conversion unit: a layer's o_proj, whose
    # input (the value projection's tiles, 32 columns of a 128-column block each) is not quantised
    # by its producer
    "s128fh": dict(bn=128, span=True, num_warps=4, dot=2, hwx=True),
    "s128fqn": dict(bn=128, span=True, num_warps=4, dot=2, xq=True, l2_ahead=1),
    # the same as sm_90's bulk prefetches (`prefetch.prefetch_bulk`: 16 KB an instruction)
    "s128fqb": dict(bn=128, span=True, num_warps=4, dot=2, xq=True, l2_ahead=2),
    # s128fq as a call of one copy of the span's code (gemv.gemv_span_call, mono-glm53's
    # gemv_call): what the call costs a span where the code is warm (not yet run on a GPU)
    "s128fqc": dict(bn=128, span=True, num_warps=4, dot=2, xq=True, call=True),
    "s256fq": dict(bn=256, span=True, num_warps=8, dot=2, xq=True),
    "s256fq4": dict(bn=256, span=True, num_warps=4, dot=2, xq=True),
}
DEFAULT_ROWS = {"gemv": (1, 2, 8), "topk": (1, 8), "mla": (1, 8)}
ROTATE_BYTES = 256 << 20  # > 3x the H200's 60 MB L2 (and MI355X's 4 MB L2 x 8 XCDs + 256 MB MALL)
MAX_SETS = 512
# GLM-5.3 (mono_glm53.config.REAL): index_topk 2048; 64 heads, 8 on a TP8 rank; kv_lora 512 +
# qk_rope 64; softmax scale (qk_nope 192 + qk_rope 64) ** -0.5; page 64
INDEX_TOPK = 2048
TOPK_KEYS = (4096, 65536, 200000)
# the "row" variant's rows (`topk.topk_rows_one`): at most this many keys, as sm_90 holds them
ROW_KEYS = 4096
# "radix" at every length, "row", "rowh", "spread" and "spreads" where the rows have at most ROW_KEYS keys
TOPK_VARIANTS = ("radix", "row", "rowh", "spread", "spreads")
# (heads, latent, rope, selected tokens, tokens a request holds, page): the selection is half of
# each request's tokens, in shuffled pages, so the reads are a gather as in serving
MLA_SHAPE = (8, 512, 64, INDEX_TOPK, 2 * INDEX_TOPK, 64)
MLA_SCALE = 256 ** -0.5
# (tokens a chunk, HOLD): the layer's 64; 16 gives 4x the tiles; "h": the chunk's keys held for
# both products, one round of loads a tile (`stages.mla` HOLD)
MLA_VARIANTS = {"ct64": (64, False), "ct16": (16, False), "ct16h": (16, True), "ct32h": (32, True)}
MLA_REL_BOUND = 5e-3  # bf16 P and a bf16 output (tests/kernels/test_small_stages_gpu.py)
HANDOFFS = 1000
HANDOFF_TARGET_US = 1.0
FLOOR_BYTES = {
    "gemv": "one weight set: N x K e4m3 bytes + its fp32 block scales",
    "topk": "one score set read once: rows x keys x 4 B (the six stages read it six times; the later "
            "passes find it in the L2 when a set fits there)",
    "mla": "the selected latent rows (rows x 2048 x 576 x 2 B), the absorbed queries (rows x heads x 576 "
           "x 4 B), the selected positions and their page-table entries (rows x 2048 x 4 B each); the "
           "partials the split writes and the combine reads back are not counted",
}


@dataclasses.dataclass(frozen=True)
class Job:
    """One timed case: `shape` is (N, K) for gemv, (keys, k) for topk, MLA_SHAPE's fields for
    mla, (hand-offs,) for handoff; `nprog` the grid (gemv: before the variant's own sizing)."""

    stage: str
    shape: tuple
    rows: int | None
    variant: str
    nprog: int


@dataclasses.dataclass
class Case:
    """A job made runnable: `steps` are the launches timed (tag -> one launch), `run` the
    untimed launch whose result `compare` checks on the CPU (-> row fields), `finish` turns the
    median microseconds of each step into row fields (default: per set, against the floor)."""

    row: dict
    per: int
    steps: dict[str, Callable[[], object]]
    run: Callable[[], object] | None = None
    compare: Callable[[object], dict] | None = None
    finish: Callable[[dict], dict] | None = None


def sets_for(set_bytes: int, even: bool = False) -> int:
    """Input sets a launch runs through: enough to rotate ROTATE_BYTES, 4 to MAX_SETS."""
    n = min(MAX_SETS, max(4, -(-ROTATE_BYTES // set_bytes)))
    return n + (n % 2 if even else 0)


def _floor(row: dict, nbytes: int, ceiling: float | None) -> None:
    row["bytes"] = nbytes
    row["floor_us"] = nbytes / ceiling / 1e6 if ceiling else None


def _random_fp8_bits(torch, shape, device, gen):
    """Random e4m3 weights (finite codes only) as uint8."""
    v = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 64
    return v.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def variant_plan(name: str, n: int, k: int, rows: int, nprog: int):
    """(GemvPlan, whether x comes pre-quantised) of GEMV_VARIANTS[name]. The grid: `nprog`
    (2 programs per SM) at 4 warps, half at 8 (255 registers a thread fit once per SM)."""
    from mono_common.stages.gemv_host import GemvPlan

    kw = dict(GEMV_VARIANTS[name])
    xq = kw.pop("xq", False)
    kw.pop("hflag", None)  # the hand-off's form, not the plan's (_gemv_case reads it)
    kw.pop("fixup", None)  # the launch's, not the plan's (_gemv_case reads it)
    grid = nprog // 2 if kw.get("num_warps", 4) == 8 else nprog
    return GemvPlan.make(n, k, rows, grid, **kw), xq


def _gemv_case(torch, dev, job, ceiling, memo):
    from mono_common.ref.fp8 import per_token_group_quant
    from mono_common.ref.gemv import block_fp8_gemv
    from mono_common.stages.gemv_host import alloc_out, fixup_words, launch_gemv, run_gemv
    from mono_common.stages.handoff import BAR_WORDS

    (n, k), rows = job.shape, job.rows
    L = sets_for(n * k)
    # one shape's weights serve its rows and variants; the previous shape's are dropped first
    if memo.get("gemv_w", (None,))[0] != (n, k):
        memo.pop("gemv_w", None)
        memo.pop("gemv_x", None)
        gen = torch.Generator(device=dev).manual_seed(n * 7 + k)
        w = _random_fp8_bits(torch, (L, n, k), dev, gen)
        s = torch.rand((L, -(-n // 128), k // 128), generator=gen, device=dev) * 1e-3 + 1e-4
        memo["gemv_w"] = ((n, k), w, s)
    _, w, s = memo["gemv_w"]
    if memo.get("gemv_x", (None,))[0] != (n, k, rows):
        gen = torch.Generator(device=dev).manual_seed(rows)
        memo["gemv_x"] = ((n, k, rows), torch.randn((rows, k), generator=gen, device=dev).to(torch.bfloat16), {})
    _, x, refs = memo["gemv_x"]
    plan, xq = variant_plan(job.variant, n, k, rows, job.nprog)
    hflag = GEMV_VARIANTS[job.variant].get("hflag", False)
    fixup = GEMV_VARIANTS[job.variant].get("fixup", False)
    xs = None
    xin = x
    if xq:
        q, xs = per_token_group_quant(x, 128)
        xin, xs = q.to(torch.bfloat16), xs.contiguous()
    row = dict(stage="gemv_fp8", shape=f"{n}x{k}", rows=rows, variant=job.variant, nprog=job.nprog,
               grid=plan.nprog, BN=plan.BN, KS=plan.KS, PER=plan.PER, span=plan.span, pre=plan.pre,
               warps=plan.num_warps, dot=plan.dot, xq=xq, l2_ahead=plan.l2_ahead,
               handoff="flag" if hflag else "counter", L=L,
               rotated_bytes=L * (n * k + s[0].numel() * 4))
    _floor(row, n * k + s[0].numel() * 4, ceiling)
    out = alloc_out(plan, L, dev)
    bar = torch.zeros(BAR_WORDS, dtype=torch.int32, device=dev)

    def compare(got):
        if "ref" not in refs:
            # on the CPU in fp64: a CUDA-side reference is not what is being checked
            refs["ref"] = block_fp8_gemv(x.cpu(), w[0].cpu(), s[0].cpu()).double()
        ref = refs["ref"]
        err = ((got[0].double().cpu() - ref).norm() / ref.norm()).item()
        bound = 1e-3 if plan.dot == 2 else 1e-6
        return dict(rel_err=err) if err < bound else dict(rel_err=err, error=f"relative error {err:.3g} vs fp64")

    # the fixup's counters and epochs: one buffer for every launch (they count on)
    fix = torch.zeros(fixup_words(plan, L), dtype=torch.int32, device=dev) if fixup else None
    return Case(row, L, {tag: (lambda b=b: launch_gemv(plan, xin, w, s, out, bar, barrier=b, xs=xs, flag=hflag,
                                                       fixup=fix))
                         for tag, b in (("bar", True), ("nobar", False))},
                run=lambda: run_gemv(plan, xin, w[:1], s[:1], xs=xs), compare=compare)


def _topk_case(torch, dev, job, ceiling, memo):
    from mono_common.ref.topk import topk_index_order
    from mono_common.stages.linked_host import launch_topk_linked, run_topk_linked, topk_buffers

    (n, k), rows = job.shape, job.rows
    row = ROW_KEYS if job.variant in ("row", "rowh") else 0
    hist = job.variant == "rowh"
    spread = ROW_KEYS if job.variant in ("spread", "spreads") else 0
    select = job.variant == "spreads"
    # even: the launch's sets zero each other's histograms, two slices in turn (linked_entries)
    L = sets_for(rows * n * 4, even=True)
    gen = torch.Generator(device=dev).manual_seed(n + rows)
    scores = torch.randn((L, rows, n), generator=gen, device=dev)
    seqlen = torch.full((rows,), n, dtype=torch.int32, device=dev)
    bufs = topk_buffers(rows, n, k, dev, spread=bool(spread))
    info = dict(stage="topk", shape=f"{k}of{n}", rows=rows, variant=job.variant, nprog=job.nprog, keys=n, k=k,
                L=L, handoffs_per_set=(2 if hist else 1) if row else ((2 if select else 3) if spread else 6), rotated_bytes=L * rows * n * 4)
    _floor(info, rows * n * 4, ceiling)

    def compare(got):
        want = topk_index_order(scores[0].cpu(), seqlen.cpu(), k)
        bad = int((got.cpu().long() != want).any(1).sum())
        return dict(check="exact") if not bad else dict(error=f"{bad} of {rows} rows differ from the reference")

    return Case(info, L, {"bar": lambda: launch_topk_linked(scores, seqlen, bufs, job.nprog, row, hist, spread,
                                                            select)},
                run=lambda: run_topk_linked(scores[0], seqlen, k, job.nprog, row, hist, spread, select),
                compare=compare)


def mla_inputs(torch, rows, shape, L, dev, seed=0):
    """qabs [rows, heads, D] (bf16 values), L latent caches [L, rows x ctx, D] bf16, each row's
    `topk` positions in index order, req, req_to_token (rows' tokens in shuffled pages)."""
    nh, kvl, rd, topk_n, ctx, page = shape
    D = kvl + rd
    g = torch.Generator().manual_seed(seed + rows)
    q = torch.randn(rows, nh, D, generator=g).bfloat16().float()
    pages = torch.randperm(rows * ctx // page, generator=g).view(rows, ctx // page)
    rtt = (pages[:, :, None] * page + torch.arange(page)).reshape(rows, ctx).int()
    topk = torch.stack([torch.randperm(ctx, generator=g)[:topk_n].sort().values for _ in range(rows)]).int()
    req = torch.arange(rows, dtype=torch.int64)
    gd = torch.Generator(device=dev).manual_seed(seed + 1)
    kv = torch.randn((L, rows * ctx, D), generator=gd, device=dev, dtype=torch.bfloat16)
    return q, kv, topk, req, rtt


def _mla_case(torch, dev, job, ceiling, memo):
    from mono_common.ref.mla import sparse_mla, topk_to_slots
    from mono_common.stages.linked_host import MLA_LINKED, MLA_PARTIAL, MlaPlan, launch_mla, mla_buffers, run_mla

    nh, kvl, rd, topk_n, ctx, page = job.shape
    rows = job.rows
    ct, hold = MLA_VARIANTS[job.variant]
    plan = MlaPlan(W=rows, NH=nh, KVL=kvl, RD=rd, TOPK=topk_n, CT=ct, HOLD=hold)
    D = kvl + rd
    L = sets_for(rows * topk_n * D * 2)
    q, kv, topk, req, rtt = mla_inputs(torch, rows, job.shape, L, dev)
    qd, topkd, reqd, rttd = (t.to(dev) for t in (q, topk, req, rtt))
    bufs = mla_buffers(plan, dev)
    row = dict(stage="mla", shape=f"{topk_n}tok{nh}h", rows=rows, variant=job.variant, nprog=job.nprog,
               heads=nh, CT=plan.CT, HG=plan.HG, L=L, rotated_bytes=L * rows * topk_n * D * 2)
    _floor(row, rows * topk_n * D * 2 + rows * nh * D * 4 + rows * topk_n * 8, ceiling)

    def compare(got):
        ref = sparse_mla(q.double(), kv[0].cpu(), topk_to_slots(topk, req, rtt), kvl, MLA_SCALE)
        err = ((got.cpu().double() - ref).norm() / ref.norm()).item()
        return dict(rel_err=err) if err < MLA_REL_BOUND else dict(rel_err=err, error=f"relative error {err:.3g}")

    def step(mode):
        return lambda: launch_mla(plan, qd, kv, topkd, reqd, rttd, MLA_SCALE, bufs, job.nprog, mode)

    return Case(row, L, {"bar": step(MLA_LINKED), "nobar": step(MLA_PARTIAL)},
                run=lambda: run_mla(plan, qd, kv[0], topkd, reqd, rttd, MLA_SCALE, job.nprog, linked=True),
                compare=compare)


# The split hand-off's forms beside the counter and flag ones: (counters, acquire-load polls)
SPLIT_FORMS = {"split8": (8, False), "ld": (1, True), "split2ld": (2, True), "split8ld": (8, True)}
# `handoff.grid_handoff_spin` (one thread's poll loop; True: acquire loads), NVIDIA only
SPIN_FORMS = {"spin": False, "spinld": True}


def _handoff_case(torch, dev, job, ceiling, memo):
    """The hand-off forms on one grid: us_bar (`entries.grid_handoff`, every program polling
    the counter with RMWs), us_flag (`handoff.grid_handoff_flag`) and us_forms, the split forms
    of SPLIT_FORMS (`handoff.grid_handoff_split`; the acquire-load ones on NVIDIA devices only)
    and the one-thread poll loops of SPIN_FORMS (`handoff.grid_handoff_spin`, NVIDIA only)."""
    from mono_common.stages.handoff import BAR_WORDS, FLAG_WORD, LINE_WORDS, SPLIT_WORDS
    from mono_common.stages.linked_host import _amd, launch_handoffs

    (n,) = job.shape
    bar = torch.zeros(max(BAR_WORDS, SPLIT_WORDS), dtype=torch.int32, device=dev)
    row = dict(stage="handoff", shape=f"{n}x", rows=None, variant=job.variant, nprog=job.nprog, handoffs=n,
               target_us=HANDOFF_TARGET_US)
    want = n * job.nprog
    ld_ok = dev.type == "cuda" and not _amd(dev)
    forms = {k: v for k, v in SPLIT_FORMS.items() if ld_ok or not v[1]}
    spins = {k: v for k, v in SPIN_FORMS.items() if ld_ok}

    def split(name):
        s, ld = forms[name]
        return lambda: launch_handoffs(bar, n, job.nprog, split=s, ld=ld)

    def spin(name):
        return lambda: launch_handoffs(bar, n, job.nprog, spin=True, ld=spins[name])

    def compare(got):
        counter, (fcounter, flag) = int(got[0][0]), (int(got[1][0]), int(got[1][FLAG_WORD.value]))
        if counter != want:
            return dict(error=f"counter {counter}, not {want}")
        if (fcounter, flag) != (want, want):
            return dict(error=f"flag hand-off: counter {fcounter}, flag {flag}, not {want}")
        for name, g in zip(forms, got[2:]):
            s = forms[name][0]
            total = int(g[: s * LINE_WORDS.value : LINE_WORDS.value].sum())
            if total != want or int(g.abs().sum()) != want:
                return dict(error=f"{name} hand-off: counters sum to {total}, not {want}")
        for name, g in zip(spins, got[2 + len(forms):]):
            if int(g[0]) != want or int(g.abs().sum()) != want:
                return dict(error=f"{name} hand-off: counter {int(g[0])}, not {want}")
        return dict(check="counter")

    def finish(t):
        us = (t["bar"] - t["empty"]) / n
        usf = (t["flag"] - t["empty"]) / n
        usx = {name: (t[name] - t["empty"]) / n for name in [*forms, *spins]}
        return dict(us_bar=us, us_flag=usf, us_forms=usx, us_launch=t["empty"], meets_target=us <= HANDOFF_TARGET_US,
                    meets_target_flag=usf <= HANDOFF_TARGET_US)

    timed = {"bar": lambda: launch_handoffs(bar, n, job.nprog),
             "flag": lambda: launch_handoffs(bar, n, job.nprog, flag=True),
             "empty": lambda: launch_handoffs(bar, 0, job.nprog)}
    timed.update({name: split(name) for name in forms})
    timed.update({name: spin(name) for name in spins})
    return Case(row, n, timed,
                run=lambda: (launch_handoffs(bar, n, job.nprog).to("cpu", copy=True),
                             launch_handoffs(bar, n, job.nprog, flag=True).to("cpu", copy=True),
                             *[split(name)().to("cpu", copy=True) for name in forms],
                             *[spin(name)().to("cpu", copy=True) for name in spins]),
                compare=compare, finish=finish)


BUILDERS = {"gemv": _gemv_case, "topk": _topk_case, "mla": _mla_case, "handoff": _handoff_case}


def build_case(torch, dev, job: Job, ceiling: float | None = None, memo: dict | None = None) -> Case:
    return BUILDERS[job.stage](torch, dev, job, ceiling, {} if memo is None else memo)


def time_case(case: Case, replays: int, check: bool = True) -> dict:
    """The case's row: the check's fields, then each step's median over `replays` graph replays."""
    from mono_common import graph_timing

    row = dict(case.row)
    t0 = time.time()
    try:
        if check and case.run is not None:
            row.update(case.compare(case.run()))
        times = {tag: graph_timing.graph_median_us(step, 1, replays, warmup=3) for tag, step in case.steps.items()}
        if case.finish is not None:
            row.update(case.finish(times))
        else:
            for tag, us in times.items():
                row[f"us_{tag}"] = us / case.per
                if row.get("floor_us"):
                    row[f"frac_{tag}"] = row["floor_us"] / row[f"us_{tag}"]
    except Exception as e:  # a case that fails to build or run is reported, not fatal
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    row["seconds"] = round(time.time() - t0, 1)
    return row


def bench_jobs(torch, dev, jobs, ceiling, replays, check=True, out=print) -> list[dict]:
    res = []
    memo: dict = {}  # inputs shared by consecutive cases (a GEMV shape's weights)
    for i, job in enumerate(jobs):
        if i and job.stage != jobs[i - 1].stage:
            memo.clear()
        try:
            case = build_case(torch, dev, job, ceiling, memo)
        except Exception as e:
            row = dict(stage=job.stage, shape=str(job.shape), rows=job.rows, variant=job.variant,
                       error=f"{type(e).__name__}: {e}"[:300])
        else:
            row = time_case(case, replays, check)
            del case
        res.append(row)
        out(format_row(row))
        if getattr(dev, "type", dev) == "cuda":
            torch.cuda.empty_cache()
    return res


def bench_expert_rows(torch, dev, nprog, ceiling, replays, out=print, shapes=None, variants=None) -> list[dict]:
    """`mono_common.bench.expert.bench_expert`'s rows (it prints them itself), or one row saying
    why there are none (printed here)."""
    try:
        from mono_common.bench.expert import bench_expert
    except ImportError as e:
        row = dict(stage="expert", error=f"mono_common.bench.expert is not available: {e}")
    else:
        try:
            return list(bench_expert(torch, dev, nprog, ceiling, replays, shapes=shapes, variants=variants))
        except Exception as e:
            row = dict(stage="expert", error=f"{type(e).__name__}: {e}"[:300])
    out(format_row(row))
    return [row]


def warm_expert(nprog: int, workers: int, shapes=None, variants=None) -> None:
    """The expert module's own warm-up (`warm_expert(nprog, workers, shapes, variants)`), where it
    has one."""
    import importlib

    try:
        # by its module name, as bench_expert_rows imports it (a package attribute can be stale)
        expert = importlib.import_module("mono_common.bench.expert")
    except ImportError:
        return
    hook = getattr(expert, "warm_expert", None)
    if hook is not None:
        hook(nprog, workers, shapes, variants)


def _warm_one(job: Job, device: str = "cuda") -> Job:
    """Run one case's launches once in a worker process (its compiles fill Triton's disk cache)."""
    import torch

    dev = torch.device(device)
    case = build_case(torch, dev, job)
    if case.run is not None:
        case.run()
    for step in case.steps.values():
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return job


def warm(jobs, workers: int, out=print, device: str = "cuda") -> None:
    """Compile every job's kernels in `workers` processes at once (compiles dominate otherwise)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        for f in cf.as_completed([ex.submit(_warm_one, j, device) for j in jobs]):
            try:
                f.result()
            except Exception as e:  # the timing pass reports it per case
                out(f"warm-up failed: {type(e).__name__}: {str(e)[:200]}")


def format_row(r: dict) -> str:
    rows = "-" if r.get("rows") is None else r["rows"]
    head = f"{r.get('stage', '?'):9s} {str(r.get('shape', '')):>12s} rows {rows:>2} {r.get('variant', ''):9s}"
    if "us_bar" not in r:
        return f"{head} FAILED: {r.get('error')}"
    if r.get("stage") == "handoff":
        verdict = "met" if r.get("meets_target") else "NOT met"
        text = (f"{r['us_bar']:.3f} us a hand-off over {r['handoffs']} (target {r['target_us']} us: {verdict}), "
                f"launch alone {r['us_launch']:.2f} us")
        if "us_flag" in r:
            text += f"; flag hand-off {r['us_flag']:.3f} us ({'met' if r.get('meets_target_flag') else 'NOT met'})"
        for name, us in r.get("us_forms", {}).items():
            text += f"; {name} {us:.3f} us"
    else:
        detail = ""
        if "BN" in r:
            detail = f"BN {r['BN']:3d} KS {r['KS']:2d} PER {r['PER']:3d}  "
        elif "CT" in r:
            detail = f"CT {r['CT']:2d}  "
        text = f"{detail}{r['us_bar']:8.2f} us{_pct(r, 'frac_bar')}"
        if "us_nobar" in r:
            text += f"  no hand-off {r['us_nobar']:8.2f} us{_pct(r, 'frac_nobar')}"
        if r.get("floor_us") is not None:
            text += f"  floor {r['floor_us']:.2f} us"
        if "rel_err" in r:
            text += f"  rel_err {r['rel_err']:.1e}"
        elif "check" in r:
            text += f"  {r['check']}"
    if r.get("error"):
        text += f"  {r['error']}"
    if "seconds" in r:
        text += f" [{r['seconds']} s]"
    return f"{head} {text}"


def _pct(r, key):
    return f" ({100 * r[key]:5.1f} %)" if r.get(key) is not None else ""


def summary(res) -> list[str]:
    """The best variant per stage, shape and rows (with its hand-offs), and each hand-off grid."""
    best: dict = {}
    lines = []
    for r in res:
        if "us_bar" in r and r.get("frac_bar") is not None:
            key = (r["stage"], r["shape"], r["rows"])
            if key not in best or r["us_bar"] < best[key]["us_bar"]:
                best[key] = r
    if best:
        lines.append("best per stage, shape and rows (with hand-offs):")
        for (stage, shape, rows), r in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
            lines.append(f"  {stage:9s} {shape:>12s} rows {rows}: {r['variant']:8s} {r['us_bar']:.2f} us = "
                         f"{100 * r['frac_bar']:.1f} % of the ceiling (floor {r['floor_us']:.2f} us)")
    for r in res:
        if r.get("stage") == "handoff" and "us_bar" in r:
            lines.append(f"  hand-off on {r['nprog']} programs: {r['us_bar']:.3f} us "
                         f"({'meets' if r['meets_target'] else 'misses'} the {r['target_us']} us target)")
            if "us_flag" in r:
                lines.append(f"  flag hand-off on {r['nprog']} programs: {r['us_flag']:.3f} us "
                             f"({'meets' if r.get('meets_target_flag') else 'misses'} the {r['target_us']} us target)")
            for name, us in r.get("us_forms", {}).items():
                lines.append(f"  {name} hand-off on {r['nprog']} programs: {us:.3f} us "
                             f"({'meets' if us <= r['target_us'] else 'misses'} the {r['target_us']} us target)")
    failed = [r for r in res if r.get("error")]
    if failed:
        lines.append(f"{len(failed)} row(s) with an error: " + "; ".join(
            f"{r.get('stage')} {r.get('shape', '')} rows {r.get('rows')} {r.get('variant', '')}" for r in failed))
    return lines


def plot(res, path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    frac = [r for r in res if "us_bar" in r and r.get("frac_bar") is not None]
    hand = [r for r in res if r.get("stage") == "handoff" and "us_bar" in r]
    panels = [p for p in (frac, hand) if p]
    if not panels:
        return False
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, len(frac) * 0.35), 4 * len(panels)), squeeze=False)
    ax = axes[0][0]
    if frac:
        labels = [f"{r['stage']} {r['shape']}\nr{r['rows']} {r['variant']}" for r in frac]
        ax.bar(range(len(frac)), [100 * r["frac_bar"] for r in frac], label="with hand-offs")
        nob = [(i, 100 * r["frac_nobar"]) for i, r in enumerate(frac) if r.get("frac_nobar") is not None]
        if nob:
            ax.plot([i for i, _ in nob], [v for _, v in nob], "k.", label="no hand-off")
        ax.set_xticks(range(len(frac)), labels, rotation=90, fontsize=6)
        ax.set_ylabel("% of read ceiling")
        ax.legend()
        ax = axes[-1][0]
    if hand:
        ax.bar(range(len(hand)), [r["us_bar"] for r in hand], label="counter polled (grid_handoff)")
        flag = [(i, r["us_flag"]) for i, r in enumerate(hand) if r.get("us_flag") is not None]
        if flag:
            ax.plot([i for i, _ in flag], [v for _, v in flag], "k*", label="flag polled (grid_handoff_flag)")
        ax.axhline(HANDOFF_TARGET_US, color="r", linestyle="--", label=f"target {HANDOFF_TARGET_US} us")
        ax.set_xticks(range(len(hand)), [f"{r['nprog']} programs" for r in hand])
        ax.set_ylabel("us a grid hand-off")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def _csv(kind, allowed=None):
    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"no {kind} given")
        if allowed is not None:
            bad = [t for t in items if t not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"unknown {kind} {bad}: choose from {', '.join(allowed)}")
            return items
        try:
            if kind == "shapes":
                out = [tuple(int(v) for v in t.split("x")) for t in items]
                if any(len(s) != 2 or min(s) <= 0 for s in out):
                    raise ValueError
                return out
            out = [int(t) for t in items]
            if min(out) <= 0:
                raise ValueError
            return out
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad {kind} {text!r}") from None

    return parse


def _positive(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return v


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="mono bench stages", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".", help="folder for stages_bench.json / .png")
    ap.add_argument("--stages", type=_csv("stages", STAGES), default=list(STAGES),
                    help=f"comma-separated, from {','.join(STAGES)} (default: all)")
    ap.add_argument("--rows", type=_csv("rows"), default=None,
                    help="rows for gemv, topk and mla (default: gemv 1,2,8; topk and mla 1,8)")
    ap.add_argument("--shapes", type=_csv("shapes"), default=list(GEMV_SHAPES), help="GEMV NxK list")
    ap.add_argument("--variants", type=_csv("GEMV variants", tuple(GEMV_VARIANTS)), default=list(GEMV_VARIANTS))
    ap.add_argument("--keys", type=_csv("keys"), default=list(TOPK_KEYS), help="top-k key counts")
    ap.add_argument("--mla-variants", type=_csv("MLA variants", tuple(MLA_VARIANTS)), default=list(MLA_VARIANTS))
    from mono_common.bench.expert import EXPERT_SHAPES, EXPERT_VARIANTS

    ap.add_argument("--expert-variants", type=_csv("expert variants", tuple(EXPERT_VARIANTS)), default=None,
                    help="expert stage variants (mono_common.bench.expert.EXPERT_VARIANTS; default: all)")
    ap.add_argument("--expert-shapes", type=_csv("expert shapes", tuple(EXPERT_SHAPES)), default=None,
                    help="expert stage shapes (mono_common.bench.expert.EXPERT_SHAPES; default: all)")
    ap.add_argument("--handoffs", type=_positive, default=HANDOFFS, help="hand-offs a launch (handoff stage)")
    ap.add_argument("--nprog", type=int, default=0, help="programs (default 2 per SM)")
    ap.add_argument("--replays", type=_positive, default=30)
    ap.add_argument("--no-check", action="store_true", help="skip the checks against the CPU references")
    ap.add_argument("--jobs", type=int, default=0, help="compile every case first in this many processes")
    return ap.parse_args(argv)


def make_plan(a: argparse.Namespace, nprog: int) -> list[Job]:
    """Every timed case of the stages asked for, in run order (the expert stage is its module's)."""
    def rows(stage):
        return a.rows if a.rows is not None else DEFAULT_ROWS[stage]

    jobs = []
    if "gemv" in a.stages:
        jobs += [Job("gemv", tuple(s), r, v, nprog) for s in a.shapes for r in rows("gemv") for v in a.variants]
    if "topk" in a.stages:
        jobs += [Job("topk", (n, INDEX_TOPK), r, v, nprog) for n in a.keys for r in rows("topk")
                 for v in TOPK_VARIANTS if v == "radix" or n <= ROW_KEYS]
    if "mla" in a.stages:
        jobs += [Job("mla", MLA_SHAPE, r, v, nprog) for r in rows("mla") for v in a.mla_variants]
    if "handoff" in a.stages:
        grids = sorted({nprog, max(1, nprog // 2)}, reverse=True)  # 2 and 1 programs per SM by default
        jobs += [Job("handoff", (a.handoffs,), None, f"grid{g}", g) for g in grids]
    return jobs


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("mono bench stages needs torch and a GPU: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("mono bench stages needs a GPU: torch sees none", file=sys.stderr)
        return 2
    from mono_common.bench.ceiling import read_ceiling_tbs

    dev = torch.device("cuda")
    nprog = a.nprog or 2 * torch.cuda.get_device_properties(dev).multi_processor_count
    jobs = make_plan(a, nprog)
    t0 = time.time()
    if a.jobs and jobs:
        warm(jobs, a.jobs)
        print(f"compiled {len(jobs)} cases in {time.time() - t0:.0f} s", flush=True)
    if a.jobs and "expert" in a.stages:
        warm_expert(nprog, a.jobs, a.expert_shapes, a.expert_variants)
    ceiling = read_ceiling_tbs(nprog=nprog)
    print(f"read ceiling: {ceiling:.3f} TB/s ({nprog} programs x 16 KB, 2 GiB)", flush=True)
    res = bench_jobs(torch, dev, jobs, ceiling, a.replays, check=not a.no_check,
                     out=lambda s: print(s, flush=True))
    if "expert" in a.stages:
        res += bench_expert_rows(torch, dev, nprog, ceiling, a.replays, out=lambda s: print(s, flush=True),
                                 shapes=a.expert_shapes, variants=a.expert_variants)
    os.makedirs(a.out, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__,
                triton=__import__("triton").__version__, ceiling_tbs=ceiling, nprog=nprog, stages=a.stages,
                rotate_bytes=ROTATE_BYTES, max_sets=MAX_SETS, floor_bytes=FLOOR_BYTES,
                seconds=round(time.time() - t0, 1),
                command="mono bench stages " + " ".join(sys.argv[1:] if argv is None else argv))
    with open(os.path.join(a.out, "stages_bench.json"), "w") as f:
        json.dump(dict(meta=meta, results=res), f, indent=1)
    plot(res, os.path.join(a.out, "stages_bench.png"))
    for line in summary(res):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
