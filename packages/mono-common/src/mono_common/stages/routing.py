"""Biased top-k routing of MoE experts (DeepSeek-V3 / GLM-5 style), every program the same bits.

  biased_topk(lg_ptr, bias_ptr, W, BM, E, TOPE, KSR, live=None) -> (wmat [BM, E] fp32, used [E] 0/1):
      router logits summed from KSR split-K partials lg [KSR, W, E] fp32 in slot order, fp32
      sigmoid scores, top-TOPE of score + bias (ties to the lowest expert id), the selected
      unbiased scores renormalised; wmat holds each row's weight per expert (0 unselected),
      used marks the experts any real row selected. BM: W rounded up to a power of two.
      live [BM] (optional): which of the W rows are real; the others (a decode step's pad
      rows) get no weights and mark no expert used, so no expert is computed for them alone.
References: SGLang's biased_topk_impl (mono_glm53.reference.biased_topk).
"""

import triton
import triton.language as tl

from mono_common.stages.numerics import div_rn


@triton.jit
def biased_topk(lg_ptr, bias_ptr, W: tl.constexpr, BM: tl.constexpr, E: tl.constexpr,
             TOPE: tl.constexpr, KSR: tl.constexpr, live=None):
    # BM here is W rounded up to a power of two (a [16, 256] tile set would spill)
    """biased_topk: fp32 sigmoid, top-TOPE of score + bias, renormalised unbiased scores.

    Returns (wmat [BM, E]: each row's weight per expert, 0 when unselected; used [E] 0/1).
    live: [BM] bool, the real rows (None: the first W)."""
    rows = tl.arange(0, BM)
    rmask = rows < W
    if live is not None:
        rmask = rmask & live
    e = tl.arange(0, E)
    bias = tl.load(bias_ptr + e)
    # The partials' loads in groups of G unrolled (G * BM * E <= 4096 values: ~32 registers a
    # thread at 4 warps), the adds in slot order: a runtime loop stayed a loop of one load and
    # one wait an iteration (sm_90 TTGIR, Triton 3.8: no async copies), KSR memory round trips
    # in front of every program's routing.
    G: tl.constexpr = max(1, min(KSR, 4096 // (BM * E)))
    FULL: tl.constexpr = KSR - KSR % G
    base = lg_ptr + rows[:, None] * E + e[None, :]
    lg = tl.zeros([BM, E], tl.float32)
    for k0 in range(0, FULL, G):
        for g in tl.static_range(G):
            lg += tl.load(base + (k0 + g) * (W * E), mask=rmask[:, None], other=0.0)
    for g in tl.static_range(KSR % G):
        lg += tl.load(base + (FULL + g) * (W * E), mask=rmask[:, None], other=0.0)
    sc = tl.sigmoid(lg)
    b = sc + bias[None, :]
    # One max a pick over a key that orders by score + bias, then by the lower expert id: the
    # float's bits made order-preserving as int32, above E - 1 - e. A max and then a min of the
    # tied ids were two dependent cross-warp reductions a pick, and the 8 picks cost ~9.5 us of
    # every program at 2 rows (the routing alone, H200 stamps, session 14).
    bits = b.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = (ordered.to(tl.int64) << 32) | (E - 1 - e)[None, :].to(tl.int64)
    sel = tl.zeros([BM, E], tl.int32)
    for _k in range(TOPE):
        mx = tl.max(tl.where(sel == 0, key, -(2 ** 63)), 1)
        sel = tl.where(key == mx[:, None], 1, sel)
    wsel = tl.where(sel != 0, sc, 0.0)
    den = tl.sum(wsel, 1) + 1e-20
    wmat = div_rn(wsel, den[:, None] + tl.zeros_like(wsel))
    wmat = tl.where(rmask[:, None], wmat, 0.0)
    used = tl.max(tl.where(rmask[:, None], sel, 0), 0)
    return wmat, used
