"""Run one covered layer through the kernel and the torch reference and measure the difference.

Shared by the interp/kernels tests, the demo and the bench: `run_case` builds random weights
and caches (mono_glm53.weights), runs `reference.decoder_layer` on the real rows and the
kernel at `width` (pad rows beyond the real rows), and returns the NUMERICS metrics.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from mono_common.ref.fp8 import fp8_gemm_backend
from mono_glm53 import reference as ref
from mono_glm53.config import GlmLayerShape
from mono_glm53.kernels.layer import GlmLayerKernel, default_nprog, launch_side_by_side
from mono_glm53.kernels.moe_checks import moe_stages
from mono_glm53.weights import make_caches, make_weights

__all__ = ["Case", "build_case", "compare", "run_case", "fenced_case"]


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float((a @ b) / (a.norm() * b.norm()).clamp_min(1e-30))


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||: the error's share of the reference's norm (a cosine cannot see an
    error that scales the whole output; this reads 0.01 for a 1 % scale)."""
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@dataclasses.dataclass
class Case:
    s: GlmLayerShape
    w: dict
    inputs: object
    caches: object
    hidden: torch.Tensor
    residual: torch.Tensor
    prev_topk: torch.Tensor | None
    indexer: bool
    rows: int


def build_case(s: GlmLayerShape, rows: int, ctx: int, indexer: bool = True, device="cpu",
               seed: int = 0, weights=None, ctxs=None) -> Case:
    """`rows` rows of context `ctx` each, or of the contexts `ctxs` (one per row, very
    different ones in one step: row i decodes position ctxs[i] - 1; `ctx` is then their max)."""
    w = weights if weights is not None else make_weights(s, device=device, seed=seed)
    if ctxs is not None:
        if len(ctxs) != rows or min(ctxs) < 1:
            raise ValueError(f"ctxs {ctxs} must give each of the {rows} rows a context >= 1")
        ctx = max(ctxs)
    inputs, caches = make_caches(s, rows, ctx, device=device, seed=seed + 1, index_k=indexer)
    if ctxs is not None:
        # every row's page table holds `ctx` tokens; a shorter row uses its first pages
        lens = torch.tensor(ctxs, dtype=torch.int64, device=device)
        rows_ix = torch.arange(rows, device=device)
        inputs = dataclasses.replace(
            inputs, positions=lens - 1, seq_lens=lens.to(inputs.seq_lens.dtype),
            out_cache_loc=inputs.req_to_token[rows_ix, lens - 1].long())
    g = torch.Generator(device=device).manual_seed(seed + 2)
    hidden = torch.randn(rows, s.hidden, generator=g, device=device).to(torch.bfloat16)
    residual = (torch.randn(rows, s.hidden, generator=g, device=device) * 4).to(torch.bfloat16)
    prev = None
    if not indexer:
        # the previous layer's top-k: a random subset of each row's context (-1 padded)
        k = s.index_topk
        prev = torch.full((rows, k), -1, dtype=torch.int32, device=device)
        for r in range(rows):
            n = ctx if ctxs is None else ctxs[r]
            perm = torch.randperm(n, generator=g, device=device)[: min(k, n)]
            prev[r, : perm.numel()] = perm.to(torch.int32)
    return Case(s, w, inputs, caches, hidden, residual, prev, indexer, rows)


def _cache_copies(c: Case) -> ref.LayerCaches:
    return ref.LayerCaches(kv=c.caches.kv.clone(),
                           index_k=None if c.caches.index_k is None else c.caches.index_k.clone())


def reference_out(c: Case):
    caches = _cache_copies(c)
    out = ref.decoder_layer(c.hidden, c.residual, c.inputs, caches, c.w, c.s,
                            prev_topk=c.prev_topk, run_indexer=c.indexer)
    return out, caches


def kernel_out(c: Case, k: GlmLayerKernel, mode: str, delay: int = 0, copy=None):
    """One launch of `k` on case `c` on copies of its caches (`copy(tensor, name)`, default a
    clone). Returns ((out, res_out, topk) clones, the caches the launch wrote)."""
    copy = copy if copy is not None else (lambda t, name: t.clone())
    caches = ref.LayerCaches(kv=copy(c.caches.kv, "kv_cache"),
                             index_k=None if c.caches.index_k is None else copy(c.caches.index_k, "index_k_cache"))
    k.set_inputs(c.hidden, c.residual, c.inputs)
    if c.prev_topk is not None:
        k.prev_topk.fill_(-1)
        k.prev_topk[: c.rows].copy_(c.prev_topk)
    out, res, topk = k.launch(caches, mode=mode, delay=delay)
    return (out.clone(), res.clone(), topk.clone()), caches


