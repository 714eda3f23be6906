"""Host side of the standalone GEMV stage: plans (split-K or stream-K), buffers, launch.

    plan = GemvPlan.make(N, K, W, nprog, bn=128, span=True)
    out = run_gemv(plan, x, w, s, fmt="fp8")     # fp32 [W, N] (partials summed in slot order)

Weights: w [L, N, K] uint8 e4m3 bits (or bf16) with s [L, cdiv(N, BLK), K // BLK] fp32, L >= 1
weight sets read one after another (for timing over weights that do not fit the L2).
torch is imported inside the functions.
"""

from __future__ import annotations

import dataclasses

from mono_common.stages.gemv import pick_split_k, span_per, span_slots


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class GemvPlan:
    """Tiling of one GEMV on `nprog` programs."""

    N: int
    K: int
    W: int
    nprog: int
    BN: int
    BLK: int = 128
    span: bool = True  # stream-K spans (else split-K tiles)
    KS: int = 1  # split-K factor (split-K only)
    PER: int = 1  # items a program (stream-K only)
    pre: bool = False
    num_warps: int = 4
    dot: int = 0  # stages.gemv DOT_XW (0), DOT_WX (1), DOT_WX_FP8 (2)
    lstg: int = 0  # k-loops pipelined this deep, every load (0: Triton's default, MMA operands)
    # each weight set's successor requested into the L2 before the set runs (sm_90; `launch_gemv`):
    # 0 / False no, 1 / True a line a lane (`prefetch.prefetch_range`), 2 bulk (`prefetch_bulk`)
    l2_ahead: int = 0
    # the span a call of one copy of its code, its shapes runtime values (`gemv.gemv_span_call`;
    # stream-K only, without pre or lstg)
    call: bool = False
    # x quantised in the loop on sm_90's conversion unit (`gemv._kblock` HWX; the same bits;
    # an NVIDIA GPU only, `launch_gemv`): what a layer's o_proj runs, its input not quantised
    hwx: bool = False

    @property
    def BM(self) -> int:
        # rows padded to a power of two of at least 16, the smallest tl.dot side of both forms
        return max(16, 1 << (self.W - 1).bit_length())

    @property
    def slots(self) -> int:
        return span_slots(self.K, self.BLK, self.PER) if self.span else self.KS

    @staticmethod
    def make(N: int, K: int, W: int, nprog: int, bn: int = 128, span: bool = True, blk: int = 128,
             pre: bool = False, num_warps: int = 4, ks: int | None = None, dot: int = 0,
             lstg: int = 0, l2_ahead: int = 0, call: bool = False, hwx: bool = False) -> GemvPlan:
        if K % blk:
            raise ValueError(f"K={K} is not a multiple of the block {blk}")
        if bn % 16 or bn > 2 * blk:
            raise ValueError(f"column tile {bn} must be a multiple of 16 and at most {2 * blk}")
        if lstg < 0 or (lstg and pre):
            raise ValueError(f"pipelining depth {lstg}: 0 (off) or more, and not with the register prefetch (pre)")
        if int(l2_ahead) not in (0, 1, 2):
            raise ValueError(f"l2_ahead {l2_ahead!r}: 0 (none), 1 (a line a lane) or 2 (bulk prefetches)")
        l2_ahead = int(l2_ahead)
        if call and (not span or pre or lstg):
            raise ValueError("the called span (call) is a stream-K span without pre or lstg")
        nkb = K // blk
        if span:
            return GemvPlan(N, K, W, nprog, bn, blk, True, 1, span_per(N, K, bn, blk, nprog), pre, num_warps, dot,
                            lstg, l2_ahead, call, hwx)
        if ks is None:
            ks = pick_split_k(_cdiv(N, bn), nkb, nprog, cap=nkb)
        if nkb % ks:
            raise ValueError(f"split-K {ks} does not divide the {nkb} K blocks")
        return GemvPlan(N, K, W, nprog, bn, blk, False, ks, 1, pre, num_warps, dot, lstg, l2_ahead, False, hwx)


def alloc_out(plan: GemvPlan, L: int, device):
    """Zeroed partials [L, SLOTS, W, N] (slots no program writes stay zero)."""
    import torch

    return torch.zeros(L, plan.slots, plan.W, plan.N, dtype=torch.float32, device=device)


def fixup_words(plan: GemvPlan, L: int) -> int:
    """int32 words of `launch_gemv`'s fixup buffer: a counter per (weight set, column tile),
    then an epoch slot per program."""
    return L * _cdiv(plan.N, plan.BN) + plan.nprog


