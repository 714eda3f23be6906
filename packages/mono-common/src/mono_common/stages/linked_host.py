"""Host side of `stages.linked_entries`: buffers and launches.

    topk = run_topk_linked(scores [W, n] fp32, seqlen [W] int32, k, nprog)   # [W, k] int32
    attn = run_mla(MlaPlan(W, NH, KVL, RD, TOPK), qabs, kv [S, KVL + RD] bf16, topk, req, rtt,
                   sm_scale, nprog, linked=False)                             # [W, NH, KVL] bf16
    launch_handoffs(bar, n, nprog, flag=False, split=0, ld=False)
For timing, `topk_buffers` / `launch_topk_linked` and `mla_buffers` / `launch_mla` take L sets
([L, W, n] scores, [L, S, D] caches) with buffers made once. A launch that hands off zeroes its
hand-off counter first (a memset before the kernel, captured with it in a graph) and is
cooperative on CUDA: it then fails to launch when the grid cannot be resident instead of
spinning forever. torch is imported inside the functions.
"""

from __future__ import annotations

import dataclasses


def _coop(device) -> dict:
    return dict(launch_cooperative_grid=True) if device.type == "cuda" else {}


def _amd(device) -> bool:
    """A ROCm device (torch names it "cuda"): `handoff.grid_handoff_flag`'s AMD polling load."""
    import torch

    return device.type == "cuda" and torch.version.hip is not None


@dataclasses.dataclass
class TopkBuffers:
    tkh: object  # [2, W, TKH_ROW] int32, zero at allocation (the launch keeps it zero)
    tkc: object  # [W, nck, 2] int32
    topk: object  # [W, k] int32
    bar: object  # [2] int32
    nck: int
    tkf: object = None  # [2, W, topk.TKS_FINE] int32, zero at allocation: the spread form's fine histograms


