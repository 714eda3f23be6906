"""Exact radix top-k over rows of fp32 scores, spread over every program of a persistent launch.

Scores: [rows, stride_sc] fp32, row m's first n = seqlen[m] entries valid. Output: topk [rows,
TOPK] int32 token indices: every key above the threshold in index order, then the ties in
index order until TOPK are placed (deterministic); a row of n <= TOPK tokens takes 0..n-1 and
-1 after. Keys are order-preserving integers of the scores (`okey`); four 8-bit radix passes
(`topk_hist`, PASS 0..3) fill a row's four 256-bin histograms at tkh [rows, TKH_ROW] (zeroed
before the first pass), every TKC-key chunk of every row a tile (integer atomics: any order,
same sum; `topk_hist_first` runs pass 0 in the stage that produces the scores instead);
`topk_count` counts each chunk's keys above and equal to the threshold into tkc [rows, nck,
2]; `topk_write` places each chunk's keys after the earlier chunks'. A grid-wide hand-off
separates the stages. Every program derives the threshold from the complete
histograms itself (`tk_prefix`), so no stage publishes it. SHORT > 0 (a power of two): the
write counts a row of at most SHORT tokens itself, reading the row's keys in one go
(`_row_counts`), and the count stage counts only longer rows; where no row is longer
(`topk_rows_short`), a caller can leave the count stage and its hand-off out.
ROW (`topk_rows_one`): a step whose rows all have at most SHORT tokens can instead give each
row to one program, which reads the row's keys once, finds the threshold by a two-bits-a-step
search over the key's 32 bits (16 block-wide reductions) and writes the row (one scan): one
stage instead of six and their hand-offs, the same integers. With the row's histogram 0 complete
(HIST: pass 0 ran in the scores' producer, `topk_hist_first`) the top digit comes from it, the
keys of that digit are packed into the row's free bins 256.. (at most CAND of them, else the
search runs over the whole row) and the 12 remaining steps reduce CAND keys, not SHORT.
SPREAD (`topk_spread_threshold`, `topk_spread_write`: rows of at most SHORT tokens): with pass 0
and a fine histogram of the keys' top 16 bits added by the scores' producer (`topk_hist_fine`),
the tiles holding keys of the threshold's top 16 bits find it by counting, the row read once,
and every tile then places its keys: two stages on every program, the same integers.
References: SGLang's indexer top-k (mono_glm53.reference.indexer_topk picks the same set).
"""

import triton
import triton.language as tl


@triton.jit
def okey32(x):
    """fp32 -> int32 whose signed order is the float order (`okey` less 2^31)."""
    b = x.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def okey(x):
    """fp32 -> int64 in [0, 2^32) whose integer order is the float order."""
    return okey32(x).to(tl.int64) + 2147483648


# Keys per chunk of the top-k stages: one 256-bin histogram of 256 keys a chunk (at 1024 keys a
# histogram held too many of gfx950's SGPRs: one lane ballot per digit bit per key a thread holds)
TKC = tl.constexpr(256)
# A row's top-k histograms: one of 256 bins per 8-bit radix pass, four passes
TKH_ROW = tl.constexpr(4 * 256)


@triton.jit
def _hist_digit(hist, need):
    """The threshold's digit from a 256-bin histogram of the keys still in play: the largest
    digit b whose suffix count (keys with that digit or more) still reaches the `need` keys left
    to place. Returns (b, need less the keys above b, the keys of digit b)."""
    dig = tl.arange(0, 256)
    suffix = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist
    b = tl.max(tl.where(suffix >= need, dig, 0), 0)
    return b, need - tl.sum(tl.where(dig > b, hist, 0), 0), tl.sum(tl.where(dig == b, hist, 0), 0)


@triton.jit
def _prefix_digit(hb, ps, thr, need):
    """Pass ps's digit of the threshold from histogram ps at hb (`_hist_digit`). Returns (thr
    with the digit set, need less the keys above it)."""
    b, need, _ = _hist_digit(tl.load(hb + ps * 256 + tl.arange(0, 256)), need)
    return thr | (b.to(tl.int64) << (24 - 8 * ps)), need


@triton.jit
def tk_prefix(hb, TOPK: tl.constexpr, PASSES: tl.constexpr):
    """The threshold's top PASSES digits (8 bits each, from the top), from the row's first
    PASSES histograms at hb (every program derives the same value from the same complete
    histograms), one `_prefix_digit` a pass."""
    thr = tl.full([], 0, tl.int64)
    need = tl.full([], TOPK, tl.int32)
    for ps in tl.static_range(PASSES):
        thr, need = _prefix_digit(hb, ps, thr, need)
    return thr


@triton.jit
def tk_prefix_rt(hb, TOPK: tl.constexpr, passes):
    """`tk_prefix` of a runtime count of digits, 0..3 (`topk_hist` RT: pass `passes` needs the
    digits before it): each digit's step guarded by the count. As a loop over the count, ptxas
    spilled 4 bytes in the standalone entry (sm_90, Triton 3.8)."""
    thr = tl.full([], 0, tl.int64)
    need = tl.full([], TOPK, tl.int32)
    for ps in tl.static_range(3):
        if ps < passes:
            thr, need = _prefix_digit(hb, ps, thr, need)
    return thr


