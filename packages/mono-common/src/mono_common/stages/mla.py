"""Sparse MLA decode over selected tokens (DSA), split over token chunks, and its combine.

  mla_partial: for each (row m, head group, chunk of CT selected tokens) tile, the chunk's
      unnormalised output part [W, NH, NCH, KVL] fp32 and its (max, sum) ml [W, NH, NCH, 2]:
      q = qabs [W, NH, KVL + RD] fp32 (absorbed nope part | roped part), keys/values read from
      the paged latent cache kv_cache [slots, KVL + RD] bf16 at the slots the page table maps
      the selected token indices to (topk [W, TOPK], -1 = none; req_to_token[req, token]);
      p rounded to bf16 before the value product, as FlashMLA's bf16 P.
  HOLD (CT * KVL <= HOLD_KEYS = 16384: a chunk of at most 32 tokens at KVL 512): the chunk's whole latent
      keys [CT, KVL] loaded at once and held for both products (its scores as one dot over
      KVL, its values from the same registers), so a tile is one round of gathered loads, not
      KVL / 64 dependent ones each way. The scores add the rope part first, then the latent
      in one dot (the chunked form adds it 64 at a time: the same terms, an MMA's K split may
      round them otherwise); each output column sums the chunk's tokens as before.
  mla_combine: attn [W, NH, KVL] bf16 = sum over the chunks in chunk order of
      exp(max_c - M) * part_c / sum_c exp(max_c - M) * l_c (fixed order: fused == staged).
  mla_combined_cols: the same combine for one head's column block [BM rows, BK columns] as
      fp32 values on bf16 (mla_combine's bits), for a consumer that combines what it reads
      (the value projection, one head a tile) instead of waiting for a combine stage.
"""

import triton
import triton.language as tl

from mono_common.stages.numerics import bf16r, dot, rbf

# HOLD's register budget: a chunk's latent keys [CT, KVL] held at once, at most this many values
HOLD_KEYS = tl.constexpr(16384)


