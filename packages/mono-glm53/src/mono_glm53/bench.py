"""`mono bench glm53`: time GLM-5.3 MoE decode layers at real shapes on random weights.

For each shape (the whole layer at TP1, and one rank's shard at TP8), context (4096, 65536)
and width (1..8 rows, one request each), every registered *path* runs a ROTATION of `--layers`
distinct layers (default 4: each its own random weights and caches, one after another, as a
served step runs its 75 layers, so no layer finds the previous one's weights in the 50 MB L2);
the rotation is captured in one CUDA graph and a layer's time is the median graph replay over
the layer count. Beside it: the path's kernels per layer (one profiled replay), the floor
(bytes a layer must read over the read ceiling measured in the same run,
`mono_common.bench.ceiling`; the nominal 4.25 TB/s on the CPU), the fraction of the floor
reached (floor time / measured time) and, for a path whose step can stamp itself (the
monokernel), each stage's in-kernel span measured in the same rotation (`stamps_us`).

Bytes that must be read (activations neglected):
* this rank's weights: every non-expert FP8 weight + its scales, the bf16 tensors used
  (norms, router, w_kc/w_vc, index weights), the shared expert, and the routed experts the
  batch actually selects: the distinct expert ids of that run's routing (random weights route
  ~uniformly, so this is close to E * (1 - (1 - k/E) ** rows));
* per row: the sparse attention's KV, min(ctx, 2048) x 576 x 2 bytes, and the indexer's
  index-K, ctx x 132 bytes.

Paths. `PATHS` maps a name to a builder `builder(case) -> step`, where `step()` runs one
decode layer on `case`'s static buffers (so it can be graph-captured). "unfused" is the
reference (`reference.decoder_layer`) run op by op on CUDA: FP8 GEMMs through torch's
block-scaled `scaled_mm` (1x128 activation / 128x128 weight scales, DeepGEMM's recipe) where
a startup probe shows it runs and agrees with the fp32 dequantised GEMM (activation rows are
zero-padded to a multiple of 4, which cuBLAS needs), else through that fp32 GEMM (on the H200
with torch 2.11 only the TP8 expert down projection, K = 256, falls back). The routed experts
gather each (row, slot)'s expert weights and loop over slots, so the unfused kernel count
grows with the width. A kernel adds itself with `register_path("mono", builder)`: the builder
gets a `BenchCase` and returns a zero-argument step that must be CUDA-graph capturable; the
step may carry `check()` (called after timing), `profile(steps)` (per-stage spans of a
rotation of such steps, in microseconds) and `chain(next_step)` (told which step follows it in
the rotation, before timing).

`--base TREE` times another checkout's monokernel beside "mono" in the same run; `--knobs JSON`
times named sets of the monokernel's measurement knobs (`kernels.layer.KNOBS`) the same way, and
the side-by-side tables say whether each set's outputs are mono's bits (`out_digest`).

The TP8 shard runs one rank alone: its all-reduce points are identity (no collective time).
The GPU machine has no sglang: this module imports none.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mono_common.ref import fp8 as fp8_mod

from .config import SHAPE_NAMES, GlmLayerShape, named_shape
from .reference import DecodeInputs, LayerCaches, decoder_layer
from .weights import make_caches, make_weights, weight_bytes

__all__ = ["BenchCase", "PATHS", "register_path", "floor_bytes", "main", "HBM_BYTES_PER_S"]

HBM_BYTES_PER_S = 4.25e12  # H200 device-to-device copy, read + write (facts.md): the CPU runs' nominal floor


@dataclass
class BenchCase:
    """Everything a path needs for one (shape, context, width) point; buffers are static."""

    shape: GlmLayerShape
    weights: dict[str, torch.Tensor]
    inputs: DecodeInputs
    caches: LayerCaches
    hidden: torch.Tensor
    residual: torch.Tensor
    context: int
    width: int


PathBuilder = Callable[[BenchCase], Callable[[], object]]
PATHS: dict[str, PathBuilder] = {}


def register_path(name: str, builder: PathBuilder) -> None:
    """Add a path to the table (e.g. the monokernel: `register_path("mono", build_mono)`)."""
    PATHS[name] = builder


def _unfused(case: BenchCase) -> Callable[[], object]:
    def step():
        return decoder_layer(case.hidden, case.residual, case.inputs, case.caches, case.weights, case.shape)

    return step


register_path("unfused", _unfused)


def floor_bytes(case: BenchCase, distinct_experts: int) -> dict[str, int]:
    s = case.shape
    w = weight_bytes(case.weights, s, distinct_experts)
    kv = case.width * min(case.context, s.index_topk) * s.kv_cache_dim * 2
    ik = case.width * case.context * s.index_k_token_bytes
    return {"weights": w, "kv": kv, "index_k": ik, "total": w + kv + ik}


def served_inputs(inp: DecodeInputs, served: int, page: int) -> DecodeInputs:
    """`inp` as a server of context length `served` holds it: the page table's rows (and so
    the kernels' score rows and tile counts) `served` tokens wide, rounded up to whole pages;
    the columns past each row's tokens point at the padding slot 0, as SGLang's do."""
    width = -(-served // page) * page
    if width < inp.req_to_token.shape[1]:
        raise ValueError(f"a served context of {served} is shorter than the rows' {inp.req_to_token.shape[1]} tokens")
    rtt = torch.zeros(inp.req_to_token.shape[0], width, dtype=inp.req_to_token.dtype, device=inp.req_to_token.device)
    rtt[:, : inp.req_to_token.shape[1]] = inp.req_to_token
    return dataclasses.replace(inp, req_to_token=rtt, max_seq_len=width)


def _sub_inputs(inp: DecodeInputs, n: int) -> DecodeInputs:
    return DecodeInputs(
        positions=inp.positions[:n].clone(),
        seq_lens=inp.seq_lens[:n].clone(),
        req_pool_indices=inp.req_pool_indices[:n].clone(),
        out_cache_loc=inp.out_cache_loc[:n].clone(),
        req_to_token=inp.req_to_token,
        max_seq_len=inp.max_seq_len,
    )


def _count_kernels(fn: Callable[[], object]) -> int | None:
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        n = 0
        for e in prof.events():
            if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
                name = e.name.lower()
                if "memcpy" in name or "memset" in name:
                    continue
                n += 1
        return n
    except Exception as exc:  # profiler unavailable: report no count rather than a wrong one
        print(f"kernel count failed: {exc}", file=sys.stderr)
        return None


def _chain(steps: list) -> None:
    """Tell each step that has a `chain(next)` which step runs after it in the rotation (the
    last: the first, as the next replay runs it)."""
    for cur, nxt in zip(steps, steps[1:] + steps[:1]):
        if hasattr(cur, "chain"):
            cur.chain(nxt)


def _rotation(steps: list) -> Callable[[], list]:
    """One step running every layer's step in order (a rotation), with their checks."""
    def step():
        return [s() for s in steps]

    checks = [s.check for s in steps if hasattr(s, "check")]
    if checks:
        step.check = lambda: [c() for c in checks]
    return step


