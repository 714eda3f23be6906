"""Second H200 pass: routing-match diagnosis of the low stream cosines, and per-stage GPU
times of the staged launch (graph-captured) for TP8 width 2 at ctx 4096 and 65536."""
import json

import torch

from mono_glm53 import reference as ref
from mono_glm53.config import REAL, REAL_INTERLEAVED
from mono_glm53.kernels.harness import (
    build_case,
    compare,
    fused_time_us,
    kernel_out,
    reference_out,
    routing_match,
    stage_times_us,
)
from mono_glm53.kernels.layer import GlmLayerKernel
from mono_glm53.weights import make_weights

for name, s, width, rows, ctx in (("tp8i", REAL_INTERLEAVED.tp_shard(8, 0), 2, 2, 4096),
                                  ("tp8", REAL.tp_shard(8, 0), 8, 8, 1000),
                                  ("tp8", REAL.tp_shard(8, 0), 8, 8, 4096)):
    w = make_weights(s, device="cuda", seed=0)
    c = build_case(s, rows, ctx, True, "cuda", seed=ctx + rows, weights=w)
    r_out, r_c = reference_out(c)
    k = GlmLayerKernel(s, w, width, max_seq_len=ctx, device="cuda")
    k_out, k_c = kernel_out(c, k, "fused")
    m = compare(c, r_out, r_c, k_out, k_c)
    m.update(routing_match(c, r_out, k))
    per_row = [float(torch.nn.functional.cosine_similarity(k_out[0][i].float(), r_out.hidden[i].float(), dim=0)) for i in range(rows)]
    print(json.dumps(dict(case=[name, width, rows, ctx], hidden_cos=m["glm53_layer.hidden.cosine_min"], per_row=per_row,
                          routing={a: b for a, b in m.items() if a.startswith("routing")})), flush=True)
s = REAL.tp_shard(8, 0)
w = make_weights(s, device="cuda", seed=0)
for ctx in (4096, 65536):
    c = build_case(s, 1, ctx, True, "cuda", seed=1, weights=w)
    k = GlmLayerKernel(s, w, 2, max_seq_len=ctx, device="cuda")
    caches = ref.LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
    k.set_inputs(c.hidden, c.residual, c.inputs)
    st = stage_times_us(k, caches)
    print(json.dumps(dict(ctx=ctx, fused_us=round(fused_time_us(k, caches), 2), staged_sum_us=round(sum(st.values()), 2),
                          stages_us={a: round(b, 2) for a, b in st.items()})), flush=True)