# CPU copies of MLP weights, newest first: (weak references to the device tensors, copies).
# A weak reference identifies its tensor only while that tensor lives, so a freed weight whose
# memory a new one reuses can never hit a stale copy.
_CPU_MLP: list[tuple[list[str], list, dict[str, torch.Tensor]]] = []
_CPU_MLP_BYTES = 40 << 30


def _mlp_on_cpu(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The `mlp.*` weights of `w` on the CPU (copied once per weight set)."""
    import weakref

    keys = sorted(k for k in w if k.startswith("mlp."))
    for names, refs, cpu in _CPU_MLP:
        if names == keys and all(r() is w[k] for r, k in zip(refs, keys)):
            return cpu
    cpu = {k: w[k].cpu() for k in keys}
    _CPU_MLP.insert(0, (keys, [weakref.ref(w[k]) for k in keys], cpu))
    while len(_CPU_MLP) > 1 and sum(t.nbytes for _, _, d in _CPU_MLP for t in d.values()) > _CPU_MLP_BYTES:
        _CPU_MLP.pop()
    return cpu


def moe_on_cpu(h2: torch.Tensor, w: dict[str, torch.Tensor], s: GlmLayerShape):
    """`reference.moe` of the kernel's h2 computed on the CPU, results on h2's device.

    Why the CPU: on the H200 the kernel's MoE equals this CPU reference bit for bit in most
    cases and within fp32 summation-order noise in the rest (0.0041 at worst, session 12:
    numerics.py), while the same reference run on CUDA (exact FP8 GEMMs or torch scaled_mm
    alike) differed from it by 0.017..0.031 relative L2 (session 11): more than a 1 % error
    in a weight scale (the cause was torch's CUDA division by a scalar in the activation
    quantiser, which mono_common.ref.fp8 avoids since 0.1.6; the CPU stays the reference)."""
    with fp8_gemm_backend("exact"):
        out, aux = ref.moe(h2.cpu(), _mlp_on_cpu(w), s)
    return out.to(h2.device), {k: v.to(h2.device) for k, v in aux.items()}


def compare(c: Case, r_out, r_caches, k_out, k_caches, k: GlmLayerKernel | None = None,
            moe_stage_checks: bool = True) -> dict[str, float]:
    """NUMERICS metrics of one launch's outputs against the reference's. `moe_stage_checks`:
    also check each MoE stage given the kernel's own input (`conditioned`); a caller may skip
    them for a launch it proves bit-identical to one already checked (CPU time: two exact
    GEMMs per slot in use)."""
    s, n = c.s, c.rows
    out, res, topk = k_out
    m: dict[str, float] = {}
    if c.indexer:
        # the top-k agreement first: an exact tie at a row's k-th index score may be broken
        # either way (`topk_overlap`), and the attention then reads other tokens, equally
        # right. Where every difference is such a tie (single rank, the kernel object given),
        # the stream and the checks after the attention are against the reference attending
        # over the kernel's own selection (`_reference_on_topk`)
        sets = [(set(int(v) for v in topk[t].tolist() if v >= 0), set(int(v) for v in r_out.topk[t].tolist() if v >= 0))
                for t in range(n)]
        # the reference's scores only where some row's sets differ
        rsc = _ref_index_scores(c, r_caches) if any(a != b for a, b in sets) else None
        ov, swaps = [], []
        for t, (A, B) in enumerate(sets):
            o, sw = topk_overlap(A, B, rsc[t] if rsc is not None else None)
            ov.append(o)
            swaps.append(sw)
        m["glm53_layer.topk.overlap_min"] = min(ov)
        m["glm53_layer.topk.tie_swaps_max"] = float(max(swaps))
        if max(swaps) > 0 and min(ov) == 1.0 and k is not None and k.world == 1:
            r_out = _reference_on_topk(c, topk[:n])
    # The stream is compared on the rows whose routed experts are the reference's: a row
    # where a near-tie of two biased router scores flipped one expert (the router input h2
    # differs by bf16 flips) is instead covered by the checks conditioned on the kernel's own
    # h2 (see `conditioned`); their count is reported as glm53_layer.routing.flipped_rows.
    # Where those checks cannot run (no kernel object, or R > 1 ranks), every row is compared.
    by_h2 = k is not None and k.world == 1
    same = _rows_same_routing(c, r_out, k) if k is not None else list(range(n))
    rows_ok = same if (same or by_h2) else list(range(n))
    if rows_ok:
        m["glm53_layer.hidden.cosine_min"] = min(_cos(out[i], r_out.hidden[i]) for i in rows_ok)
        m["glm53_layer.hidden.rel_l2_max"] = max(_rel_l2(out[i], r_out.hidden[i]) for i in rows_ok)
    m["glm53_layer.routing.flipped_rows"] = float(n - len(same))
    m["glm53_layer.residual.cosine_min"] = _cos(res[:n], r_out.residual)
    m["glm53_layer.residual.rel_l2_max"] = max(_rel_l2(res[i], r_out.residual[i]) for i in range(n))
    loc = c.inputs.out_cache_loc
    kv_k = k_caches.kv.view(-1, s.kv_cache_dim)
    kv_r = r_caches.kv.view(-1, s.kv_cache_dim)
    a, b = kv_k[loc].float(), kv_r[loc].float()
    m["glm53_layer.mla_cache.cosine_min"] = _cos(a, b)
    ulp = b.abs().amax(dim=-1, keepdim=True) * 2.0 ** -8
    m["glm53_layer.mla_cache.max_abs_ulps"] = float(((a - b).abs() / ulp).max())
    orig = c.caches.kv.view(-1, s.kv_cache_dim)
    keep = torch.ones(kv_k.shape[0], dtype=torch.bool, device=kv_k.device)
    keep[loc] = False
    m["glm53_layer.untouched_cache.max_abs"] = float((kv_k[keep].float() - orig[keep].float()).abs().max())
    if c.indexer:
        p, d = s.page, s.index_head_dim
        ik, ir = k_caches.index_k.view(-1, p * (d + 4)), r_caches.index_k.view(-1, p * (d + 4))
        pg, off = loc // p, loc % p
        kb_k = ik[:, : p * d].reshape(-1, p, d)[pg, off]
        kb_r = ir[:, : p * d].reshape(-1, p, d)[pg, off]
        m["glm53_layer.index_k.bytes_equal_min"] = float((kb_k == kb_r).float().mean())
        sc_k = ik[:, p * d:].contiguous().view(torch.float32).view(-1, p)[pg, off]
        sc_r = ir[:, p * d:].contiguous().view(torch.float32).view(-1, p)[pg, off]
        m["glm53_layer.index_k.scale_rel_max"] = float(((sc_k - sc_r).abs() / sc_r.abs()).max())
        dq_k = kb_k.view(torch.float8_e4m3fn).float() * sc_k[:, None]
        dq_r = kb_r.view(torch.float8_e4m3fn).float() * sc_r[:, None]
        m["glm53_layer.index_k.dequant_cosine_min"] = min(_cos(dq_k[i], dq_r[i]) for i in range(n))
        # everything but the new tokens' bytes is untouched
        oik = c.caches.index_k.view(-1, p * (d + 4)).clone()
        kk = ik.clone()
        for t in range(n):
            pp, oo = int(pg[t]), int(off[t])
            kk[pp, oo * d:(oo + 1) * d] = oik[pp, oo * d:(oo + 1) * d]
            kk[pp, p * d + 4 * oo: p * d + 4 * oo + 4] = oik[pp, p * d + 4 * oo: p * d + 4 * oo + 4]
        m["glm53_layer.untouched_cache.max_abs"] = max(
            m["glm53_layer.untouched_cache.max_abs"], float((kk.int() - oik.int()).abs().max()))
    if k is not None and k.world == 1:
        m.update(conditioned(c, r_out, k_out, k_caches, k, moe_stage_checks))
    return m


def _ref_index_scores(c: Case, r_caches) -> torch.Tensor:
    """The reference's index scores [T, max_ctx] (`reference.index_logits` on its own q,
    weights and written index-K cache), which its top-k selected from."""
    s, w = c.s, c.w
    x, _ = ref.input_norm(c.hidden, c.residual, w, s)
    q_lora, _, _ = ref.latent_norms(ref.qkv_a_proj(x, w, s), w, s)
    q8, wts, _ = ref.indexer_qk(x, q_lora, c.inputs.positions, w, s)
    kk, ks = ref.index_k_cache_read(r_caches.index_k, c.inputs, s)
    return ref.index_logits(q8, wts, kk, ks)


def _reference_on_topk(c: Case, sel: torch.Tensor):
    """The reference layer of case c attending over the selection `sel` [T, index_topk] (logical
    positions, -1 padded) instead of its own top-k, on copies of the caches."""
    return ref.decoder_layer(c.hidden, c.residual, c.inputs, _cache_copies(c), c.w, c.s, prev_topk=sel.to(torch.int32),
                             run_indexer=False)


def topk_overlap(kset: set[int], rset: set[int], rscores: torch.Tensor) -> tuple[float, int]:
    """(overlap, tie swaps) of the kernel's top-k positions kset against the reference's rset
    of one row: |kset & rset| / |rset|, where a position only the kernel chose and one only the
    reference chose whose reference scores both equal exactly the reference's k-th score count
    as agreeing (an exact tie: torch.topk breaks it its own way, the kernel by position, and
    either set is the top-k; at a tiny shape's short rows a dozen index scores can be exactly
    0, every head's ReLU zero). Sets of different sizes: 0. The swaps are reported beside.
    rscores [positions] may be None where the sets are equal."""
    if len(kset) != len(rset):
        return 0.0, 0
    if kset == rset:
        return 1.0, 0
    thr = min(float(rscores[i]) for i in rset)
    only_k = sum(1 for i in kset - rset if float(rscores[i]) == thr)
    only_r = sum(1 for i in rset - kset if float(rscores[i]) == thr)
    sw = min(only_k, only_r)
    return (len(kset & rset) + sw) / len(rset), sw


def kernel_experts(k: GlmLayerKernel, rows: int) -> list[set[int]]:
    """Each row's routed experts as the kernel chose them (its slot table scratch)."""
    ns = int(k.nslot.item())
    ex = k.slot_e[1:ns].tolist()
    wt = k.slot_w[:rows, 1:ns].cpu()
    return [{int(ex[u]) for u in range(ns - 1) if float(wt[i, u]) != 0.0} for i in range(rows)]


def _rows_same_routing(c: Case, r_out, k: GlmLayerKernel) -> list[int]:
    ke = kernel_experts(k, c.rows)
    ids = r_out.aux["topk_ids"].tolist()
    return [i for i in range(c.rows) if ke[i] == {int(e) for e in ids[i]}]


def _tie_gap(b: torch.Tensor, kset: set[int], rset: set[int]) -> float:
    """How much worse the kernel's choice is than the reference's under the biased scores b
    of one row: max b over experts only the reference chose minus min b over experts only
    the kernel chose (0 when the sets agree)."""
    if kset == rset:
        return 0.0
    only_r = torch.tensor(sorted(rset - kset), device=b.device)
    only_k = torch.tensor(sorted(kset - rset), device=b.device)
    if only_r.numel() == 0 or only_k.numel() == 0:
        return float("inf")
    return max(0.0, float(b[only_r].max() - b[only_k].min()))


def conditioned(c: Case, r_out, k_out, k_caches, k: GlmLayerKernel, moe_stage_checks: bool = True) -> dict[str, float]:
    """Checks of the kernel's later stages given its OWN upstream values (read from its
    scratch), so an input that differs by a bf16/e4m3 rounding flip upstream cannot hide or
    fake an error downstream:
      * index_q.cosine_min: the kernel's FP8 index q times its head weights against the
        reference's (what enters each score);
      * index_scores.rel_max: the kernel's scores against the reference's index_logits on the
        kernel's q, weights and index-K cache (fp32 summation order only);
      * topk.own_order_violation_max: the kernel's selection is the exact top-k of its own
        scores (no unselected token scores above a selected one);
      * h2.cosine_min: the post-attention norm output (the router/expert input);
      * routing_given_h2.tie_gap_max: the reference's biased top-k on the kernel's h2 picks
        the kernel's experts, up to fp32 ties;
      * moe_given_h2.cosine_min / rel_l2_max: the kernel's layer output against the reference
        MoE run on the kernel's h2 (single rank: no all-reduce in between); the relative error
        catches what a cosine cannot (a wrong weight scale scales the output)."""
    s, n, w = c.s, c.rows, c.w
    m: dict[str, float] = {}
    if c.indexer:
        x, _ = ref.input_norm(c.hidden, c.residual, w, s)
        q_lora, _, _ = ref.latent_norms(ref.qkv_a_proj(x, w, s), w, s)
        q8, wts, _ = ref.indexer_qk(x, q_lora, c.inputs.positions, w, s)
        kq = k.iq8[:n].float() * k.iwt[:n, :, None]
        rq = q8.float() * wts[..., None]
        m["glm53_layer.index_q.cosine_min"] = min(_cos(kq[i], rq[i]) for i in range(n))
        kk, ks = ref.index_k_cache_read(k_caches.index_k, c.inputs, s)
        own = ref.index_logits(k.iq8[:n].to(torch.float8_e4m3fn), k.iwt[:n].clone(), kk, ks)
        rel, viol = 0.0, 0.0
        topk = k_out[2]
        for t in range(n):
            L = int(c.inputs.seq_lens[t])
            ksc = k.scores[t, :L]
            scale = own[t, :L].abs().max().clamp_min(1e-30)
            rel = max(rel, float((ksc - own[t, :L]).abs().max() / scale))
            if L > s.index_topk:
                sel = torch.zeros(L, dtype=torch.bool, device=ksc.device)
                sel[topk[t][topk[t] >= 0].long()] = True
                if int(sel.sum()) != s.index_topk:
                    viol = float("inf")
                    continue
                viol = max(viol, max(0.0, float(ksc[~sel].max() - ksc[sel].min())))
        m["glm53_layer.index_scores.rel_max"] = rel
        m["glm53_layer.topk.own_order_violation_max"] = viol
    x0, res1 = ref.input_norm(c.hidden, c.residual, w, s)
    x2, _ = ref.post_attention_norm(r_out.aux["attn_partial"], res1, w, s)
    h2 = k.h2[:n].clone()
    m["glm53_layer.h2.cosine_min"] = min(_cos(h2[i], x2[i]) for i in range(n))
    # the MoE on the kernel's own h2, referenced on the CPU (moe_on_cpu says why)
    out_c, aux_c = moe_on_cpu(h2, w, s)
    b = aux_c["router_logits"].float().sigmoid() + w["mlp.gate.e_score_correction_bias"].float()[None]
    ke = kernel_experts(k, n)
    ids = aux_c["topk_ids"].tolist()
    m["glm53_layer.routing_given_h2.tie_gap_max"] = max(
        _tie_gap(b[i], ke[i], {int(e) for e in ids[i]}) for i in range(n))
    m["glm53_layer.moe_given_h2.cosine_min"] = min(_cos(k_out[0][i], out_c[i]) for i in range(n))
    m["glm53_layer.moe_given_h2.rel_l2_max"] = max(_rel_l2(k_out[0][i], out_c[i]) for i in range(n))
    # each MoE stage given the kernel's own input to it (moe_checks says why)
    if moe_stage_checks:
        ms, out_d = moe_stages(k, w, s, n, _mlp_on_cpu(w))
        m.update(ms)
        m["glm53_layer.moe_down_given_inter.rel_l2_max"] = max(_rel_l2(k_out[0][i], out_d[i]) for i in range(n))
    return m


def routing_match(c: Case, r_out, k: GlmLayerKernel) -> dict[str, float]:
    """Whether the kernel picked the same routed experts as the reference (a flipped choice
    between two biased scores that tie within fp32 noise explains a low stream cosine)."""
    ids = r_out.aux["topk_ids"]
    ns = int(k.nslot.item())
    kset = set(int(e) for e in k.slot_e[1:ns].tolist())
    rset = set(int(e) for e in ids.flatten().tolist())
    return {"routing.same_expert_set": float(kset == rset), "routing.ref_experts": float(len(rset)),
            "routing.kernel_experts": float(len(kset)), "routing.symdiff": float(len(kset ^ rset))}


def _merge(metrics: dict[str, float], new: dict[str, float]) -> None:
    """Fold `new` into `metrics`, keeping the worst value of each: the least of a *_min metric,
    the largest of any other."""
    for key, v in new.items():
        metrics[key] = v if key not in metrics else (
            min(metrics[key], v) if key.endswith("_min") else max(metrics[key], v))


def run_case(s: GlmLayerShape, width: int, rows: int, ctx: int, indexer: bool = True,
             modes=("staged",), device="cpu", seed: int = 0, nprog: int | None = None,
             delay: int = 0, weights=None, ks_rule: str = "first", ctxs=None,
             knobs: dict | None = None) -> dict[str, float]:
    """Metrics of every mode in `modes` vs the reference (and fused vs staged when both run).
    `ks_rule`: the kernel's split-K rule (`layer._pick_ks`). `ctxs`: one context length per
    row (`build_case`; the kernel is built for the longest). `knobs`: the kernel's
    measurement knobs (`layer.KNOBS`).
    Mode "fused+delay" is the fused launch with random per-program stage delays; it is
    compared bit for bit with "fused" as glm53_layer.delay_vs_fused.max_abs."""
    c = build_case(s, rows, ctx, indexer, device, seed, weights=weights, ctxs=ctxs)
    ctx = int(c.inputs.max_seq_len) if ctxs is not None else ctx
    r_out, r_caches = reference_out(c)
    k = GlmLayerKernel(s, c.w, width, max_seq_len=ctx, indexer=indexer, nprog=nprog, device=device,
                       ks_rule=ks_rule, **(knobs or {}))
    metrics: dict[str, float] = {}
    outs = {}
    for i, mode in enumerate(modes):
        kmode = "fused" if mode == "fused+delay" else mode
        k_out, k_caches = kernel_out(c, k, kmode, delay=delay if mode == "fused+delay" else 0)
        k.guard.check()
        outs[mode] = (k_out, k_caches)
        # the MoE stage checks again only for a launch whose outputs differ from the first's
        first = outs[modes[0]][0]
        same = i > 0 and all(torch.equal(a, b) for a, b in zip(k_out, first))
        _merge(metrics, compare(c, r_out, r_caches, k_out, k_caches, k, moe_stage_checks=not same))
    if "fused" in outs and "staged" in outs:
        (a, ca), (b, cb) = outs["fused"], outs["staged"]
        diff = max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))
        diff = max(diff, float((ca.kv.float() - cb.kv.float()).abs().max()))
        if ca.index_k is not None:
            diff = max(diff, float((ca.index_k.int() - cb.index_k.int()).abs().max()))
        metrics["glm53_layer.fused_vs_staged.max_abs"] = diff
    if "fused" in outs and "fused+delay" in outs:
        (a, ca), (b, cb) = outs["fused"], outs["fused+delay"]
        diff = max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))
        diff = max(diff, float((ca.kv.float() - cb.kv.float()).abs().max()))
        metrics["glm53_layer.delay_vs_fused.max_abs"] = diff
    return metrics


