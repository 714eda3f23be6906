"""H200 session 5: first fused launch of a fresh kernel object vs its second launch (same
inputs): how often stage 1's qkva differs, and (MONO_DIAG_DBG=1) what each program saw right
after its stage-1 wait: the stage-0 counter, three hn elements of row 0, and whether the
QKVA, WQKV and SQKV pointers it read from the table match a table the host built (low 32 bits;
the session-5 run recorded the HN-X gap, epoch and ok instead). Usage: diag_vis.py N sname:width:rows:ctx,...
The MONO_DIAG_* switches exist only with results/h200_session5/experiment_flags.patch applied.
Session 6: MONO_VIS_FILL=hn=3.0,qkva=7.0 fills those buffers before every launch, and each fused
launch's qkva is also compared with one staged launch (VISREF, with the values the fused launch
left there): a stage-1 read of a value from before this launch wrote it then shows as a failure
of the second launch too, and a store that never landed as the fill value.
"""

import os
import sys
import time

import diag_cases
import torch

from mono_glm53.kernels.harness import build_case
from mono_glm53.kernels.layer import GlmLayerKernel
from mono_glm53.reference import LayerCaches

n_obj = int(sys.argv[1])
flags = {k: os.environ.get(k) for k in ("MONO_DIAG_DBG", "MONO_DIAG_ACQ", "MONO_DIAG_FENCE", "MONO_DIAG_STAGES")}
for case, s, w, width, rows, ctx in diag_cases.cases(sys.argv[2]):
    c = build_case(s, rows, ctx, True, "cuda", seed=ctx + rows, weights=w)
    t0 = time.time()
    bad = 0
    ref_bad = [0, 0]
    shown = 0
    for i in range(n_obj):
        k = GlmLayerKernel(s, w, width, max_seq_len=ctx, indexer=True, device="cuda")
        k.set_inputs(c.hidden, c.residual, c.inputs)
        got = []
        fill = [b.split("=") for b in os.environ.get("MONO_VIS_FILL", "").split(",") if b]
        for mode in ("fused", "fused", "staged"):
            for b, v in fill:
                getattr(k, b).fill_(float(v))
            caches = LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
            k.launch(caches, mode)
            torch.cuda.synchronize()
            got.append((k.qkva.clone(), k.out.clone(), k.scores[1, 8: 8 + k.nprog * 7].clone().view(k.nprog, 7)))
        k.guard.check()
        for j in range(2):
            nr = got[j][0] != got[2][0]
            if bool(nr.any()):
                ref_bad[j] += 1
                idx = nr.nonzero()
                vals = sorted({round(float(v), 4) for v in got[j][0][nr][:200].tolist()})[:6]
                where = sorted({(int(b[0]), int(b[1])) for b in idx})
                print(f"VISREF {case} obj {i}: fused launch {j} qkva != staged at {int(nr.sum())} entries "
                      f"(split,row) {where[:6]} cols {int(idx[:, 2].min())}..{int(idx[:, 2].max())}, "
                      f"fused values {vals}", flush=True)
        ne = got[0][0] != got[1][0]
        if bool(ne.any()):
            bad += 1
            idx = ne.nonzero()
            # which programs' tiles: tile t = nt * KS1 + ks, program t % nprog
            ks1 = k.plan.KS1
            tiles = sorted({(int(b[2]) // k.plan.BN) * ks1 + int(b[0]) for b in idx})
            progs = sorted({t % k.nprog for t in tiles})
            print(f"VIS {case} obj {i}: qkva differs at {int(ne.sum())} entries, tiles {tiles[:12]}, programs {progs}",
                  flush=True)
            if flags["MONO_DIAG_DBG"] == "1" and shown < 4:
                shown += 1
                d = got[0][2].cpu()
                bits = d.view(torch.int32)
                from mono_glm53.kernels import ptable as P
                host = [h for _, h in k._tables.values()]
                want = {n: {int(h[0, getattr(P, n).value]) & 0xFFFFFFFF for h in host} for n in ("QKVA", "WQKV", "SQKV")}
                for p in sorted(set(progs) | {0, 1}):
                    got_ptr = {n: int(bits[p, j]) & 0xFFFFFFFF for j, n in ((4, "QKVA"), (5, "WQKV"), (6, "SQKV"))}
                    wrong = [n for n in got_ptr if got_ptr[n] not in want[n]]
                    print(f"   prog {p}: cnt {d[p, 0]:.0f} hn[-1] {d[p, 1]:.4f} hn[1536] {d[p, 2]:.4f} "
                          f"hn[4608] {d[p, 3]:.4f} table pointers read wrong: {wrong or 'none'}", flush=True)
                zero = [p for p in range(k.nprog) if float(d[p, 1]) == 0.0 or float(d[p, 3]) == 0.0]
                print(f"   programs that read a zero hn element: {zero[:40]}; min cnt {float(d[:, 0].min()):.0f}",
                      flush=True)
        del k, got
    print(f"VISRATE {case} {flags}: first launch != second {bad}/{n_obj}, "
          f"fused launch 0/1 != staged {ref_bad[0]}/{ref_bad[1]} of {n_obj}, filled {os.environ.get('MONO_VIS_FILL', '')} "
          f"({time.time() - t0:.1f}s)", flush=True)
