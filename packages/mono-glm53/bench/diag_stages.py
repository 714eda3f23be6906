"""H200 diagnostics of the GLM-5.3 layer kernel: per-stage GPU times (staged mode, each stage
captured in a CUDA graph), registers/spills of the fused and per-stage binaries, the fused time
(for each --warps, --nprog, --stages, --ks-rule, --forms, --xq-producer and --knobs value, with the
outputs' max difference from the first one's), the fused
launch's own per-stage span/busy/hand-off times from its clock stamps (kernels.stamps),
and (with --fault) a staged run that synchronises after every stage to find a faulting one.

PYTHONPATH=packages/mono-common/src:packages/mono-glm53/src python3 \
    packages/mono-glm53/bench/diag_stages.py --out OUT [--fault tp1:4:4:4096]
"""

import argparse
import json
import os
import sys

import torch

from mono_glm53.config import REAL
from mono_glm53.kernels.harness import build_case, fused_time_us, stage_times_us
from mono_glm53.kernels.layer import GlmLayerKernel
from mono_glm53.kernels.stages import NSTAGES, STAGE_NAMES
from mono_glm53.kernels.stamps import fused_stage_profile
from mono_glm53.reference import LayerCaches
from mono_glm53.weights import make_weights


def _shape(name):
    return REAL.tp_shard(8, 0) if name == "tp8" else REAL


def _regs(k):
    out = {}
    for key, ck in k.compiled.items():
        name = key if isinstance(key, str) else STAGE_NAMES[key]
        out[name] = {"regs": getattr(ck, "n_regs", None), "spills": getattr(ck, "n_spills", None),
                     "shared": getattr(getattr(ck, "metadata", None), "shared", None)}
    return out


def timing(cases, out_dir, warps=(4,), staged=True, nprogs=(None,), stages=(None,), warm_only=False,
           ks_rules=("first",), forms=((None, None),), xqps=(None,), knobs=(("default", {}),)):
    res = []
    weights = {}
    for sname, width, ctx in cases:
        if sname not in weights:
            weights.clear()
            torch.cuda.empty_cache()
            weights[sname] = make_weights(_shape(sname), device="cuda", seed=0)
        s = _shape(sname)
        c = build_case(s, width, ctx, True, "cuda", seed=1, weights=weights[sname])
        first = None
        for nw, npg, nst, ksr, (dstg, fcvt), xqp, (kname, kw) in [
                (nw, npg, nst, ksr, fm, xqp, kn) for kn in knobs for xqp in xqps for fm in forms
                for ksr in ks_rules for nst in stages for npg in nprogs for nw in warps]:
            k = GlmLayerKernel(s, c.w, width, max_seq_len=ctx, indexer=True, num_warps=nw, nprog=npg,
                               num_stages=nst, ks_rule=ksr, down_stages=dstg, fast_cvt=fcvt, xq_producer=xqp,
                               **kw)
            caches = LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
            k.set_inputs(c.hidden, c.residual, c.inputs)
            k.launch(LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone()), "fused")
            torch.cuda.synchronize()
            if warm_only:  # compiled and launched once: the cache holds it for a timing process
                print(f"warm {sname} w{width} ctx{ctx} warps{nw} nprog{k.nprog} stages{nst} ks {ksr} "
                      f"dstg {k.plan.DSTG} fastcvt {k.plan.FASTCVT} xqp {xqp} knobs {kname}", flush=True)
                del k
                continue
            outs = [k.out.float().clone(), k.res_out.float().clone()]
            if first is None:
                first = outs
            diff = max(float((a - b).abs().max()) for a, b in zip(outs, first))
            st = stage_times_us(k, caches) if staged else {}
            fu = fused_time_us(k, caches)
            prof = fused_stage_profile(k, caches)
            k.guard.check()
            r = {"shape": sname, "width": width, "ctx": ctx, "num_warps": nw, "nprog": k.nprog,
                 "num_stages": nst, "ks_rule": ksr, "knobs": kname, "dstg": k.plan.DSTG, "fastcvt": k.plan.FASTCVT, "xq_producer": k.plan.XQP,
                 "plan_ks": [k.plan.KS1, k.plan.KS3, k.plan.KS9, k.plan.KSG],
                 "plan_split": {"KSI": k.plan.KSI, "P1": k.plan.P1, "DSTEP": k.plan.DSTEP},
                 "fused_us": fu,
                 "staged_sum_us": sum(st.values()), "max_abs_vs_first_warps": diff,
                 "stages_us": st, "fused_stamps_us": prof, "resources": _regs(k)}
            print(json.dumps(r), flush=True)
            res.append(r)
            del k
    with open(os.path.join(out_dir, "diag_stages.json"), "w") as f:
        json.dump(res, f, indent=1)