def fenced_case(s: GlmLayerShape, width: int, rows: int, ctx: int, indexer: bool = True,
                modes=("staged",), device="cpu", seed: int = 0, nprog: int | None = None,
                weights=None) -> tuple[dict[str, float], list[str]]:
    """`run_case` with every tensor the kernel touches fenced (`kernels.redzone`): the kernel
    object's buffers, the weights, the caches and the page table each sit between poisoned
    bands. Returns (metrics of every mode vs the reference, the buffers whose bands a launch
    wrote). A read out of bounds shows up in the metrics (NaN), a write in the list."""
    from mono_glm53.kernels.redzone import Fences

    c = build_case(s, rows, ctx, indexer, device, seed, weights=weights)
    r_out, r_caches = reference_out(c)
    f = Fences()
    fw = {n: f.copy(t, "w:" + n) for n, t in c.w.items()}
    inputs = dataclasses.replace(c.inputs, req_to_token=f.copy(c.inputs.req_to_token, "req_to_token"))
    k = GlmLayerKernel(s, fw, width, max_seq_len=ctx, indexer=indexer, nprog=nprog, device=device,
                       alloc=f.alloc)
    f.rename({t.data_ptr(): n for n, t in vars(k).items() if isinstance(t, torch.Tensor)})
    fc = dataclasses.replace(c, w=fw, inputs=inputs)
    metrics: dict[str, float] = {}
    for i, mode in enumerate(modes):
        k_out, caches = kernel_out(fc, k, mode, copy=lambda t, name: f.copy(t, f"{name}{i}"))  # noqa: B023
        k.guard.check()  # synchronises: every band is final
        _merge(metrics, compare(fc, r_out, r_caches, k_out, caches, k))
    return metrics, f.changed()


