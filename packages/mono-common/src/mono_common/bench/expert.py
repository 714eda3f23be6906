"""The MoE expert stage (`stages.moe`: gate_up, SiLU, down over expert slots) alone on the GPU,
against the read ceiling: the median time of a step (graph replays of one launch running L steps,
divided by L), with and without a grid hand-off after each step, the byte floor (bytes a step
must read over the read ceiling measured in the same run) and the fraction of the ceiling
reached.

Weights are rotated through more than 256 MB (> 3x the H200's L2): step l's rows pick their
experts from a window of the expert pool that the previous step's window does not overlap, and
each step has its own shared expert, so no step finds its weights in the L2. Each row's top-k
is drawn at random from its step's window (rows overlap as decode batches do, by chance).

    rows = bench_expert(torch, dev, nprog, ceiling, replays)     # ceiling as read_ceiling_tbs

Each (shape, rows) is timed once per EXPERT_VARIANTS entry (`variants` picks some), each row
naming its variant.
"""

from __future__ import annotations

import time

# name -> (hidden, intermediate per rank, routed experts, top-k): GLM-5.3 at a TP8 and a TP4 rank
EXPERT_SHAPES = {
    "glm53-tp8": (6144, 2048 // 8, 256, 8),
    "glm53-tp4": (6144, 2048 // 4, 256, 8),
}
ROTATE_BYTES = 256 << 20  # > 3x the H200's 60 MB L2 (and MI355X's 4 MB L2 x 8 XCDs + 256 MB MALL)
# name -> MoePlan.make options, timed side by side on the same lists, x and weights: "fused" the
# layer's form (64-column split-K gate_up tiles on bf16 MMAs), "span" gate_up as 128-column
# stream-K spans on e4m3 MMAs (the dense GEMV's faster form)
EXPERT_VARIANTS = {
    "fused": dict(),
    "span": dict(span=True),
    # down's slot loop pipelined 3 deep, every load (weights, x, scales, routing weights) in flight
    "pipe3": dict(down_stages=3),
    # + the e4m3 weights converted on sm_90's integer and bf16 pipes (gate_up's and down's)
    "cvt": dict(fastcvt=True),
    "pipe3cvt": dict(down_stages=3, fastcvt=True),
    # and on top of pipe3cvt: down 4 deep; two slots a down iteration; gate_up swap-AB (weights
    # on the MMA's M side); gate_up's k-loops with every load pipelined; both; 128-column tiles
    "d4": dict(down_stages=4, fastcvt=True),
    "dstep2": dict(down_stages=3, fastcvt=True, down_step=2),
    "gwx": dict(down_stages=3, fastcvt=True, gate_dot=1),
    "gl3": dict(down_stages=3, fastcvt=True, gate_stages=3),
    "gwxl3": dict(down_stages=3, fastcvt=True, gate_dot=1, gate_stages=3),
    "gwx128": dict(down_stages=3, fastcvt=True, gate_dot=1, bn=128),
    # gate_up as stream-K spans (every program the same bytes, whatever the slot count) on bf16
    # MMAs, weights converted fast; down pipelined, two slots an iteration
    "spwx": dict(span=True, gate_dot=1, fastcvt=True, down_stages=3, down_step=2),
    "spxw": dict(span=True, gate_dot=0, bn=64, fastcvt=True, down_stages=3, down_step=2),
    "spwx64": dict(span=True, gate_dot=1, bn=64, fastcvt=True, down_stages=3, down_step=2),
    "tiles2": dict(fastcvt=True, down_stages=3, down_step=2),  # spills 16 bytes at 1 row (sm_90)
    # pipe3cvt / tiles2 with the down loop's expert ids picked from registers: its weights two
    # iterations ahead, not one (sm_90 TTGIR, session 19: async_wait 9 / 18, not 0); not yet run
    # the weights to f16 on sm_90's conversion unit and f16 MMAs instead of fastcvt's integer path
    # (the GLM-5.3 layer's moe_f16: -2 % / -3.5 % at 1 / 8 rows there, H100, session 24)
    "pipe3f16": dict(down_stages=3, f16=True),
    # pipe3f16 with more of gate_up's weights in flight a program (sm_90 TTGIR, Triton 3.8: its
    # k-loop keeps 2 groups of 8 KB weight blocks in flight past its wait; an H100 profile of
    # the layer at 8 rows had gate_up's warps waiting on those copies, session 25): every load
    # of the k-loop pipelined 4 deep (8 groups in flight, 74 KB of shared memory a program);
    # 128-column tiles (16 KB blocks, 80 KB); and each with down's ids picked from registers (its
    # next slot's copies in flight: async_wait 9, not 0). 2 programs an SM, no spills (sm_90, 1
    # and 8 rows); 6 deep or 128 columns 4 deep take 126 KB, one program an SM
    "f16g4": dict(down_stages=3, f16=True, gate_stages=4),
    "f16bn128": dict(down_stages=3, f16=True, bn=128),
    "f16idv": dict(down_stages=3, f16=True, down_ids=True),
    "f16g4idv": dict(down_stages=3, f16=True, gate_stages=4, down_ids=True),
    "idv": dict(down_stages=3, fastcvt=True, down_ids=True),
    "idv2": dict(down_stages=3, fastcvt=True, down_step=2, down_ids=True),
    # Session 38 (H100; `bench/results/stages-h100-2026-12-06.txt`, its last section has the
    # forms dropped since: down in 16-column tiles, 2 or 4 slots an iteration; the slot loop 4-6
    # deep; slot-major and 32-column items; 64-column f16 spans): down as (column tile, slot)
    # items in equal spans, each tile summed by its last item's program (`moe.moe_down_items`),
    # 64 columns 4 deep: down 49.3 against f16idv's 56.4 us at 8 rows, 15.2 against 13.9 at 1
    "f16dit64": dict(down_stages=4, f16=True, down_items=True, bnd=64),
    # gate_up as 128-column stream-K spans on f16 swap-AB MMAs: gate_up 18.3-18.8 against 21.7
    # us at 1 row, 86 against 79 at 8
    "spf16x128": dict(span=True, gate_dot=1, bn=128, f16=True, down_stages=3, down_ids=True),
    # both MMAs on e4m3 operands, as the dense GEMVs (no weight conversion): gate_up's e4m3
    # spans with down's slot loop, and with down's e4m3 64-column items. gate_up 17.9 us at 1
    # row; down no faster than f16idv's at 1 row (an ncu profile of f16idv's down had its warps
    # stalled on global loads, 2.4 of 6.4 cycles an instruction, not on conversions)
    "spe4": dict(span=True, fastcvt=True, down_stages=3, down_ids=True),
    "e4dit64": dict(span=True, down_stages=4, down_items=True, down_dot=2, bnd=64),
}


def _fp8_bits(torch, shape, device, gen):
    """Random e4m3 weights (finite codes only) as uint8."""
    v = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 64
    return v.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def gate_up_bytes(H: int, I: int, blk: int = 128) -> int:  # noqa: E741
    """Bytes one FP8 block expert's gate_up reads: its [2I, H] weights and fp32 scales."""
    return 2 * I * H + 4 * -(-2 * I // blk) * -(-H // blk)


def expert_bytes(H: int, I: int, blk: int = 128) -> int:  # noqa: E741
    """Bytes one FP8 block expert reads: gate_up's (`gate_up_bytes`) and down's [H, I] weights
    and fp32 scales."""
    return gate_up_bytes(H, I, blk) + I * H + 4 * -(-H // blk) * -(-I // blk)


def _steps(torch, E, K, rows, per_step, gen, device):
    """Lists ids / wts [L, rows, K] (each row's ids sorted) of L >= 4 steps whose bytes add up
    past ROTATE_BYTES; consecutive steps draw from disjoint windows of E // 2 experts."""
    win = E // 2
    perm = torch.randperm(E, generator=gen, device="cpu")
    ids_l, total, li = [], 0, 0
    while li < 4 or total < ROTATE_BYTES:
        window = perm[torch.arange(li * win, (li + 1) * win) % E]
        ids = torch.stack([window[torch.randperm(win, generator=gen)[:K]] for _ in range(rows)])
        ids_l.append(ids.sort(-1).values)
        total += per_step(ids.unique().numel())
        li += 1
    ids = torch.stack(ids_l).to(torch.int32).to(device).contiguous()
    wts = torch.rand(ids.shape, generator=gen) + 0.05
    wts = (wts / wts.sum(-1, keepdim=True)).to(device).contiguous()
    return ids, wts


def bench_expert(torch, dev, nprog, ceiling, replays, shapes=None, rows_list=(1, 2, 8), check=True,
                 variants=None, quiet=False) -> list[dict]:
    """One row per (shape, rows, variant of EXPERT_VARIANTS: all unless `variants` names some):
    keys as `bench.stages.bench_gemv`'s rows (stage, shape, rows, variant, BN, KS, PER, L,
    bytes, floor_us, us_bar / frac_bar with a hand-off after each step, us_nobar / frac_nobar
    without, us_gate / frac_gate and us_down / frac_down gate_up and down alone (each with a
    hand-off, against its share of the bytes: activations counted in the whole step's only), rel_err, error, seconds) plus experts (distinct routed experts a step, mean) and
    slots; KS is the gate_up partial count (split-K factor, or the span form's partial slots). `ceiling`: the read ceiling in TB/s, as
    `bench.ceiling.read_ceiling_tbs` returns it (a value in bytes/s is taken as such)."""
    from mono_common.graph_timing import graph_median_us
    from mono_common.ref.moe import moe_over_slots
    from mono_common.stages.moe_host import MoePlan, alloc_buffers, launch_moe, pointer_table, quantise_x

    # TB/s to bytes/s; a ceiling past 1e6 already is bytes/s (no GPU reads a million TB/s)
    bps = ceiling if ceiling > 1e6 else ceiling * 1e12
    gen = torch.Generator(device=dev).manual_seed(0)
    cpu_gen = torch.Generator().manual_seed(0)
    res = []
    for name in shapes or EXPERT_SHAPES:
        H, I, E, K = EXPERT_SHAPES[name]  # noqa: E741
        eb = expert_bytes(H, I)
        gate_share = gate_up_bytes(H, I) / eb  # gate_up's part of an expert's bytes, down the rest
        experts = (_fp8_bits(torch, (E, 2 * I, H), dev, gen),
                   torch.rand((E, -(-2 * I // 128), H // 128), generator=gen, device=dev) * 1e-3 + 1e-4,
                   _fp8_bits(torch, (E, H, I), dev, gen),
                   torch.rand((E, H // 128, -(-I // 128)), generator=gen, device=dev) * 1e-3 + 1e-4)
        for rows in rows_list:
            # routed experts, the shared one, x and its scales in, the output out
            act = rows * H * 2 + rows * (H // 128) * 4 + rows * H * 2
            ids, wts = _steps(torch, E, K, rows, lambda d, eb=eb, act=act: (d + 1) * eb + act, cpu_gen, dev)
            L = ids.shape[0]
            distinct = [ids[li].unique().numel() for li in range(L)]
            nbytes = sum((d + 1) * eb + act for d in distinct) / L
            floor_us = nbytes / bps * 1e6
            # one set of inputs for every variant, so their rows differ by the kernel alone
            shared = x = xq = xs = None
            data_error = None
            try:
                shared = (_fp8_bits(torch, (L, 2 * I, H), dev, gen),
                          torch.rand((L, -(-2 * I // 128), H // 128), generator=gen, device=dev) * 1e-3 + 1e-4,
                          _fp8_bits(torch, (L, H, I), dev, gen),
                          torch.rand((L, H // 128, -(-I // 128)), generator=gen, device=dev) * 1e-3 + 1e-4)
                x = torch.randn((rows, H), generator=gen, device=dev).to(torch.bfloat16)
                xq, xs = quantise_x(x)
            except Exception as e:  # reported on every variant's row, not fatal
                data_error = f"{type(e).__name__}: {e}"[:300]
            for vname in variants or EXPERT_VARIANTS:
                t0 = time.time()
                row = dict(stage="moe_expert", shape=f"{name} {H}x{I} E{E} top{K}", rows=rows, variant=vname,
                           nprog=nprog, L=L, experts=sum(distinct) / L, bytes=nbytes, floor_us=floor_us)
                try:
                    if data_error:
                        raise RuntimeError(data_error)
                    plan = MoePlan.make(H, I, E, K, rows, nprog, **EXPERT_VARIANTS[vname])
                    row.update(BN=plan.BN, KS=plan.KSG, PER=plan.PER if plan.span else 0, slots=plan.NSLOT)
                    bufs = alloc_buffers(plan, L, dev)
                    tab = pointer_table(plan, xq, xs, ids, wts, experts, shared, bufs)
                    if check:
                        launch_moe(plan, xq, xs, ids, wts, experts, shared, 2.5, bufs, tab=tab)
                        uniq = ids[0].unique()
                        sub = tuple(t.index_select(0, uniq.long()).cpu() for t in experts)
                        # the reference on the CPU: a CUDA-side reference is not what is being checked
                        ref = moe_over_slots(x.cpu(), torch.searchsorted(uniq, ids[0]).cpu(), wts[0].cpu(), sub,
                                             tuple(t[0].cpu() for t in shared), 2.5).double()
                        err = ((bufs["out"][0].double().cpu() - ref).norm() / ref.norm()).item()
                        row["rel_err"] = err
                        # e4m3 gate_up MMAs (the spans' default form) accumulate other bits than
                        # the reference's fp32 sums (~1e-4 relative, as the dense GEMVs'); the
                        # SiLU output's e4m3 requantisation then flips a few codes by one step
                        # (1/8 to 1/16 of a value), which the output carries: 6.4e-3 to 8.4e-3
                        # measured (H100, session 38), so twice that. The exact-product forms
                        # follow the reference's sums: 2e-3.
                        bound = 1.6e-2 if plan.span and plan.gate_dot == 2 else 2e-3
                        if not err < bound:
                            row["error"] = f"relative error {err:.3g} vs the CPU reference (bound {bound:g})"
                    # the whole step with and without a hand-off after it, then gate_up alone and
                    # down alone (each with its hand-off; down after the whole steps above, which
                    # left the slot tables and a SiLU output it reads)
                    for tag, b, st, fl in (("bar", True, (0, 2), floor_us), ("nobar", False, (0, 2), floor_us),
                                           ("gate", True, (0, 0), floor_us * gate_share),
                                           ("down", True, (2, 2), floor_us * (1 - gate_share))):
                        def step(xq=xq, xs=xs, ids=ids, wts=wts, ex=experts, sh=shared, bufs=bufs, tab=tab, b=b,
                                 plan=plan, st=st):
                            launch_moe(plan, xq, xs, ids, wts, ex, sh, 2.5, bufs, barrier=b, tab=tab, stages=st)

                        us = graph_median_us(step, 1, replays, warmup=3) / L
                        row[f"us_{tag}"] = us
                        row[f"frac_{tag}"] = fl / us
                    del bufs
                except Exception as e:  # a shape that fails to build or run is reported, not fatal
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                row["seconds"] = round(time.time() - t0, 1)
                res.append(row)
                if not quiet:
                    _print_row(row)
            del shared
        del experts
        torch.cuda.empty_cache()
    return res


def _warm_one(name: str, rows: int, variant: str, nprog: int) -> None:
    import torch

    bench_expert(torch, torch.device("cuda"), nprog, 1.0, 1, shapes=[name], rows_list=(rows,), check=False,
                 variants=[variant], quiet=True)


def warm_expert(nprog: int, workers: int, shapes=None, variants=None, rows_list=(1, 2, 8)) -> None:
    """Compile every (shape, rows, variant) case's kernel in `workers` processes at once (each
    runs its case once, untimed): Triton's disk cache then holds them for the timed run."""
    import concurrent.futures as cf
    import multiprocessing as mp

    cases = [(n, r, v, nprog) for n in shapes or EXPERT_SHAPES for r in rows_list for v in variants or EXPERT_VARIANTS]
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        for f in cf.as_completed([ex.submit(_warm_one, *c) for c in cases]):
            try:
                f.result()
            except Exception as e:  # the timed run reports it per case
                print(f"expert warm-up failed: {type(e).__name__}: {str(e)[:200]}", flush=True)


def _print_row(r):
    if "us_bar" in r:
        print(f"{r['stage']} {r['shape']} rows {r['rows']} {r['variant']} L {r['L']} experts {r['experts']:.1f}: "
              f"{r['us_bar']:7.2f} us ({100 * r['frac_bar']:5.1f} %)  no hand-off {r['us_nobar']:7.2f} us "
              f"({100 * r['frac_nobar']:5.1f} %)  gate_up {r['us_gate']:6.2f} ({100 * r['frac_gate']:4.1f} %)  "
              f"down {r['us_down']:6.2f} ({100 * r['frac_down']:4.1f} %)  floor {r['floor_us']:.2f} us  "
              f"rel_err {r.get('rel_err', float('nan')):.1e} {r.get('error', '')} [{r['seconds']} s]", flush=True)
    else:
        print(f"{r['stage']} {r['shape']} rows {r['rows']} {r.get('variant', '')} FAILED: {r.get('error')}",
              flush=True)