def topk_buffers(rows: int, n: int, k: int, device, spread: bool = False) -> TopkBuffers:
    """spread: with the spread form's fine histograms (`launch_topk_linked` spread)."""
    import torch

    from mono_common.stages.topk import TKC, TKH_ROW, TKS_FINE

    nck = -(-n // TKC.value)
    z = dict(dtype=torch.int32, device=device)
    return TopkBuffers(torch.zeros(2, rows, TKH_ROW.value, **z), torch.zeros(rows, nck, 2, **z),
                       torch.full((rows, k), -1, **z), torch.zeros(2, **z), nck,
                       torch.zeros(2, rows, TKS_FINE.value, **z) if spread else None)


def launch_topk_linked(scores, seqlen, bufs: TopkBuffers, nprog: int, row: int = 0, hist: bool = False,
                       spread: int = 0, select: bool = False):
    """One launch over the L = scores.shape[0] score sets [L, W, >= n]; bufs.topk ends as the
    last set's top-k. An odd L leaves one tkh slice dirty: the next launch on bufs would read it.
    row > 0 (a power of two at least the sets' row length): one program a row
    (`topk.topk_rows_one`) and one hand-off a set, the histograms untouched; with hist, radix pass 0
    and a hand-off first, its histograms seeding the rows' search (`topk.topk_row` HIST).
    spread > 0 (a power of two at least the rows' length): radix pass 0 with the fine histograms
    (bufs made with spread), then the spread form's two stages (`topk.topk_spread_threshold` /
    `topk_spread_write`), three hand-offs a set; with select the two as one stage
    (`topk.topk_spread_select`), two hand-offs a set."""
    from mono_common.stages.linked_entries import topk_linked_entry
    from mono_common.stages.topk import spread_keys

    L, W, n = scores.shape
    if scores.stride(2) != 1 or tuple(bufs.topk.shape) != (W, bufs.topk.shape[1]):
        raise ValueError(f"scores {tuple(scores.shape)} do not match the buffers of {tuple(bufs.topk.shape)}")
    if row and (row & (row - 1) or n > row):
        raise ValueError(f"row {row} must be a power of two of at least the rows' {n} keys")
    if hist and not row:
        raise ValueError("hist seeds the one-program-a-row search: give row (a power of two) with it")
    if spread and (spread & (spread - 1) or n > spread or row):
        raise ValueError(f"spread {spread} must be a power of two of at least the rows' {n} keys, without row")
    if select and not spread:
        raise ValueError("select is a form of the spread top-k: give spread (a power of two) with it")
    if spread and bufs.tkf is None:
        raise ValueError("spread needs the fine histograms: make the buffers with topk_buffers(..., spread=True)")
    bufs.bar.zero_()
    topk_linked_entry[(nprog,)](scores, seqlen, bufs.tkh, bufs.tkf if spread else bufs.tkc, bufs.topk, bufs.bar, L,
                                stride_sc=scores.stride(1), nck=bufs.nck, sc_lstride=scores.stride(0), W=W,
                                TOPK=bufs.topk.shape[1], ROW=row, HIST=hist, SPREAD=spread,
                                RK=spread_keys(W, spread, nprog) if spread else 16, SEL=select,
                                **_coop(scores.device))
    return bufs.topk


def run_topk_linked(scores, seqlen, k: int, nprog: int, row: int = 0, hist: bool = False, spread: int = 0,
                    select: bool = False):
    """[W, k] int32: the top-k of scores [W, n] as one launch of the six linked stages (row > 0:
    of one program a row, `launch_topk_linked`; hist: seeded by radix pass 0; spread > 0: the
    spread form; select: in one stage)."""
    bufs = topk_buffers(scores.shape[0], scores.shape[1], k, scores.device, spread=bool(spread))
    return launch_topk_linked(scores[None], seqlen, bufs, nprog, row, hist, spread, select).clone()


@dataclasses.dataclass(frozen=True)
class MlaPlan:
    """Sparse MLA of W rows, NH heads, latent KVL + rope RD, TOPK selected tokens, CT tokens a
    chunk, HG heads a tile (the layer: CT = 64, HG = 16); HOLD: a chunk's keys held for both
    products (`stages.mla`, CT * KVL <= its HOLD_KEYS)."""

    W: int
    NH: int
    KVL: int = 512
    RD: int = 64
    TOPK: int = 2048
    CT: int = 64
    HG: int = 16
    num_warps: int = 4
    HOLD: bool = False

    @property
    def nch(self) -> int:
        return self.TOPK // self.CT


def mla_buffers(plan: MlaPlan, device) -> dict:
    import torch

    f32 = dict(dtype=torch.float32, device=device)
    return dict(part=torch.empty(plan.W, plan.NH, plan.nch, plan.KVL, **f32),
                ml=torch.empty(plan.W, plan.NH, plan.nch, 2, **f32),
                attn=torch.empty(plan.W, plan.NH, plan.KVL, dtype=torch.bfloat16, device=device),
                bar=torch.zeros(2, dtype=torch.int32, device=device))


MLA_PARTIAL, MLA_COMBINE, MLA_LINKED = 0, 1, 2


def launch_mla(plan: MlaPlan, qabs, kv, topk, req, rtt, sm_scale: float, bufs: dict, nprog: int, mode: int):
    """One launch (`linked_entries.mla_entry`, MODE = mode) over the L = kv.shape[0] latent
    caches [L, S, KVL + RD] bf16. qabs [W, NH, KVL + RD] fp32, topk [W, TOPK] int32 logical
    positions (-1 none), req [W] int64, rtt [reqs, stride] int32 (req_to_token)."""
    from mono_common.stages.linked_entries import mla_entry
    from mono_common.stages.mla import HOLD_KEYS

    p = plan
    if p.TOPK % p.CT or qabs.shape != (p.W, p.NH, p.KVL + p.RD) or kv.shape[2] != p.KVL + p.RD:
        raise ValueError(f"qabs {tuple(qabs.shape)} / kv {tuple(kv.shape)} do not match {p}")
    if tuple(topk.shape) != (p.W, p.TOPK):
        raise ValueError(f"topk {tuple(topk.shape)} is not [{p.W}, {p.TOPK}]")
    if p.HOLD and p.CT * p.KVL > HOLD_KEYS.value:
        raise ValueError(f"HOLD keeps a chunk's [CT, KVL] = [{p.CT}, {p.KVL}] keys in registers: "
                         f"CT * KVL must be at most {HOLD_KEYS.value} (CT <= {HOLD_KEYS.value // p.KVL})")
    linked = mode == MLA_LINKED
    if linked:
        bufs["bar"].zero_()
    mla_entry[(nprog,)](qabs, kv, topk, req, rtt, bufs["part"], bufs["ml"], bufs["attn"], bufs["bar"], sm_scale,
                        kv.shape[0], stride_rtt=rtt.stride(0), kv_lstride=kv.stride(0), W=p.W, NH=p.NH, KVL=p.KVL,
                        RD=p.RD, TOPK=p.TOPK, CT=p.CT, HG=p.HG, MODE=mode, HOLD=p.HOLD, num_warps=p.num_warps,
                        **(_coop(qabs.device) if linked else {}))
    return bufs["attn"]


def run_mla(plan: MlaPlan, qabs, kv, topk, req, rtt, sm_scale: float, nprog: int, linked: bool = False):
    """attn [W, NH, KVL] bf16 over one cache kv [S, KVL + RD]: staged (partials, then the
    combine, one launch each) or linked (one launch with the hand-offs)."""
    bufs = mla_buffers(plan, qabs.device)
    if linked:
        launch_mla(plan, qabs, kv[None], topk, req, rtt, sm_scale, bufs, nprog, MLA_LINKED)
    else:
        for mode in (MLA_PARTIAL, MLA_COMBINE):
            launch_mla(plan, qabs, kv[None], topk, req, rtt, sm_scale, bufs, nprog, mode)
    return bufs["attn"].clone()


def launch_handoffs(bar, n: int, nprog: int, flag: bool = False, split: int = 0, ld: bool = False,
                    spin: bool = False):
    """One launch of n back-to-back grid hand-offs over nprog programs: `entries.grid_handoff`,
    or with flag `handoff.grid_handoff_flag` (bar: handoff.BAR_WORDS int32 words, the counter
    at 0 and the flag at handoff.FLAG_WORD), or with split >= 1 `handoff.grid_handoff_split`
    over that many counters (bar: split * handoff.LINE_WORDS + 2 words), polled with acquire loads
    when ld (an NVIDIA device only: `handoff.load_acquire`), or with spin
    `handoff.grid_handoff_spin` (one thread's poll loop, its acquire RMWs or with ld loads; an
    NVIDIA device only)."""
    from mono_common.stages.handoff import BAR_WORDS, LINE_WORDS, SPLIT_MAX
    from mono_common.stages.linked_entries import handoff_entry

    if flag and split:
        raise ValueError("a hand-off is the flag form or the split form, not both")
    if spin and (flag or split):
        raise ValueError("the spin hand-off polls the one counter: not with the flag or split forms")
    if flag and bar.numel() < BAR_WORDS:
        raise ValueError(f"the flag hand-off needs a bar of {BAR_WORDS} int32 words, not {bar.numel()}")
    if split and not 1 <= split <= SPLIT_MAX:
        raise ValueError(f"the split hand-off spreads arrivals over 1..{SPLIT_MAX} counters, not {split}")
    if split and bar.numel() < split * LINE_WORDS.value + 2:
        raise ValueError(f"the split hand-off over {split} counters needs a bar of {split * LINE_WORDS.value + 2} "
                         f"int32 words, not {bar.numel()}")
    if ld and (bar.device.type != "cuda" or _amd(bar.device)):
        raise ValueError(f"acquire-load polls are sm_90 inline assembly: {bar.device} cannot run them")
    if spin and (bar.device.type != "cuda" or _amd(bar.device)):
        raise ValueError(f"the spin hand-off's poll loop is sm_90 inline assembly: {bar.device} cannot run it")
    bar.zero_()
    handoff_entry[(nprog,)](bar, n, FLAG=flag, AMD=_amd(bar.device), SPLIT=split, LD=ld, SPIN=spin,
                            **_coop(bar.device))
    return bar