def run_tp_case(s_full: GlmLayerShape, world: int, width: int, rows: int, ctx: int,
                full_weights=None, device="cuda", seed: int = 0, delay: int = 0,
                expect_stop: bool = False, deadline_s: float = 2.0,
                rank_deadline_s: dict[int, float] | None = None, knobs: dict | None = None) -> dict[str, float]:
    """`world` TP ranks of one layer side by side on ONE GPU: each rank's kernel (its weight
    shard, its copy of the caches, nprog = default_nprog // world programs) runs in one launch
    (`layer.launch_side_by_side`) and the ranks all-reduce inside the kernel through
    `peer.allocate_local` buffers.
    Compared with `reference.decoder_layer_tp`: every rank's metrics as in `compare`, the
    layer output against the reference MoE on the kernel's own h2 summed over the ranks, and
    glm53_layer.tp_ranks_equal.max_abs (every rank must hold the same output bits).

    expect_stop: a fault is injected (MONO_GLM53_FAULT); every rank must stop at its deadline
    or on the abort flag with the error word written: returns {"stopped": 1.0, "message": ...,
    "words": every rank's decoded error word (None where a rank wrote none)} instead of
    metrics (the launch raises: the guard is in report mode, checked after the launch).
    rank_deadline_s: {rank: seconds} for ranks whose waits get another deadline than
    `deadline_s` (a rank that must stop on another rank's abort flag, not on its own clock).
    knobs: GlmLayerKernel's knobs for every rank."""
    from mono_common.errors import MonoDeviceError
    from mono_common.guard_host import Guard, deadline_ticks
    from mono_common.peer import allocate_local
    from mono_glm53.kernels.layer import peer_requests
    from mono_glm53.kernels.stages import STAGE_NAMES
    from mono_glm53.weights import shard_weights

    wf = full_weights if full_weights is not None else make_weights(s_full, device=device, seed=seed)
    shards = [shard_weights(wf, s_full, world, r) for r in range(world)]
    shapes, ws = [x[0] for x in shards], [x[1] for x in shards]
    c = build_case(shapes[0], rows, ctx, True, device, seed, weights=ws[0])
    r_caches = [ref.LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone()) for _ in range(world)]
    r_out = ref.decoder_layer_tp(c.hidden, c.residual, c.inputs, r_caches, ws, shapes)
    grid = default_nprog(device)
    peers = allocate_local(peer_requests(shapes[0], width, world), world, device)
    guard = Guard(world, device=device, deadline_s=deadline_s, mode="report",
                  stage_names=dict(enumerate(STAGE_NAMES)))
    ks = [GlmLayerKernel(shapes[r], ws[r], width, max_seq_len=ctx, indexer=True, nprog=grid // world,
                         device=device, world=world, peers=peers[r], guard=guard, cooperative=False,
                         **(knobs or {}))
          for r in range(world)]
    for r, sec in (rank_deadline_s or {}).items():
        ks[r].deadline = deadline_ticks(sec, guard.clock)
    k_caches = [ref.LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone()) for _ in range(world)]
    for k in ks:
        k.set_inputs(c.hidden, c.residual, c.inputs)
    metrics: dict[str, float] = {}
    first = None  # rank 0's outputs without delays, compared with the delayed launch
    for mode_delay in (0, delay) if delay else (0,):
        torch.cuda.synchronize()
        if expect_stop:
            from mono_common.errors import decode

            try:
                launch_side_by_side(ks, k_caches, delay=mode_delay)
                guard.check()
            except MonoDeviceError as e:
                return {"stopped": 1.0, "message": str(e), "words": [decode(w) for w in guard.words()]}
            return {"stopped": 0.0}
        launch_side_by_side(ks, k_caches, delay=mode_delay)
        torch.cuda.synchronize()
        guard.check()
        outs = [(k.out.clone(), k.res_out.clone(), k.topk.clone()) for k in ks]
        for r in range(world):
            _merge(metrics, compare(c, r_out, r_caches[r], outs[r], k_caches[r], ks[r]))
        eq = max(float((a.float() - b.float()).abs().max()) for o in outs[1:] for a, b in zip(o[:2], outs[0][:2]))
        metrics["glm53_layer.tp_ranks_equal.max_abs"] = max(metrics.get("glm53_layer.tp_ranks_equal.max_abs", 0.0), eq)
        parts = [moe_on_cpu(ks[r].h2[:rows].clone(), ws[r], shapes[r])[0] for r in range(world)]  # as in compare
        moe_c = ref.all_reduce_sum(parts)
        cos = min(_cos(outs[0][0][i], moe_c[i]) for i in range(rows))
        metrics["glm53_layer.moe_given_h2.cosine_min"] = min(metrics.get("glm53_layer.moe_given_h2.cosine_min", 1.0), cos)
        rel = max(_rel_l2(outs[0][0][i], moe_c[i]) for i in range(rows))
        metrics["glm53_layer.moe_given_h2.rel_l2_max"] = max(metrics.get("glm53_layer.moe_given_h2.rel_l2_max", 0.0), rel)
        staged = [moe_stages(ks[r], ws[r], shapes[r], rows, _mlp_on_cpu(ws[r])) for r in range(world)]
        for ms, _ in staged:
            _merge(metrics, ms)
        moe_d = ref.all_reduce_sum([o for _, o in staged])
        _merge(metrics, {"glm53_layer.moe_down_given_inter.rel_l2_max":
                         max(_rel_l2(outs[0][0][i], moe_d[i]) for i in range(rows))})
        if first is not None:
            metrics["glm53_layer.delay_vs_fused.max_abs"] = max(
                float((a.float() - b.float()).abs().max()) for a, b in zip(outs[0], first))
        first = outs[0]
    return metrics