def fault(spec):
    sname, width, rows, ctx = spec.split(":")
    width, rows, ctx = int(width), int(rows), int(ctx)
    s = _shape(sname)
    w = make_weights(s, device="cuda", seed=0)
    c = build_case(s, rows, ctx, True, "cuda", seed=1, weights=w)
    k = GlmLayerKernel(s, w, width, max_seq_len=ctx, indexer=True)
    caches = LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
    k.set_inputs(c.hidden, c.residual, c.inputs)
    for st in range(NSTAGES):
        print(f"stage {st} {STAGE_NAMES[st]} ...", flush=True)
        k.launch(caches, "staged", stages=[st])
        torch.cuda.synchronize()
    print("staged clean; nslot", int(k.nslot.item()), "NSLOT", k.plan.NSLOT, flush=True)
    k.launch(caches, "fused")
    torch.cuda.synchronize()
    k.guard.check()
    print("fused clean", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--fault", default=None)
    ap.add_argument("--cases", default="tp8:2:4096,tp8:2:65536,tp8:8:4096,tp1:2:4096")
    ap.add_argument("--warps", default="4", help="num_warps values to build each case with")
    ap.add_argument("--nprog", default=None,
                    help="grid sizes to build each case with (default: one program per SM), e.g. 132,264")
    ap.add_argument("--stages", default=None,
                    help="num_stages values (software pipelining depth) to build each case with, e.g. 3,5")
    ap.add_argument("--ks-rule", default="first", help="split-K rules to build each case with, e.g. first,balanced")
    ap.add_argument("--forms", default=None,
                    help="(down_stages:fast_cvt) forms to build each case with, e.g. 0:0,3:0,3:1 (default: the device's)")
    ap.add_argument("--xq-producer", default=None,
                    help="1: the q_a/kv_a and q_b GEMVs read producer-quantised inputs (Plan.XQP), 0: they "
                         "quantise in every K block; e.g. 0,1 (default: the device's, on for sm_90)")
    ap.add_argument("--knobs", default=None, metavar="JSON",
                    help='named GlmLayerKernel knob sets to build each case with, e.g. \'{"0.3.12": '
                         '{"gateup_split": 4, "qkva_programs": 0, "index_split": 48, "down_step": 1}, '
                         '"default": {}}\' (default: the plan\'s)')
    ap.add_argument("--warm-only", action="store_true",
                    help="compile and launch each fused variant once, no timing (run several such "
                         "processes in parallel to fill the Triton cache, then time in one)")
    ap.add_argument("--no-staged", action="store_true",
                    help="skip the staged per-stage times (each stage compiles its own binary)")
    a = ap.parse_args(argv)
    if a.fault:
        fault(a.fault)
        return 0
    cases = [(x.split(":")[0], int(x.split(":")[1]), int(x.split(":")[2])) for x in a.cases.split(",")]
    try:
        kj = json.loads(a.knobs) if a.knobs else {"default": {}}
    except json.JSONDecodeError as exc:
        ap.error(f"--knobs is not a JSON object of named knob sets: {exc}")
    if not isinstance(kj, dict) or not kj or not all(isinstance(kw, dict) for kw in kj.values()):
        ap.error("--knobs must map each name to a dict of GlmLayerKernel keyword arguments")
    knobs = tuple(kj.items())
    nprogs = tuple(int(x) for x in a.nprog.split(",")) if a.nprog else (None,)
    stages = tuple(int(x) for x in a.stages.split(",")) if a.stages else (None,)
    timing(cases, a.out, tuple(int(x) for x in a.warps.split(",")), staged=not a.no_staged, nprogs=nprogs,
           stages=stages, warm_only=a.warm_only, ks_rules=tuple(a.ks_rule.split(",")),
           forms=tuple((int(f.split(":")[0]), bool(int(f.split(":")[1]))) for f in a.forms.split(","))
           if a.forms else ((None, None),),
           xqps=tuple(x == "1" for x in a.xq_producer.split(",")) if a.xq_producer else (None,), knobs=knobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