def launch_gemv(plan: GemvPlan, x, w, s, out, bar=None, fmt: str = "fp8", barrier: bool = False, xs=None,
                flag: bool = False, fixup=None):
    """One launch over the L = w.shape[0] weight sets (`stages.entries.gemv_entry`); with
    barrier a grid hand-off after each, `entries.grid_handoff` or with flag
    `handoff.grid_handoff_flag` (bar: handoff.BAR_WORDS int32 words). fixup (span plans): each
    column tile's last span sums its partials into slot 0 (`gemv.span_fixup`); True, or the
    int32 buffer of `fixup_words` words (zero before its first launch) that launches reuse.
    plan.l2_ahead requests set l + 1 into the L2 before set l runs (2: as bulk prefetches), on an NVIDIA GPU only
    (`stages.prefetch`: no such instruction elsewhere, and nothing to prefetch into under the
    interpreter); the results are the same."""
    import torch

    from mono_common.stages.entries import gemv_entry
    from mono_common.stages.gemv import FMT_BF16, FMT_FP8
    from mono_common.stages.handoff import BAR_WORDS

    L, N, K = w.shape
    if (N, K) != (plan.N, plan.K) or x.shape != (plan.W, K) or tuple(out.shape[1:]) != (plan.slots, plan.W, N):
        raise ValueError(f"weights {tuple(w.shape)} / x {tuple(x.shape)} do not match the plan {plan}")
    if bar is None:
        bar = torch.zeros(BAR_WORDS, dtype=torch.int32, device=x.device)
    if barrier and flag and bar.numel() < BAR_WORDS:
        raise ValueError(f"the flag hand-off needs a bar of {BAR_WORDS} int32 words, not {bar.numel()}")
    if barrier:
        bar.zero_()
    fix = None
    if fixup is not None and fixup is not False:
        if plan.call:
            raise ValueError("the called span (call) has no fixup form")
        if not plan.span:
            raise ValueError("fixup sums a stream-K span plan's partials: this plan is split-K")
        fix = torch.zeros(fixup_words(plan, L), dtype=torch.int32, device=x.device) if fixup is True else fixup
        if fix.numel() < fixup_words(plan, L) or fix.dtype != torch.int32:
            raise ValueError(f"the fixup buffer needs {fixup_words(plan, L)} int32 words")
    xq = xs is not None
    # sm_90 (an NVIDIA GPU): the conversion on the integer pipes and the L2 prefetch exist
    nv = x.device.type == "cuda" and torch.version.hip is None
    # with a hand-off every program must be resident: a cooperative launch refuses a grid that
    # is not, instead of spinning forever (an 8-warp tile at 255 registers fits once per SM)
    coop = dict(launch_cooperative_grid=True) if barrier and x.device.type == "cuda" else {}
    gemv_entry[(plan.nprog,)](
        x, xs if xq else x, w, s, out, bar, L,
        N=N, K=K, W=plan.W, BM=plan.BM, BN=plan.BN, BLK=plan.BLK, KS=plan.KS, PER=plan.PER, SLOTS=plan.slots,
        SPAN=plan.span, FMT=FMT_FP8.value if fmt == "fp8" else FMT_BF16.value, XQ=xq, PRE=plan.pre, DOT=plan.dot,
        LSTG=plan.lstg,
        # the bf16 MMA forms' weight conversion on sm_90's integer and bf16 pipes (numerics.e4m3_bf16)
        FASTCVT=nv,
        BAR=(2 if flag else 1) if barrier else 0, AMD=x.device.type == "cuda" and torch.version.hip is not None,
        fix_ptr=fix, FIX=fix is not None,
        PFN=plan.l2_ahead if nv else 0, CALL=plan.call,
        # sm_90's conversion unit for an x quantised in the loop (`numerics.e4m3_bits` takes the
        # integer form under the interpreter)
        HWX=plan.hwx and nv and xs is None,
        num_warps=plan.num_warps, **coop)
    return out


def run_gemv(plan: GemvPlan, x, w, s, fmt: str = "fp8", xs=None):
    """fp32 [L, W, N]: every weight set's result, partials summed in slot order on the host.
    xs: x is pre-quantised (e4m3 values as bf16) with these fp32 scales [W, K // BLK]."""
    out = alloc_out(plan, w.shape[0], x.device)
    launch_gemv(plan, x, w, s, out, fmt=fmt, xs=xs)
    acc = out[:, 0].clone()
    for j in range(1, plan.slots):
        acc += out[:, j]
    return acc