def _capture_fused(k: GlmLayerKernel, caches) -> torch.cuda.CUDAGraph:
    """One eager fused launch (compiles, warms), then the same launch captured in a graph."""
    from mono_common.graph_timing import capture

    k.launch(caches, "fused")
    torch.cuda.synchronize()
    return capture(lambda: k.launch(caches, "fused"))


def replay_check(k: GlmLayerKernel, caches, replay, step_inputs, replays: int, check_every: int,
                 modes=("fused", "staged")) -> dict[str, float]:
    """The staged comparison of a replayed launch: `replays` times, `step_inputs(i)` writes new
    inputs into `k`'s static buffers and `replay()` runs the launch under test (a CUDA graph's
    replay); every `check_every` replays its outputs (out, res_out, topk) are compared bit for
    bit with an eager launch of each mode in `modes` on the same inputs (the eager fused launch
    and the eager staged one: fused, staged and replay must agree to the bit, NUMERICS'
    fused_vs_staged and graph_replay_vs_eager). Returns the worst difference of each and the
    number of checks."""
    worst = {m: 0.0 for m in modes}
    checks = 0
    for i in range(replays):
        step_inputs(i)
        replay()
        if (i + 1) % check_every == 0:
            got = (k.out.clone(), k.res_out.clone(), k.topk.clone())
            for mode in modes:
                k.launch(caches, mode)
                worst[mode] = max(worst[mode], max(float((a.float() - b.float()).abs().max())
                                                   for a, b in zip(got, (k.out, k.res_out, k.topk))))
            checks += 1
    out = {"checks": checks, "replays": replays}
    if "fused" in worst:
        out["glm53_layer.graph_replay_vs_eager.max_abs"] = worst["fused"]
    if "staged" in worst:
        out["glm53_layer.graph_replay_vs_staged.max_abs"] = worst["staged"]
    return out


