"""Host side of the small standalone stages: buffers and launches of `stages.entries`' entries.

    topk = run_topk(scores [W, L] fp32, seqlen [W] int32, k, nprog[, first_tile])   # [W, k] int32
    w, used = run_routing(logits [W, E], bias [E], top_k[, live [W]])  # [W, E] fp32, [E] int32
    run_rmsnorm(x [W, D] fp32, weight [D] bf16, eps) / run_rope(x [W, RD] fp32, pos [W], cs, neox)
    run_hadamard(x [W, D] fp32, scale)
The radix top-k runs its six stages as six launches (what the layer's staged mode does; a fused
layer links them by hand-offs). torch is imported inside the functions.
"""

from __future__ import annotations


def run_topk(scores, seqlen, k: int, nprog: int, first_tile: int = 0, rt: bool = False, short: int = 0,
             once: bool = False, row: int = 0, row_hist: bool = False, spread: int = 0, rk: int = 0,
             select: bool = False):
    """first_tile > 0: the first radix pass as a producer of the scores runs it, over tiles of
    that many scores (`topk.topk_hist_first`), instead of its own stage. rt: the radix passes
    with their pass number at runtime (`topk.topk_hist` RT, as a loop over the passes runs it).
    short > 0 (a power of two): rows of at most that many tokens counted by the write stage
    (`topk` SHORT); the count stage is not launched when no row is longer. once: a program's
    tiles a contiguous run, a row's threshold digits derived once a run (`topk` ONCE; not
    with rt). row > 0 (a power of two): where no row has more than that many tokens, one
    launch of one program a row (`topk.topk_rows_one`) instead of the six stages; row_hist: its
    search seeded by radix pass 0's histograms, that pass launched first (`topk_row` HIST).
    spread > 0 (a power of two): where no row has more than that many tokens, radix pass 0 with
    the fine histograms, then the spread form's two stages (`topk.topk_spread_threshold` /
    `topk_spread_write`, rk keys a tile: `topk.spread_keys` when 0) instead of the six; select:
    its threshold and write as one stage (`topk.topk_spread_select`)."""
    import torch

    from mono_common.stages.entries import topk_entry, topk_first_entry
    from mono_common.stages.topk import TKC, TKH_ROW

    W, L = scores.shape
    nck = -(-L // TKC.value)
    tkh = torch.zeros(W, TKH_ROW.value, dtype=torch.int32, device=scores.device)
    tkc = torch.zeros(W, nck, 2, dtype=torch.int32, device=scores.device)
    topk = torch.full((W, k), -1, dtype=torch.int32, device=scores.device)
    if spread and int(seqlen.max()) <= spread:
        from mono_common.stages.entries import topk_spread_entry
        from mono_common.stages.topk import TKS_FINE, spread_keys

        rk = rk or spread_keys(W, spread, nprog)
        tkf = torch.zeros(W, TKS_FINE.value, dtype=torch.int32, device=scores.device)
        for stage in ((0, 3) if select else (0, 1, 2)):
            topk_spread_entry[(nprog,)](scores, scores.stride(0), seqlen, tkh, tkf, topk, W=W, TOPK=k, STAGE=stage,
                                        SHORT=spread, RK=rk)
        return topk
    if row and int(seqlen.max()) <= row:
        if row_hist and first_tile:
            topk_first_entry[(nprog,)](scores, scores.stride(0), seqlen, tkh, W=W, TOPK=k, TB=first_tile)
        elif row_hist:
            topk_entry[(nprog,)](scores, scores.stride(0), seqlen, tkh, tkc, topk, nck, 0, W=W, TOPK=k, STAGE=0)
        stage = 7 if row_hist else 6
        topk_entry[(nprog,)](scores, scores.stride(0), seqlen, tkh, tkc, topk, nck, stage, W=W, TOPK=k, STAGE=stage,
                             SHORT=row)
        return topk
    if first_tile:
        topk_first_entry[(nprog,)](scores, scores.stride(0), seqlen, tkh, W=W, TOPK=k, TB=first_tile)
    for stage in range(1 if first_tile else 0, 6):
        if stage == 4 and short and int(seqlen.max()) <= short:
            continue
        topk_entry[(nprog,)](scores, scores.stride(0), seqlen, tkh, tkc, topk, nck, stage, W=W, TOPK=k, STAGE=stage,
                             RT=rt, SHORT=short, ONCE=once)
    return topk


def run_routing(logits, bias, top_k: int, live=None):
    """logits [W, E], or [KSR, W, E] split-K partials (summed in slot order by the kernel); live
    [W] (optional): which rows route (nonzero); the others get no weights."""
    import torch

    from mono_common.stages.entries import routing_entry

    ksr = logits.shape[0] if logits.dim() == 3 else 1
    W, E = logits.shape[-2:]
    w = torch.zeros(W, E, dtype=torch.float32, device=logits.device)
    used = torch.zeros(E, dtype=torch.int32, device=logits.device)
    bm = 1 << max(0, (W - 1).bit_length())
    lv = used if live is None else live.to(device=logits.device, dtype=torch.int32).contiguous()
    routing_entry[(1,)](logits.float().contiguous(), bias.float().contiguous(), w, used, lv, W=W, BM=bm, E=E,
                        TOPE=top_k, KSR=ksr, LIVE=live is not None)
    return w, used


def run_rmsnorm(x, weight, eps: float):
    import torch

    from mono_common.stages.entries import rmsnorm_entry

    out = torch.empty_like(x, dtype=torch.float32)
    rmsnorm_entry[(x.shape[0],)](x.contiguous(), weight, out, eps, D=x.shape[1])
    return out


def run_rope(x, pos, cs, neox: bool):
    import torch

    from mono_common.stages.entries import rope_entry

    out = torch.empty_like(x, dtype=torch.float32)
    rope_entry[(x.shape[0],)](x.float().contiguous(), pos, cs, out, RD=x.shape[1], NEOX=neox)
    return out


def run_hadamard(x, scale: float):
    import torch

    from mono_common.stages.entries import hadamard_entry

    out = torch.empty_like(x, dtype=torch.float32)
    hadamard_entry[(x.shape[0],)](x.float().contiguous(), out, scale, D=x.shape[1])
    return out