@triton.jit
def mla_partial(pid, nprog, qabs_ptr, kv_cache_ptr, topk_ptr, req_ptr, rtt_ptr, stride_rtt,
              part_ptr, ml_ptr, sm_scale,
              W: tl.constexpr, NH: tl.constexpr, KVL: tl.constexpr, RD: tl.constexpr,
              TOPK: tl.constexpr, CT: tl.constexpr, HG: tl.constexpr, HOLD: tl.constexpr = False):
    if HOLD:
        tl.static_assert(CT * KVL <= HOLD_KEYS, "HOLD keeps a chunk's [CT, KVL] keys in registers: CT * KVL <= HOLD_KEYS")
    NCH: tl.constexpr = TOPK // CT
    NG: tl.constexpr = (NH + HG - 1) // HG
    DA: tl.constexpr = KVL + RD
    hh = tl.arange(0, HG)
    tt = tl.arange(0, CT)
    cr = tl.arange(0, RD)
    for t in range(pid, W * NG * NCH, nprog):
        c = t % NCH
        g = (t // NCH) % NG
        m = t // (NCH * NG)
        heads = g * HG + hh
        hm = heads < NH
        req = tl.load(req_ptr + m).to(tl.int64)
        idx = tl.load(topk_ptr + m * TOPK + c * CT + tt)
        valid = idx >= 0
        phys = tl.load(rtt_ptr + req * stride_rtt + tl.maximum(idx, 0), mask=valid, other=0).to(tl.int64)
        kb = kv_cache_ptr + phys * DA
        # scores over KVL in 64-wide chunks (a [CT, 512] tile would not fit in registers)
        DC: tl.constexpr = 64 if KVL >= 64 else KVL
        dc = tl.arange(0, DC)
        qb = qabs_ptr + (m * NH + heads) * DA
        kr = tl.load(kb[:, None] + KVL + cr[None, :], mask=valid[:, None], other=0.0)
        qr = tl.load(qb[:, None] + KVL + cr[None, :], mask=hm[:, None], other=0.0)
        s = dot(qr, tl.trans(kr))
        if HOLD:
            ck = tl.arange(0, KVL)
            kh = tl.load(kb[:, None] + ck[None, :], mask=valid[:, None], other=0.0)
            qh = tl.load(qb[:, None] + ck[None, :], mask=hm[:, None], other=0.0)
            s += dot(qh, tl.trans(kh))
        else:
            for d0 in range(0, KVL, DC):
                kn = tl.load(kb[:, None] + d0 + dc[None, :], mask=valid[:, None], other=0.0)
                qn = tl.load(qb[:, None] + d0 + dc[None, :], mask=hm[:, None], other=0.0)
                s += dot(qn, tl.trans(kn))
        s = tl.where(valid[None, :], s * sm_scale, -1e30)
        mx = tl.max(s, 1)
        p = tl.where(valid[None, :], tl.exp(s - mx[:, None]), 0.0)
        l = tl.sum(p, 1)
        pbf = rbf(p)
        pb = part_ptr + ((m * NH + heads) * NCH + c) * KVL
        if HOLD:
            tl.store(pb[:, None] + ck[None, :], dot(pbf, kh), mask=hm[:, None])
        else:
            for d0 in range(0, KVL, DC):
                kn = tl.load(kb[:, None] + d0 + dc[None, :], mask=valid[:, None], other=0.0)
                o = dot(pbf, kn)
                tl.store(pb[:, None] + d0 + dc[None, :], o, mask=hm[:, None])
        mb = ml_ptr + ((m * NH + heads) * NCH + c) * 2
        tl.store(mb, mx, mask=hm)
        tl.store(mb + 1, l, mask=hm)


@triton.jit
def mla_combine(pid, nprog, part_ptr, ml_ptr, attn_ptr,
                  W: tl.constexpr, NH: tl.constexpr, KVL: tl.constexpr, TOPK: tl.constexpr,
                  CT: tl.constexpr, VEC: tl.constexpr = False):
    """attn[m, h, d-block] = sum_c exp(max_c - M) * part_c / sum_c exp(max_c - M) * l_c over the
    MLA stage's token chunks c, in chunk order (a tile per row, head and DC-column block: the
    combine of one (row, head group) by one program took ~70 us of the TP8 shard's launch).
    The chunk loops are unrolled so that every chunk's loads are in flight together; the sums
    still run in chunk order.
    VEC: a tile's chunks as one [NCH, DC] load and block reductions (the sums in the reduction's
    tree order, fixed by the layout): the same one round of loads in a few instructions, where
    the unrolled chunk order is ~10 KB of straight sm_90 code at 32 chunks."""
    NCH: tl.constexpr = TOPK // CT
    DC: tl.constexpr = 64 if KVL >= 64 else KVL
    ND: tl.constexpr = KVL // DC
    dc = tl.arange(0, DC)
    if VEC:
        ch = tl.arange(0, NCH)
        for t in range(pid, W * NH * ND, nprog):
            d0 = (t % ND) * DC
            mh = t // ND
            mx = tl.load(ml_ptr + (mh * NCH + ch) * 2)
            e = tl.exp(mx - tl.max(mx, 0))
            L = tl.sum(e * tl.load(ml_ptr + (mh * NCH + ch) * 2 + 1), 0)
            part = tl.load(part_ptr + (mh * NCH + ch[:, None]) * KVL + d0 + dc[None, :])
            acc = tl.sum(e[:, None] * part, 0)
            tl.store(attn_ptr + mh * KVL + d0 + dc, bf16r(acc / tl.maximum(L, 1e-30)))
    else:
        for t in range(pid, W * NH * ND, nprog):
            d0 = (t % ND) * DC
            mh = t // ND  # m * NH + h
            mlb = ml_ptr + mh * NCH * 2
            M = tl.load(mlb)
            for cc in tl.static_range(1, NCH):
                M = tl.maximum(M, tl.load(mlb + cc * 2))
            L = tl.zeros([DC], tl.float32)
            acc = tl.zeros([DC], tl.float32)
            for cc in tl.static_range(NCH):
                e = tl.exp(tl.load(mlb + cc * 2) - M)
                L += e * tl.load(mlb + cc * 2 + 1)
                acc += e * tl.load(part_ptr + (mh * NCH + cc) * KVL + d0 + dc)
            tl.store(attn_ptr + mh * KVL + d0 + dc, bf16r(acc / tl.maximum(L, 1e-30)))


@triton.jit
def mla_combined_cols(part_ptr, ml_ptr, rows, rmask, h, d0, NH: tl.constexpr, KVL: tl.constexpr,
                      NCH: tl.constexpr, BK: tl.constexpr):
    """attn[rows, h, d0:d0+BK] as `mla_combine` writes it, [BM, BK] fp32 on bf16, from the
    partials (rows masked by rmask read nothing and come out 0): each row's max, its weight
    sum and its sum over the chunks, in chunk order, the same operations per element as
    mla_combine's, so a consumer combining in place reads that stage's bits. Every chunk's
    loads are unrolled so they are in flight together."""
    mlb = ml_ptr + (rows * NH + h) * NCH * 2
    M = tl.load(mlb, mask=rmask, other=0.0)
    for cc in tl.static_range(1, NCH):
        M = tl.maximum(M, tl.load(mlb + cc * 2, mask=rmask, other=0.0))
    L = tl.zeros(M.shape, tl.float32)
    for cc in tl.static_range(NCH):
        L += tl.exp(tl.load(mlb + cc * 2, mask=rmask, other=0.0) - M) * tl.load(mlb + cc * 2 + 1, mask=rmask,
                                                                                  other=0.0)
    dc = tl.arange(0, BK)
    pb = part_ptr + ((rows * NH + h) * NCH)[:, None] * KVL + d0 + dc[None, :]
    acc = tl.zeros([rows.shape[0], BK], tl.float32)
    for cc in tl.static_range(NCH):
        e = tl.exp(tl.load(mlb + cc * 2, mask=rmask, other=0.0) - M)
        acc += e[:, None] * tl.load(pb + cc * KVL, mask=rmask[:, None], other=0.0)
    return bf16r(acc / tl.maximum(L, 1e-30)[:, None])