def graph_replay_check(s: GlmLayerShape, width: int, ctx: int, replays: int = 1000,
                       check_every: int = 100, device="cuda", seed: int = 0, weights=None) -> dict[str, float]:
    """Capture one fused launch in a CUDA graph and replay it `replays` times with new inputs
    (hidden, residual, positions / seq_lens / out_cache_loc alternating between two context
    lengths) written into the static buffers; every `check_every` replays the graph's output
    must equal an eager fused launch AND an eager staged launch on the same inputs bit for bit
    (`replay_check`). Returns {max_abs vs eager fused, vs eager staged, replays, checks}."""
    c = build_case(s, width, ctx, True, device, seed, weights=weights)
    k = GlmLayerKernel(s, c.w, width, max_seq_len=ctx, indexer=True, device=device)
    caches = ref.LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
    k.set_inputs(c.hidden, c.residual, c.inputs)
    g = _capture_fused(k, caches)
    gen = torch.Generator(device=device).manual_seed(seed + 7)
    rtt = c.inputs.req_to_token

    def step_inputs(i):
        n = ctx - (i % 2)  # alternate the context length
        k.x.copy_(torch.randn(width, s.hidden, generator=gen, device=device).bfloat16())
        k.res.copy_(torch.randn(width, s.hidden, generator=gen, device=device).bfloat16())
        k.seqlen.fill_(n)
        k.pos.fill_(n - 1)
        k.loc.copy_(rtt[c.inputs.req_pool_indices, n - 1].long())

    r = replay_check(k, caches, g.replay, step_inputs, replays, check_every)
    torch.cuda.synchronize()
    k.guard.check()
    return r