@triton.jit
def tk_span(pid, nprog, total, ONCE: tl.constexpr):
    """The tiles program pid runs, as range bounds and step: every nprog-th from pid, or (ONCE)
    a contiguous run of about total / nprog, so that a program's tiles are mostly one row's and
    `tk_prefix_cached` derives its threshold once a row, not once a tile (each digit: five
    block-wide reductions over 256 bins; at 65536 keys a row, 8 rows, 264 programs, a program
    runs ~8 tiles, strided each of another row). The same tiles in all, so the same integers."""
    if ONCE:
        per = (total + nprog - 1) // nprog
        return pid * per, tl.minimum(total, pid * per + per), 1
    else:
        return pid, total, nprog


@triton.jit
def tk_prefix_cached(hb, m, last, thr, TOPK: tl.constexpr, PASSES: tl.constexpr):
    """`tk_prefix` of row m's histograms at hb, reusing thr when m is the row `last` it was
    derived for: (thr, m)."""
    if m != last:
        thr = tk_prefix(hb, TOPK, PASSES)
    return thr, m


@triton.jit
def tk_keys(scores_ptr, stride_sc, m, c0, n):
    """Row m's order-preserving keys of chunk c0..c0+TKC and which of them are tokens (< n)."""
    inb = c0 + tl.arange(0, TKC) < n
    return inb, okey(tl.load(scores_ptr + m * stride_sc + c0 + tl.arange(0, TKC), mask=inb, other=0.0))


@triton.jit
def tk_rows(seqlen_ptr, W: tl.constexpr):
    """The rows' token counts as one vector (a power-of-two length >= W, 0 past W) and its index,
    read once by a stage for all its tiles."""
    tl.static_assert(W <= 32, "the top-k stages take at most 32 rows")
    WP2: tl.constexpr = 2 if W <= 2 else (4 if W <= 4 else (8 if W <= 8 else (16 if W <= 16 else 32)))
    rows = tl.arange(0, WP2)
    return rows, tl.load(seqlen_ptr + rows, mask=rows < W, other=0)


@triton.jit
def tk_tiles(rows, cnt):
    """A stage's tiles numbered row after row, cnt[m] of row m: (the first tile of each row,
    their number). A stage loops over these only, not over every chunk of the longest context
    the launch was built for (a served kernel's, ~3000 chunks a row at GLM-5.3's 202752)."""
    return tl.cumsum(cnt, 0) - cnt, tl.sum(cnt, 0)


@triton.jit
def tk_locate(t, rows, ns, first, cnt):
    """Tile t of `tk_tiles`' numbering: (row m, chunk c within the row, the row's tokens n)."""
    m = tl.sum(((first + cnt) <= t).to(tl.int32), 0)
    c = t - tl.sum(tl.where(rows == m, first, 0), 0)
    n = tl.sum(tl.where(rows == m, ns, 0), 0)
    return m, c, n