def _distinct_experts(out) -> int | None:
    if hasattr(out, "aux") and "topk_ids" in out.aux:
        return int(torch.unique(out.aux["topk_ids"]).numel())
    return None


def _time_path(steps: list, device: str, warmup: int, replays: int) -> dict[str, object]:
    """Time a rotation of `steps` (one a layer); times and kernel counts are per layer."""
    step = _rotation(steps)
    n = len(steps)
    outs = step()  # eager: probes the FP8 GEMM backend per shape, fills lazy caches
    step()
    res: dict[str, object] = {}
    experts = [_distinct_experts(o) for o in outs]
    if all(e is not None for e in experts):
        res["distinct_experts_per_layer"] = experts
    if device != "cuda":
        ts = []
        for _ in range(replays):
            t0 = time.perf_counter()
            step()
            ts.append((time.perf_counter() - t0) * 1e6 / n)
        res.update(us=statistics.median(ts), kernels=None, kernels_eager=None)
        return res
    torch.cuda.synchronize()
    kernels_eager = _count_kernels(step)
    from mono_common.graph_timing import capture, replay_us

    graph = capture(step, warm=1)
    ts = [x / n for x in replay_us(graph, replays, warmup=warmup)]
    kernels_graph = _count_kernels(graph.replay)
    torch.cuda.synchronize()
    if hasattr(step, "check"):
        step.check()  # a path with guarded waits: no wait may have expired while timed

    def per(k):
        return None if k is None else k / n

    res.update(
        us=statistics.median(ts),
        us_min=min(ts),
        kernels=per(kernels_graph if kernels_graph else kernels_eager),
        kernels_graph=per(kernels_graph),
        kernels_eager=per(kernels_eager),
    )
    del graph
    return res