def captured_table_check(s: GlmLayerShape, width: int, ctx: int, device="cuda", seed: int = 0,
                         weights=None) -> dict[str, float]:
    """A launch whose pointer table is first built while a CUDA graph is being captured (caches
    the kernel object has never seen, so `layer.device_table` copies inside the capture from
    rows the object pinned when it was built): the graph's replay equals an eager launch on a
    copy of the same caches, in
    the outputs and every cache byte. Returns {tables built in the capture, max_abs}."""
    from mono_common.graph_timing import capture

    c = build_case(s, width, ctx, True, device, seed, weights=weights)
    k = GlmLayerKernel(s, c.w, width, max_seq_len=ctx, indexer=True, device=device)
    k.set_inputs(c.hidden, c.residual, c.inputs)
    # kept alive, so the allocator cannot hand its addresses to the fresh caches (the table
    # would then be the cached one, not one built in the capture)
    warm = ref.LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
    k.launch(warm, "fused")
    torch.cuda.synchronize()
    fresh = [ref.LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone()) for _ in range(2)]
    n0 = len(k._tables)
    g = capture(lambda: k.launch(fresh[0], "fused"))
    built = len(k._tables) - n0
    g.replay()
    torch.cuda.synchronize()
    got = [t.clone() for t in (k.out, k.res_out, k.topk)] + [fresh[0].kv, fresh[0].index_k]
    k.launch(fresh[1], "fused")
    torch.cuda.synchronize()
    exp = [k.out, k.res_out, k.topk, fresh[1].kv, fresh[1].index_k]
    worst = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, exp))
    k.guard.check()
    del warm
    return {"tables_built_in_capture": float(built), "glm53_layer.captured_table_vs_eager.max_abs": worst}