@triton.jit
def topk_hist(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, nck,
                 W: tl.constexpr, TOPK: tl.constexpr, INDEXER: tl.constexpr, PASS, RT: tl.constexpr = False,
                 ONCE: tl.constexpr = False):
    """Radix pass PASS of the exact top-TOPK (rows with more than TOPK tokens): the histogram
    of digit PASS among the keys that share the threshold's first PASS digits, one chunk of a
    row per tile, added into the row's histogram PASS (integer atomics: any order, same sum).
    PASS is a constexpr unless RT: then a runtime value (the passes as one loop over one copy
    of this code, `tk_prefix_rt`), the same integers. ONCE (constexpr PASS only): a program's
    tiles a contiguous run, a row's digits derived once a run (`tk_span`), the same integers."""
    tl.static_assert(not (ONCE and RT), "ONCE takes a constexpr PASS")
    if INDEXER:
        shift = 24 - 8 * PASS
        rows, ns = tk_rows(seqlen_ptr, W)
        cnt = tl.where(ns > TOPK, tl.minimum((ns + TKC - 1) // TKC, nck), 0)
        first, total = tk_tiles(rows, cnt)
        t0, t1, step = tk_span(pid, nprog, total, ONCE)
        if ONCE:
            last = tl.full([], -1, tl.int32)
            thr = tl.full([], 0, tl.int64)
        for t in range(t0, t1, step):
            m, c, n = tk_locate(t, rows, ns, first, cnt)
            c0 = c * TKC
            hb = tkh_ptr + m * TKH_ROW
            if RT:
                thr = tk_prefix_rt(hb, TOPK, PASS)
            elif ONCE:
                thr, last = tk_prefix_cached(hb, m, last, thr, TOPK, PASS)
            else:
                thr = tk_prefix(hb, TOPK, PASS)
            inb, key = tk_keys(scores_ptr, stride_sc, m, c0, n)
            match = inb & ((key >> (shift + 8)) == (thr >> (shift + 8)))
            _hist_add(hb + PASS * 256, ((key >> shift) & 255).to(tl.int32), match)


@triton.jit
def _hist_add(hp, d, match):
    """Add the histogram of the digits d where match into the 256 bins at hp (integer
    atomics: any order, same sum)."""
    dig = tl.arange(0, 256)
    # no histogram mask on every Triton: count the others as digit 0 and take them off again
    hist = tl.histogram(tl.where(match, d, 0), 256)
    hist -= tl.where(dig == 0, tl.sum((~match).to(tl.int32), 0), 0)
    tl.atomic_add(hp + dig, hist, mask=hist != 0, sem="relaxed")


@triton.jit
def topk_hist_first(tkh_ptr, m, x, valid, n, TOPK: tl.constexpr):
    """The first radix pass (`topk_hist` PASS 0) over scores as their producer writes them: a
    tile x of row m's scores (valid: which are the row's tokens; n its token count) added into
    the row's histogram 0, so no stage of its own runs the pass. Rows of n <= TOPK count
    nothing, as in `topk_hist`. The histograms must be zero before any producer adds: a hand-
    off or more before it (not in the producer's own stage, whose other programs may add first)."""
    if n > TOPK:
        # one atomic a key, no tl.histogram: a producer's tile is a few dozen keys, and the
        # histogram took the layer's index-score loop from 236 to 300 VGPRs on gfx950
        d = ((okey(x) >> 24) & 255).to(tl.int32)
        tl.atomic_add(tkh_ptr + m * TKH_ROW + d, tl.full(d.shape, 1, tl.int32), mask=valid, sem="relaxed")


@triton.jit
def topk_rows_short(seqlen_ptr, W: tl.constexpr, SHORT: tl.constexpr):
    """Whether no row of the step has more than SHORT tokens (every program reads the same
    lengths, so every program decides the same): the count stage then has nothing to count."""
    rows, ns = tk_rows(seqlen_ptr, W)
    return tl.max(ns, 0) <= SHORT


@triton.jit
def _row_counts(scores_ptr, stride_sc, m, n, c0, thr, SHORT: tl.constexpr):
    """(keys above thr before token c0, keys equal to thr before c0, keys above thr in the row)
    of row m's n <= SHORT tokens, its keys read in one go: the sums of `topk_count`'s chunk
    counts that `topk_write` reads. Compared as int32 (`okey32`: the same order), half the
    registers of the int64 keys."""
    i = tl.arange(0, SHORT)
    inb = i < n
    k = okey32(tl.load(scores_ptr + m * stride_sc + i, mask=inb, other=0.0))
    t = (thr - 2147483648).to(tl.int32)
    gt = (k > t) & inb
    eq = (k == t) & inb
    before = i < c0
    return (tl.sum((gt & before).to(tl.int32), 0), tl.sum((eq & before).to(tl.int32), 0),
            tl.sum(gt.to(tl.int32), 0))


@triton.jit
def _chunk_counts(tkc_ptr, m, nck, n, c):
    """(keys above the threshold in row m's chunks before c, its ties there, the row's keys
    above it) from `topk_count`'s chunk counts, TKC chunks a step."""
    dig = tl.arange(0, TKC)
    ncr = (n + TKC - 1) // TKC
    gtb = tl.full([], 0, tl.int32)
    eqb = tl.full([], 0, tl.int32)
    gtt = tl.full([], 0, tl.int32)
    for b0 in range(0, ncr, TKC):
        cc = b0 + dig
        cb = tkc_ptr + (m * nck + cc) * 2
        g = tl.load(cb, mask=cc < ncr, other=0)
        e = tl.load(cb + 1, mask=cc < ncr, other=0)
        gtb += tl.sum(tl.where(cc < c, g, 0), 0)
        eqb += tl.sum(tl.where(cc < c, e, 0), 0)
        gtt += tl.sum(g, 0)
    return gtb, eqb, gtt


@triton.jit
def _run_counts(tkc_ptr, m, nck, n, c, run, gtb_n, eqb_n, gtt_n):
    """`_chunk_counts` of chunk c, taken from the carried counts when `run` (c follows the
    program's previous chunk of the row), and the counts carried to chunk c + 1: (gtb, eqb,
    gtt, c + 1, and the three carried). Integer sums: the same values either way."""
    if run:
        gtb, eqb, gtt = gtb_n, eqb_n, gtt_n
    else:
        gtb, eqb, gtt = _chunk_counts(tkc_ptr, m, nck, n, c)
    cb = tkc_ptr + (m * nck + c) * 2
    return gtb, eqb, gtt, c + 1, gtb + tl.load(cb), eqb + tl.load(cb + 1), gtt


@triton.jit
def topk_count(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkc_ptr, nck,
                  W: tl.constexpr, TOPK: tl.constexpr, INDEXER: tl.constexpr, SHORT: tl.constexpr = 0,
                  ONCE: tl.constexpr = False):
    """Per chunk of a row with more than TOPK tokens (and, SHORT > 0, more than SHORT: the write
    counts the shorter rows itself): how many of its keys exceed the threshold and how many
    equal it (the write stage places each chunk's keys after the earlier chunks'). ONCE: a
    program's tiles a contiguous run, a row's threshold derived once a run (`tk_span`)."""
    if INDEXER:
        rows, ns = tk_rows(seqlen_ptr, W)
        low: tl.constexpr = max(TOPK, SHORT)
        cnt = tl.where(ns > low, tl.minimum((ns + TKC - 1) // TKC, nck), 0)
        first, total = tk_tiles(rows, cnt)
        t0, t1, step = tk_span(pid, nprog, total, ONCE)
        if ONCE:
            last = tl.full([], -1, tl.int32)
            thr = tl.full([], 0, tl.int64)
        for t in range(t0, t1, step):
            m, c, n = tk_locate(t, rows, ns, first, cnt)
            if ONCE:
                thr, last = tk_prefix_cached(tkh_ptr + m * TKH_ROW, m, last, thr, TOPK, 4)
            else:
                thr = tk_prefix(tkh_ptr + m * TKH_ROW, TOPK, 4)
            inb, key = tk_keys(scores_ptr, stride_sc, m, c * TKC, n)
            cb = tkc_ptr + (m * nck + c) * 2
            tl.store(cb, tl.sum(((key > thr) & inb).to(tl.int32), 0))
            tl.store(cb + 1, tl.sum(((key == thr) & inb).to(tl.int32), 0))


@triton.jit
def _place_short(out_ptr, j, n, TOPK: tl.constexpr):
    """A row of n <= TOPK tokens: its slots j (a tile of them) take j, or -1 past n."""
    tl.store(out_ptr + j, tl.where(j < n, j, -1), mask=j < TOPK)


@triton.jit
def _place_keys(out_ptr, j, key, inb, thr, gtb, tie0, TOPK: tl.constexpr):
    """A tile's tokens j (keys key, inb: which are the row's) placed in the row's top-TOPK at
    out_ptr: the keys above thr after the gtb above it before the tile, the ties of thr after
    tie0 (the row's keys above it and its ties before the tile). Fewer than TOPK keys exceed
    thr; the masks keep a wrong thr inside the row."""
    si = ((key > thr) & inb).to(tl.int32)
    slot = gtb + tl.cumsum(si, 0) - si
    tl.store(out_ptr + slot, j, mask=(si != 0) & (slot < TOPK))
    si = ((key == thr) & inb).to(tl.int32)
    slot = tie0 + tl.cumsum(si, 0) - si
    tl.store(out_ptr + slot, j, mask=(si != 0) & (slot < TOPK))


@triton.jit
def topk_write(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkc_ptr, topk_ptr, nck,
                  W: tl.constexpr, TOPK: tl.constexpr, INDEXER: tl.constexpr, SHORT: tl.constexpr = 0,
                  ONCE: tl.constexpr = False):
    """The row's top-TOPK token indices: every key above the threshold in index order, then the
    ties in index order until TOPK are placed (deterministic); a row of n <= TOPK tokens takes
    0..n-1 and -1 after. One chunk per tile, placed after the earlier chunks' counts: from tkc,
    or (SHORT > 0, a row of at most SHORT tokens) counted from the row's keys (`_row_counts`:
    the same integers). ONCE: a program's tiles a contiguous run, a row's threshold derived
    once a run (`tk_span`) and each next chunk's counts carried from the one before
    (`_run_counts`)."""
    if INDEXER:
        dig = tl.arange(0, TKC)
        rows, ns = tk_rows(seqlen_ptr, W)
        # a row of at most TOPK tokens writes its TOPK entries (indices, then -1)
        cnt = tl.where(rows < W, tl.where(ns <= TOPK, (TOPK + TKC - 1) // TKC,
                                          tl.minimum((ns + TKC - 1) // TKC, nck)), 0)
        first, total = tk_tiles(rows, cnt)
        t0, t1, step = tk_span(pid, nprog, total, ONCE)
        if ONCE:
            last = tl.full([], -1, tl.int32)
            thr = tl.full([], 0, tl.int64)
            # the counts before chunk nxt of row last (the tile after this program's previous
            # one), carried so that a run's next chunk reads one count pair, not the row's
            nxt = tl.full([], -1, tl.int32)
            gtb_n = tl.full([], 0, tl.int32)
            eqb_n = tl.full([], 0, tl.int32)
            gtt_n = tl.full([], 0, tl.int32)
        for t in range(t0, t1, step):
            m, c, n = tk_locate(t, rows, ns, first, cnt)
            c0 = c * TKC
            if n <= TOPK:
                _place_short(topk_ptr + m * TOPK, c0 + dig, n, TOPK)
            else:
                if ONCE:
                    run = (m == last) & (c == nxt)
                    thr, last = tk_prefix_cached(tkh_ptr + m * TKH_ROW, m, last, thr, TOPK, 4)
                else:
                    thr = tk_prefix(tkh_ptr + m * TKH_ROW, TOPK, 4)
                if SHORT > 0:
                    if n <= SHORT:
                        gtb, eqb, gtt = _row_counts(scores_ptr, stride_sc, m, n, c0, thr, SHORT)
                    elif ONCE:
                        gtb, eqb, gtt, nxt, gtb_n, eqb_n, gtt_n = _run_counts(tkc_ptr, m, nck, n, c, run, gtb_n,
                                                                              eqb_n, gtt_n)
                    else:
                        gtb, eqb, gtt = _chunk_counts(tkc_ptr, m, nck, n, c)
                elif ONCE:
                    gtb, eqb, gtt, nxt, gtb_n, eqb_n, gtt_n = _run_counts(tkc_ptr, m, nck, n, c, run, gtb_n, eqb_n,
                                                                          gtt_n)
                else:
                    gtb, eqb, gtt = _chunk_counts(tkc_ptr, m, nck, n, c)
                inb, key = tk_keys(scores_ptr, stride_sc, m, c0, n)
                _place_keys(topk_ptr + m * TOPK, c0 + dig, key, inb, thr, gtb, gtt + eqb, TOPK)


@triton.jit
def _count_ge3(k, inb, t1, t2, t3):
    """How many valid keys k (okey32, any shape flattened by the sum) are >= t1, t2, t3: three
    counts below 2^21 packed in one int64 so that one reduction gives all three."""
    v = ((k >= t1) & inb).to(tl.int64) + (((k >= t2) & inb).to(tl.int64) << 21) + \
        (((k >= t3) & inb).to(tl.int64) << 42)
    s = tl.sum(v, 0)
    return s & 0x1FFFFF, (s >> 21) & 0x1FFFFF, s >> 42


@triton.jit
def _tk_search(k, inb, t, need, ST0: tl.constexpr):
    """Two bits a step from step ST0 (bits 31-2*ST0 down to 0 still open) of t (the unsigned
    key's bits above them fixed): the largest t with at least `need` valid keys k (okey32)
    >= t - 2^31, every valid key sharing t's fixed bits (or none fixed)."""
    # a loop, not unrolled: unrolled, 4 warps took 23.4 us a row of 4096 keys alone against
    # 13.6 as a loop, with 4x the code (H100, session 31)
    for st in range(ST0, 16):
        sh = 30 - 2 * st
        c1 = t | (tl.full([], 1, tl.int64) << sh)
        c2 = t | (tl.full([], 2, tl.int64) << sh)
        c3 = t | (tl.full([], 3, tl.int64) << sh)
        n1, n2, n3 = _count_ge3(k, inb, (c1 - 2147483648).to(tl.int32), (c2 - 2147483648).to(tl.int32),
                                (c3 - 2147483648).to(tl.int32))
        t = tl.where(n3 >= need, c3, tl.where(n2 >= need, c2, tl.where(n1 >= need, c1, t)))
    return t


@triton.jit
def tk_row_threshold(k, inb, TOPK: tl.constexpr):
    """The TOPK-th largest of the valid keys k [SHORT] (okey32; more than TOPK valid, SHORT <
    2^21): the largest t with at least TOPK keys >= t, built from the top two bits a step in
    the unsigned order (okey = okey32 + 2^31), the radix passes' threshold. The same value as
    `tk_prefix`'s four digits: both are that key."""
    t = _tk_search(k, inb, tl.full([], 0, tl.int64), TOPK, 0)
    return (t - 2147483648).to(tl.int32)


# The most keys of the threshold's top digit that `tk_row_threshold_hist` packs into a row's
# free histogram bins (256 + CAND <= TKH_ROW) to search them alone
CAND = tl.constexpr(512)


# The row paths' scans (the candidates' packing, the write) run over chunks of ROW_CHUNK keys
# re-read from the row (the L1 or the L2), not over the row held in registers: a [4096] scan in
# the layout Triton gives it (one key a thread, 32 times over) unrolls into long straight code,
# which a layer runs once a launch from a cold instruction cache. In-loop clocks (H100, session
# 34): the packing and the write took ~11.8 us each in mono-glm53's layer against 2.9 / 1.6 us
# alone (where the same SM reruns the code warm), while the search loop's steps took the same
# ~0.3 us in both. Chunked, the layer's row stage went 34.4 -> 22.8 us at 1 row; alone (warm
# code, the chunks' reloads in the way) `rowh` went 12.75 -> 16.39 us.
ROW_CHUNK = tl.constexpr(1024)


@triton.jit
def _row_digit(x):
    """okey32 keys' top digit in the unsigned order (okey flips okey32's sign bit)."""
    return ((x >> 24) & 255) ^ 128


@triton.jit
def tk_row_threshold_hist(k, inb, hb, TOPK: tl.constexpr, row_ptr, n):
    """`tk_row_threshold` of the same keys (row_ptr: the row's n scores they came from) with the
    row's histogram 0 at hb complete (its other bins are free: they hold the packed keys after).
    Its top digit b comes from the histogram; the c keys of digit b are the search's candidates,
    with `need` = TOPK less the keys above b still to place. c <= CAND (a random row of 4096
    keys: ~16): they are packed in index order into hb[256:] (ROW_CHUNK keys a step, then a
    block barrier) and the 12 remaining steps reduce CAND lanes; more: the steps run over the
    row, the others masked out. The same value."""
    b, need, c = _hist_digit(tl.load(hb + tl.arange(0, 256)), tl.full([], TOPK, tl.int32))
    t0 = b.to(tl.int64) << 24
    if c <= CAND:
        base = tl.full([], 0, tl.int32)
        for c0 in range(0, n, ROW_CHUNK):
            j = c0 + tl.arange(0, ROW_CHUNK)
            key = okey32(tl.load(row_ptr + j, mask=j < n, other=0.0))
            ci = ((j < n) & (_row_digit(key) == b)).to(tl.int32)
            tl.store(hb + 256 + base + tl.cumsum(ci, 0) - ci, key, mask=ci != 0)
            base += tl.sum(ci, 0)
        # the block's own global stores are visible to its threads after the barrier
        tl.debug_barrier()
        j = tl.arange(0, CAND)
        kc = tl.load(hb + 256 + j, mask=j < c, other=0)
        t = _tk_search(kc, j < c, t0, need, 4)
    else:
        t = _tk_search(k, inb & (_row_digit(k) == b), t0, need, 4)
    return (t - 2147483648).to(tl.int32)


@triton.jit
def _row_place(row_ptr, n, thr, ngt, out_ptr, TOPK: tl.constexpr):
    """Write a row's top-TOPK at out_ptr as `topk_write` places it, ROW_CHUNK keys a step re-read
    from row_ptr (n scores): the keys above thr after the earlier chunks' (gtb), its ties after
    all ngt keys above and the earlier chunks' ties (eqb). A chunk's slots come from one
    exclusive scan of the above / tie flags packed in one int32 (each count < 2^16)."""
    gtb = tl.full([], 0, tl.int32)
    eqb = tl.full([], 0, tl.int32)
    for c0 in range(0, n, ROW_CHUNK):
        j = c0 + tl.arange(0, ROW_CHUNK)
        inb = j < n
        key = okey32(tl.load(row_ptr + j, mask=inb, other=0.0))
        gt = ((key > thr) & inb).to(tl.int32)
        eq = ((key == thr) & inb).to(tl.int32)
        v = gt + (eq << 16)
        cs = tl.cumsum(v, 0) - v
        gs = gtb + (cs & 0xFFFF)
        es = ngt + eqb + (cs >> 16)
        # fewer than TOPK keys exceed thr; the masks keep a wrong thr inside the row
        tl.store(out_ptr + gs, j, mask=(gt != 0) & (gs < TOPK))
        tl.store(out_ptr + es, j, mask=(eq != 0) & (es < TOPK))
        tot = tl.sum(v, 0)
        gtb += tot & 0xFFFF
        eqb += tot >> 16


@triton.jit
def topk_row(scores_ptr, stride_sc, m, n, topk_ptr, TOPK: tl.constexpr, SHORT: tl.constexpr, tkh_ptr=None,
             HIST: tl.constexpr = False):
    """Row m's top-TOPK (n <= SHORT tokens) by one program, as `topk_write` places it: the keys
    above the threshold in index order, then its ties in index order until TOPK; a row of n <=
    TOPK tokens takes 0..n-1 and -1 after (`_row_place`). HIST: the row's histogram 0 at tkh_ptr
    is complete, and its bins 256.. are scratch (`tk_row_threshold_hist`)."""
    tl.static_assert(SHORT <= 32768, "topk_row packs two counts of at most SHORT in 16 bits each")
    if n <= TOPK:
        for c0 in range(0, TOPK, TKC):
            _place_short(topk_ptr + m * TOPK, c0 + tl.arange(0, TKC), n, TOPK)
    else:
        row_ptr = scores_ptr + m * stride_sc
        i = tl.arange(0, SHORT)
        inb = i < n
        k = okey32(tl.load(row_ptr + i, mask=inb, other=0.0))
        if HIST:
            thr = tk_row_threshold_hist(k, inb, tkh_ptr + m * TKH_ROW, TOPK, row_ptr, n)
        else:
            thr = tk_row_threshold(k, inb, TOPK)
        _row_place(row_ptr, n, thr, tl.sum(((k > thr) & inb).to(tl.int32), 0), topk_ptr + m * TOPK, TOPK)


@triton.jit
def topk_rows_one(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, topk_ptr, W: tl.constexpr, TOPK: tl.constexpr,
                  SHORT: tl.constexpr, tkh_ptr=None, HIST: tl.constexpr = False):
    """Every row's top-TOPK, one program a row (`topk_row`), rows dealt from the last program
    down (the first programs run other stages' first tiles). Every row must have at most
    SHORT tokens (`topk_rows_short` decides it alike in every program). HIST: the rows'
    histograms 0 at tkh [rows, TKH_ROW] are complete (`topk_row`)."""
    for m in range(nprog - 1 - pid, W, nprog):
        topk_row(scores_ptr, stride_sc, m, tl.load(seqlen_ptr + m), topk_ptr, TOPK, SHORT, tkh_ptr, HIST)


# The spread form's words at the end of a row's histograms (passes 1-3's bins are unused where
# pass 0 seeds the spread form): the threshold (okey32) and the row's keys above it
TKS_WORD = tl.constexpr(TKH_ROW - 1)
TKS_ABOVE = tl.constexpr(TKH_ROW - 2)
# The spread form's fine histogram: a row's keys by their top 16 bits (okey's), 65536 bins a row,
# added by the scores' producer beside histogram 0 (`topk_hist_fine`)
TKS_FINE = tl.constexpr(65536)
# okey32's least value: the spread stages' stand-in for a key that does not count
KEY_NONE = tl.constexpr(-2147483648)


def spread_keys(W: int, short: int, nprog: int) -> int:
    """The spread form's keys a tile (host-side): the W rows of `short` keys in about one tile a
    program, a power of two in 16..128 (a tile's write scans its row once, so fewer, longer
    tiles; a tile's threshold candidates run one at a time, so not too long)."""
    per = -(-W * short // max(1, nprog))
    rk = 16
    while rk < per and rk < 128:
        rk *= 2
    return rk


@triton.jit
def _fine_bin(k):
    """okey32 keys' top 16 bits in okey's (unsigned) order: their fine histogram bin."""
    return ((k >> 16) & 0xFFFF) ^ 0x8000


@triton.jit
def topk_hist_fine(tkf_ptr, m, x, valid, n, TOPK: tl.constexpr):
    """The spread form's fine histogram of row m (`TKS_FINE` bins a row at tkf) over scores x as
    their producer writes them (valid: the row's tokens; n its token count), beside histogram 0
    (`topk_hist_first`): one atomic a key, rows of n <= TOPK count nothing. Zero before any
    producer adds (`topk_spread_zero`, a hand-off or more before)."""
    if n > TOPK:
        tl.atomic_add(tkf_ptr + m * TKS_FINE + _fine_bin(okey32(x)), tl.full(x.shape, 1, tl.int32), mask=valid,
                      sem="relaxed")


@triton.jit
def topk_spread_zero(pid, nprog, tkf_ptr, W: tl.constexpr):
    """The W rows' fine histograms set to zero, 1024 bins a program step over every program."""
    z = tl.zeros([1024], tl.int32)
    for c in range(pid, W * (TKS_FINE // 1024), nprog):
        tl.store(tkf_ptr + c * 1024 + tl.arange(0, 1024), z)


@triton.jit
def topk_hist_tiles(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, W: tl.constexpr, TOPK: tl.constexpr,
                    TB: tl.constexpr, tkf_ptr=None):
    """Radix pass 0 (and, tkf_ptr given, the spread form's fine histograms) of every row of
    more than TOPK tokens, one TB-score tile of a row a step: what a producer of the scores adds
    as it writes them (`topk_hist_first`, `topk_hist_fine`), as a stage of its own."""
    rows, ns = tk_rows(seqlen_ptr, W)
    cnt = tl.where(ns > TOPK, (ns + TB - 1) // TB, 0)
    first, total = tk_tiles(rows, cnt)
    for t in range(pid, total, nprog):
        m, c, n = tk_locate(t, rows, ns, first, cnt)
        j = c * TB + tl.arange(0, TB)
        x = tl.load(scores_ptr + m * stride_sc + j, mask=j < n, other=0.0)
        topk_hist_first(tkh_ptr, m, x, j < n, n, TOPK)
        if tkf_ptr is not None:
            topk_hist_fine(tkf_ptr, m, x, j < n, n, TOPK)


@triton.jit
def _spread_tiles(seqlen_ptr, W: tl.constexpr, TOPK: tl.constexpr, RK: tl.constexpr, SHORT_TOO: tl.constexpr):
    """The spread stages' tiles, RK keys of one row each, numbered row after row: the rows of
    more than TOPK tokens (and, SHORT_TOO, a row of at most TOPK tokens as its TOPK slots):
    (rows, ns, first, cnt, total)."""
    rows, ns = tk_rows(seqlen_ptr, W)
    long = (ns + RK - 1) // RK
    if SHORT_TOO:
        cnt = tl.where(rows < W, tl.where(ns > TOPK, long, (TOPK + RK - 1) // RK), 0)
    else:
        cnt = tl.where(ns > TOPK, long, 0)
    first, total = tk_tiles(rows, cnt)
    return rows, ns, first, cnt, total


@triton.jit
def _spread_prefix(hb, fb, TOPK: tl.constexpr):
    """A long row's threshold's top 16 bits as its fine bin p (`_fine_bin`), from its complete
    histogram 0 at hb (the top 8 bits) and its fine histogram at fb (the 256 bins under them):
    (p, the keys still to place among p's, p's key count)."""
    b, need, _ = _hist_digit(tl.load(hb + tl.arange(0, 256)), tl.full([], TOPK, tl.int32))
    b1, need, cp = _hist_digit(tl.load(fb + b * 256 + tl.arange(0, 256)), need)
    return b * 256 + b1, need, cp


@triton.jit
def topk_spread_threshold(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkf_ptr, W: tl.constexpr,
                          TOPK: tl.constexpr, SHORT: tl.constexpr, RK: tl.constexpr):
    """The spread form's first stage (`topk_spread` form: rows of at most SHORT tokens, radix
    pass 0's histograms at tkh and the fine histograms at tkf complete): every long row's
    threshold key, found by the tiles that hold its candidates. Histogram 0 gives the
    threshold's top 8 bits b and the keys still to place below them; the 256 fine bins of b give
    its top 16 bits p, the c keys of p and `need`, the keys still to place among them. A tile's
    keys of p are the candidates (a row of 4096 random index scores: tens, where p's top 8 bits
    alone hold about half the row); each counts the row's keys of p above and below it, the row
    read once into registers (the others as KEY_NONE, the least key): the candidate with fewer
    than `need` above and at least `need` at least it is the threshold. Its okey32 goes to the
    row's TKS_WORD and the row's keys above it to TKS_ABOVE (ties store the same values). A row
    of equal keys makes every key a candidate, one at a time."""
    tl.static_assert(SHORT < 65536, "the spread threshold packs counts of at most SHORT in 16 bits")
    rows, ns, first, cnt, total = _spread_tiles(seqlen_ptr, W, TOPK, RK, False)
    j0 = tl.arange(0, RK)
    i = tl.arange(0, SHORT)
    for t in range(pid, total, nprog):
        m, c, n = tk_locate(t, rows, ns, first, cnt)
        hb = tkh_ptr + m * TKH_ROW
        row_ptr = scores_ptr + m * stride_sc
        j = c * RK + j0
        # the tile's keys and the row requested before the histograms' dependent reads (their
        # reductions' barriers held these loads behind them: two more round trips); the row is
        # read whether or not the tile holds a candidate
        mk = okey32(tl.load(row_ptr + j, mask=j < n, other=0.0))
        k = okey32(tl.load(row_ptr + i, mask=i < n, other=0.0))
        p, need, cp = _spread_prefix(hb, tkf_ptr + m * TKS_FINE, TOPK)
        left = (j < n) & (_fine_bin(mk) == p)
        if tl.sum(left.to(tl.int32), 0) > 0:
            k = tl.where((i < n) & (_fine_bin(k) == p), k, KEY_NONE)
            while tl.sum(left.to(tl.int32), 0) > 0:
                r = tl.min(tl.where(left, j0, RK), 0)
                kr = tl.sum(tl.where(j0 == r, mk, 0), 0)
                s = tl.sum((k > kr).to(tl.int32) + ((k < kr).to(tl.int32) << 16), 0)
                above = s & 0xFFFF
                # less the SHORT - cp stand-ins: all below kr unless kr is KEY_NONE itself, the
                # least key, which then has none below it and the test passes either way
                below = (s >> 16) - (SHORT - cp)
                if (above < need) & (cp - below >= need):
                    tl.store(hb + TKS_WORD, kr)
                    tl.store(hb + TKS_ABOVE, TOPK - need + above)
                left = left & (j0 != r)


@triton.jit
def _low_bits(k, cand, need):
    """The threshold's low 16 bits among the keys still in play (cand: keys sharing its top 16
    bits) of a row held in registers, one bit a step from the top: each step one block sum of
    the keys with the bit set, a runtime loop of 16 (compact code, a fixed amount of work
    however many keys tie). Returns (need less the keys above the threshold, cand narrowed to
    the keys equal to it)."""
    for sh in range(15, -1, -1):
        bit = ((k >> sh) & 1) != 0
        c1 = tl.sum((cand & bit).to(tl.int32), 0)
        take = c1 >= need
        cand = cand & (bit == take)
        need = tl.where(take, need, need - c1)
    return need, cand


@triton.jit
def _spread_place(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkf_ptr, topk_ptr, W: tl.constexpr,
                  TOPK: tl.constexpr, SHORT: tl.constexpr, RK: tl.constexpr, SELECT: tl.constexpr):
    """The spread form's placing stage, RK keys a tile: a tile of a long row takes the row's
    threshold and keys above it (SELECT: finds them itself from the histograms and the row in
    registers; else reads `topk_spread_threshold`'s words), counts the row's keys before it above
    and equal to the threshold in one packed sum (the others as KEY_NONE) and places its keys from
    a scan of its own (`_place_keys`); a row of at most TOPK tokens takes 0..n-1 and -1 after."""
    tl.static_assert(SHORT < 65536, "the spread stages pack counts of at most SHORT in 16 bits")
    rows, ns, first, cnt, total = _spread_tiles(seqlen_ptr, W, TOPK, RK, True)
    j0 = tl.arange(0, RK)
    i = tl.arange(0, SHORT)
    for t in range(pid, total, nprog):
        m, c, n = tk_locate(t, rows, ns, first, cnt)
        c0 = c * RK
        j = c0 + j0
        out = topk_ptr + m * TOPK
        if n <= TOPK:
            _place_short(out, j, n, TOPK)
        else:
            row_ptr = scores_ptr + m * stride_sc
            hb = tkh_ptr + m * TKH_ROW
            # the tile's keys requested first: the reductions' barriers below held the load
            # behind them
            mk = okey32(tl.load(row_ptr + j, mask=j < n, other=0.0))
            if SELECT:
                # the row requested before the histograms' dependent reads
                k = okey32(tl.load(row_ptr + i, mask=i < n, other=0.0))
                p, need, _ = _spread_prefix(hb, tkf_ptr + m * TKS_FINE, TOPK)
                cand = (i < n) & (_fine_bin(k) == p)
                need, cand = _low_bits(k, cand, need)
                # cand: the keys equal to the threshold, need of them still to place (at least one)
                thr = tl.max(tl.where(cand, k, KEY_NONE), 0)
                ngt = TOPK - need
                k = tl.where(i < c0, k, KEY_NONE)
            else:
                thr = tl.load(hb + TKS_WORD)
                ngt = tl.load(hb + TKS_ABOVE)
                k = tl.where(i < c0, okey32(tl.load(row_ptr + i, mask=i < c0, other=0.0)), KEY_NONE)
            s = tl.sum((k > thr).to(tl.int32) + ((k == thr).to(tl.int32) << 16), 0)
            # the SHORT - c0 stand-ins equal thr only when thr is KEY_NONE itself
            eqb = (s >> 16) - tl.where(thr == KEY_NONE, SHORT - c0, 0)
            _place_keys(out, j, mk, j < n, thr, s & 0xFFFF, ngt + eqb, TOPK)


@triton.jit
def topk_spread_write(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, topk_ptr, W: tl.constexpr,
                      TOPK: tl.constexpr, SHORT: tl.constexpr, RK: tl.constexpr):
    """The spread form's second stage: every row's top-TOPK placed as `topk_write` places it
    (the keys above the threshold in index order, then its ties in index order until TOPK; a
    row of n <= TOPK tokens takes 0..n-1 and -1 after), RK keys a tile. A tile of a long row
    reads the threshold and the keys above it (`topk_spread_threshold`) and the row's keys
    before the tile once: one sum counts those above the threshold and equal to it; the tile's
    own slots come from a scan of its RK keys, not of the row (`_spread_place`)."""
    _spread_place(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, None, topk_ptr, W, TOPK, SHORT, RK, False)


@triton.jit
def topk_spread_select(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkf_ptr, topk_ptr, W: tl.constexpr,
                       TOPK: tl.constexpr, SHORT: tl.constexpr, RK: tl.constexpr):
    """The spread form in one stage (rows of at most SHORT tokens; radix pass 0's histograms at
    tkh and the fine histograms at tkf complete): every tile of a long row finds the row's
    threshold itself, then places its keys as `topk_spread_write` does (`_spread_place`).
    Histogram 0 and the fine bins give the threshold's top 16 bits and the keys still to place
    there (as `topk_spread_threshold`); the row, requested before those dependent reads and held
    in registers, gives its low 16 bits one bit a step (`_low_bits`): a fixed amount of work a
    tile, however many keys share a digit. Nothing is stored but the top-k."""
    _spread_place(pid, nprog, scores_ptr, stride_sc, seqlen_ptr, tkh_ptr, tkf_ptr, topk_ptr, W, TOPK, SHORT, RK, True)