def _shapes(names: list[str], use_tiny: bool) -> dict[str, GlmLayerShape]:
    # tiny has 4 heads: its widest shard is TP4, benchmarked under the "tp8" names
    return {n: named_shape(n, use_tiny) for n in names}


def _plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        print(f"no plot: {exc}", file=sys.stderr)
        return
    keys = sorted({(r["shape"], r["context"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
    for ax, (shape, ctx) in zip(axes[0], keys):
        sel = [r for r in rows if r["shape"] == shape and r["context"] == ctx]
        for name in sorted({r["path"] for r in sel}):
            pts = sorted((r["width"], r["us"]) for r in sel if r["path"] == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        fl = sorted({(r["width"], r["floor_us"]) for r in sel})
        ceil = sel[0].get("ceiling_tbs", HBM_BYTES_PER_S / 1e12)
        ax.plot([p[0] for p in fl], [p[1] for p in fl], "k--", label=f"floor ({ceil:.2f} TB/s)")
        ax.set_title(f"GLM-5.3 layer {shape}, ctx {ctx}")
        ax.set_xlabel("rows (width)")
        ax.set_ylabel("us per layer")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _table(rows: list[dict]) -> str:
    head = f"{'shape':5} {'ctx':>6} {'w':>2} {'path':8} {'us':>9} {'kern':>5} {'floor_us':>9} {'frac':>6} {'experts':>7} {'MB':>8}"
    lines = [head]
    for r in rows:
        k = r.get("kernels")
        lines.append(
            f"{r['shape']:5} {r['context']:>6} {r['width']:>2} {r['path']:8} {r['us']:>9.1f} "
            f"{(f'{k:.0f}' if k is not None else '-'):>5} {r['floor_us']:>9.1f} {r['fraction']:>6.3f} "
            f"{r['distinct_experts']:>7.1f} {r['bytes']['total'] / 1e6:>8.1f}"
        )
        if r.get("stamps_us"):
            lines.append("      stamps (us): " + " ".join(f"{n} {v:.1f}" for n, v in r["stamps_us"].items()))
    return "\n".join(lines)


def _bases(spec: str) -> dict[str, str]:
    """'[NAME=]TREE,...' -> {name: tree}; one unnamed tree is 'base', several 'base1', 'base2'..."""
    items = [x for x in spec.split(",") if x]
    out: dict[str, str] = {}
    for i, item in enumerate(items):
        name, _, tree = item.rpartition("=")
        name = name or ("base" if len(items) == 1 else f"base{i + 1}")
        if name in out:
            raise SystemExit(f"--base names {name!r} twice")
        out[name] = tree
    return out


def _side_by_side(rows: list[dict], new: str = "mono", old: str = "base") -> str:
    """Per point, the kernel before (`old`) and now (`new`): times, floor fractions, speedup, and
    whether their outputs are the same bits (both paths' digests, where both have one)."""
    by = {(r["shape"], r["context"], r["width"], r["path"]): r for r in rows}
    lines = [f"{'shape':5} {'ctx':>6} {'w':>2} {old + ' us':>9} {new + ' us':>9} {'floor':>7} "
             f"{'x floor':>8} {'speedup':>7} {'bits':>5}"]
    for (sh, ctx, w, p), r in by.items():
        b = by.get((sh, ctx, w, old))
        if p != new or b is None:
            continue
        same = "-" if not (r.get("out_digest") and b.get("out_digest")) else (
            "same" if r["out_digest"] == b["out_digest"] else "DIFF")
        lines.append(f"{sh:5} {ctx:>6} {w:>2} {b['us']:>9.1f} {r['us']:>9.1f} {r['floor_us']:>7.1f} "
                     f"{r['us'] / r['floor_us']:>7.2f}x {b['us'] / r['us']:>6.2f}x {same:>5}")
    return "\n".join(lines) if len(lines) > 1 else ""


def _knob_sets(ap, spec: str) -> dict[str, dict]:
    """--knobs JSON -> {name: {knob: value}}, every knob name one of `layer.KNOBS` or
    `layer.MEASUREMENT_KWARGS` (all the unknown ones refused at once)."""
    from mono_glm53.kernels.layer import KNOBS, MEASUREMENT_KWARGS

    try:
        sets = json.loads(spec)
    except json.JSONDecodeError as exc:
        ap.error(f"--knobs is not JSON: {exc}")
    if not isinstance(sets, dict) or not all(isinstance(v, dict) for v in sets.values()):
        ap.error("--knobs must map each name to an object of knob names and values")
    known = set(KNOBS) | set(MEASUREMENT_KWARGS)
    unknown = sorted({f"{n}.{k}" for n, v in sets.items() for k in v if k not in known})
    if unknown:
        ap.error(f"--knobs: unknown knobs {unknown} (known: {sorted(known)})")
    return sets


def _meta(a, argv, t_start, ceiling_tbs: float, bases: dict[str, str]) -> dict:
    return dict(
        device=torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        torch=torch.__version__,
        fp8_gemm=a.fp8_gemm,
        scaled_mm_variant=fp8_mod.scaled_mm_variant(),
        scaled_mm_shapes={str(k): v for k, v in fp8_mod._SCALED_MM_OK.items()},
        ceiling_tbs=ceiling_tbs,
        layers=a.layers,
        tiny=a.tiny,
        seconds=time.time() - t_start,
        command="python -m mono_glm53.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        bases=bases,
    )


def _write(out: str, meta: dict, rows: list[dict], errors: list[dict]) -> None:
    with open(os.path.join(out, "glm53_bench.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows, errors=errors), f, indent=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mono bench glm53", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-glm53", help="folder for glm53_bench.json/.png")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny config (CPU smoke test)")
    ap.add_argument("--widths", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--contexts", default=None, help="default 4096,65536 (tiny: 64,256)")
    # the default: what a served GLM-5.x checkpoint launches (its indexer rope interleaved)
    ap.add_argument("--shapes", default="tp1i,tp8i",
                    help=f"comma list of {', '.join(SHAPE_NAMES)} (an 'i': the GLM-5.x checkpoints' interleaved "
                         "indexer rope, SGLang's fused indexer path, the default; without: the HF default's, with "
                         "the Hadamard)")
    ap.add_argument("--paths", default=None, help="comma list of PATHS names (default all)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--fp8-gemm", default="auto", choices=("auto", "exact", "scaled_mm"))
    ap.add_argument("--seed", type=int, default=None, help="default: fresh random weights")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop starting new points after this")
    ap.add_argument("--layers", type=int, default=4,
                    help="distinct layers (weights and caches) a timed rotation runs, one after another")
    ap.add_argument("--no-stamps", action="store_true", help="skip the per-stage stamped spans")
    ap.add_argument("--served-context", type=int, default=None, metavar="N",
                    help="build the kernels for a server whose context length is N (its page table and "
                         "score rows N wide; default: each point's own context), as a served step runs "
                         "short contexts on kernels built for the longest")
    ap.add_argument("--base", default=None, metavar="[NAME=]TREE,...",
                    help="also time the monokernel of each checkout TREE (its packages/*/src folders, e.g. "
                         "a git archive of an earlier commit) as path NAME (default 'base'), beside 'mono' "
                         "in this run")
    ap.add_argument("--knobs", default=None, metavar="JSON",
                    help="named sets of the monokernel's measurement knobs, each timed as a path of its "
                         "name beside 'mono' in this run: '{\"tk6\": {\"hist_in_scores\": false}}' "
                         "(mono_glm53.kernels.layer.KNOBS and MEASUREMENT_KWARGS)")
    a = ap.parse_args(argv)
    bad = [n for n in a.shapes.split(",") if n not in SHAPE_NAMES]
    if bad:
        ap.error(f"--shapes {','.join(bad)}: not a shape; the shapes are {', '.join(SHAPE_NAMES)}")
    knob_sets = _knob_sets(ap, a.knobs) if a.knobs else {}
    if a.layers < 1:
        ap.error(f"--layers {a.layers}: a rotation needs at least one layer")
    if a.served_context is not None and a.served_context < 1:
        ap.error(f"--served-context {a.served_context}: a context length is at least 1")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device; use --device cpu --tiny")
    fp8_mod.set_fp8_gemm_backend(a.fp8_gemm)
    if a.device == "cuda" and "mono" not in PATHS:
        # The monokernel column: the fused launch (CPU runs would need the interpreter).
        # Registered here, not through bench_path.register(): under `python -m` this module
        # is __main__, and bench_path would fill a second copy's PATHS.
        from mono_glm53.kernels.bench_path import build_mono

        register_path("mono", build_mono)
    bases = _bases(a.base) if a.base else {}
    if bases:
        if a.device != "cuda":
            ap.error("--base times a monokernel: it needs --device cuda")
        clash = sorted(set(bases) & set(PATHS))
        if clash:
            ap.error(f"--base names {clash} are taken by the bench's own paths: name the trees otherwise")
        from mono_glm53.kernels.bench_path import side_builder

        for name, tree in bases.items():
            register_path(name, side_builder(tree))
    if knob_sets:
        if a.device != "cuda":
            ap.error("--knobs times the monokernel: it needs --device cuda")
        clash = sorted(set(knob_sets) & (set(PATHS) | set(bases)))
        if clash:
            ap.error(f"--knobs names {clash} are taken by other paths: name the sets otherwise")
        from mono_glm53.kernels.bench_path import knob_builder

        for name, knobs in knob_sets.items():
            register_path(name, knob_builder(knobs))
    widths = [int(x) for x in a.widths.split(",")]
    contexts = [int(x) for x in (a.contexts or ("64,256" if a.tiny else "4096,65536")).split(",")]
    paths = a.paths.split(",") if a.paths else list(PATHS)
    paths += [n for n in list(bases) + list(knob_sets) if n not in paths]
    if "unfused" in paths:
        paths = ["unfused"] + [p for p in paths if p != "unfused"]
    os.makedirs(a.out, exist_ok=True)
    rows: list[dict] = []
    errors: list[dict] = []
    t_start = time.time()
    if a.device == "cuda":
        from mono_common.bench.ceiling import read_ceiling_tbs

        ceiling_tbs = read_ceiling_tbs()
        print(f"read ceiling {ceiling_tbs:.2f} TB/s (measured in this run)", flush=True)
    else:
        ceiling_tbs = HBM_BYTES_PER_S / 1e12
    for sname, s in _shapes(a.shapes.split(","), a.tiny).items():
        t0 = time.time()
        ws = [make_weights(s, device=a.device, seed=None if a.seed is None else a.seed + i) for i in range(a.layers)]
        print(f"[{sname}] {a.layers} layers' weights on {a.device} in {time.time() - t0:.1f}s", flush=True)
        for ctx in contexts:
            if a.served_context is not None and a.served_context < ctx:
                print(f"[{sname}] ctx {ctx} is longer than --served-context {a.served_context}: skipped", flush=True)
                continue
            inp_all, caches0 = make_caches(s, max(widths), ctx, device=a.device, seed=a.seed)
            if a.served_context is not None:
                inp_all = served_inputs(inp_all, a.served_context, s.page)
            # every layer its own caches (the same step's rows read each layer's own KV)
            layer_caches = [caches0] + [
                LayerCaches(kv=caches0.kv.clone(),
                            index_k=None if caches0.index_k is None else caches0.index_k.clone())
                for _ in range(a.layers - 1)]
            g = torch.Generator(device=a.device)
            g.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1))
            hid_all = torch.randn(max(widths), s.hidden, device=a.device, generator=g).bfloat16()
            res_all = torch.randn(max(widths), s.hidden, device=a.device, generator=g).bfloat16()
            for width in widths:
                cases = [BenchCase(
                    shape=s,
                    weights=ws[i],
                    inputs=_sub_inputs(inp_all, width),
                    caches=layer_caches[i],
                    hidden=hid_all[:width].clone(),
                    residual=res_all[:width].clone(),
                    context=ctx,
                    width=width,
                ) for i in range(a.layers)]
                # Paths that return no routing (the monokernel) share the floor of the same
                # cases: same inputs and weights, so the same experts are read.
                case_experts = None
                for pname in paths:
                    if a.max_seconds and time.time() - t_start > a.max_seconds:
                        print(f"time budget reached, skipping {sname} ctx {ctx} w {width} {pname}")
                        continue
                    try:
                        steps = [PATHS[pname](c) for c in cases]
                        _chain(steps)
                        r = _time_path(steps, a.device, a.warmup, a.replays)
                        if hasattr(steps[0], "kernel"):
                            from mono_glm53.kernels.bench_path import output_digest

                            r["out_digest"] = output_digest(steps[0], width)
                        if not a.no_stamps and a.device == "cuda" and hasattr(steps[0], "profile"):
                            r["stamps_us"] = steps[0].profile(steps)
                    except Exception as exc:  # keep the other points; the row records the error
                        print(f"FAILED {sname} ctx {ctx} w {width} {pname}: {exc!r}", flush=True)
                        errors.append(dict(shape=sname, context=ctx, width=width, path=pname, error=repr(exc)))
                        continue
                    ne = r.pop("distinct_experts_per_layer", case_experts)
                    if ne is None:
                        raise RuntimeError(f"path {pname!r} reports no routing: put 'unfused' before it in --paths")
                    case_experts = ne
                    # a layer's floor: the mean over the rotation's layers (each reads its own experts)
                    fbs = [floor_bytes(c, e) for c, e in zip(cases, ne)]
                    fb = {k: sum(f[k] for f in fbs) // len(fbs) for k in fbs[0]}
                    floor_us = fb["total"] / (ceiling_tbs * 1e12) * 1e6
                    row = dict(
                        shape=sname,
                        tp_size=s.tp_size,
                        context=ctx,
                        served_context=inp_all.max_seq_len,
                        width=width,
                        path=pname,
                        layers=a.layers,
                        bytes=fb,
                        floor_us=floor_us,
                        ceiling_tbs=ceiling_tbs,
                        fraction=floor_us / r["us"],
                        distinct_experts=statistics.mean(ne),
                        **r,
                    )
                    rows.append(row)
                    print("\n".join(_table([row]).splitlines()[1:]), flush=True)
                    _write(a.out, _meta(a, argv, t_start, ceiling_tbs, bases), rows, errors)
                    del steps
                if a.device == "cuda":
                    torch.cuda.empty_cache()
            del caches0, layer_caches
        del ws
        if a.device == "cuda":
            torch.cuda.empty_cache()
    meta = _meta(a, argv, t_start, ceiling_tbs, bases)
    _write(a.out, meta, rows, errors)
    _plot(rows, os.path.join(a.out, "glm53_bench.png"))
    print(_table(rows))
    for name, tree in bases.items():
        print(f"side by side ({tree} as {name!r}):\n" + _side_by_side(rows, old=name))
    for name, knobs in knob_sets.items():
        print(f"side by side (knobs {name!r}: {knobs}):\n" + _side_by_side(rows, new=name, old="mono"))
    print(json.dumps({k: meta[k] for k in ("device", "torch", "fp8_gemm", "scaled_mm_variant", "seconds")}))
    for e in errors:
        print("error:", e)
    print("scaled_mm per (M,N,K,block):", meta["scaled_mm_shapes"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