def stage_times_us(k: GlmLayerKernel, caches, reps: int = 20) -> dict[str, float]:
    """Per-stage GPU time of the staged launch, in microseconds: each stage's launch captured
    `reps` times in one CUDA graph, the median over 5 replays divided by `reps` (host launch
    cost excluded: with ~130 arguments Triton's launcher alone takes ~100 us a launch).
    Leaves the kernel's counters reset (`GlmLayerKernel.reset_sync`)."""
    from mono_common.graph_timing import capture, replay_us
    from mono_glm53.kernels.stages import NSTAGES, STAGE_NAMES

    k.launch(caches, "staged")
    torch.cuda.synchronize()
    out = {}
    for st in range(NSTAGES):
        g = capture(lambda: k.launch(caches, "staged", stages=[st]), reps)  # noqa: B023 - called now
        out[STAGE_NAMES[st]] = statistics.median(replay_us(g, 5, per=reps, warmup=1))
        del g
    torch.cuda.synchronize()
    k.reset_sync()  # the replays bumped single stages' counters out of step
    return out


def fused_time_us(k: GlmLayerKernel, caches, reps: int = 50) -> float:
    """Median time of one fused launch replayed from a CUDA graph, microseconds."""
    from mono_common.graph_timing import replay_us

    ts = sorted(replay_us(_capture_fused(k, caches), reps))
    return ts[len(ts) // 2]
