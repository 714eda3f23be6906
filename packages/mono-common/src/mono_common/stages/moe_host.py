"""Host side of the standalone MoE expert stage (`stages.moe`): plan, buffers, launch.

    plan = MoePlan.make(H, I, E, K, W, nprog)
    out = run_moe(plan, x, ids, wts, (w13, s13, w2, s2), (wsh13, ssh13, wsh2, ssh2), routed_scale)

x [W, H] bf16 (quantised here per 128-group, as the layer's producer does); ids [L, W, K] int32
and wts [L, W, K] fp32: step l's per-row (expert id, weight) lists (an id outside [0, E) is an
empty entry); routed experts one pool w13 [E, 2I, H] / w2 [E, H, I] uint8 e4m3 bits with fp32
block scales s13 [E, cdiv(2I, 128), H // 128] / s2 [E, H // 128, cdiv(I, 128)]; the shared
expert one per step: wsh13 [L, 2I, H], wsh2 [L, H, I] and their scales. Returns out [L, W, H]
bf16. torch is imported inside the functions.
"""

from __future__ import annotations

import dataclasses

from mono_common.stages.gemv import pick_split_k, span_slots

MAXNREG_SM90 = 255  # registers a thread the CUDA launches may use (`launch_moe`)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class MoePlan:
    """Tiling of one MoE expert stage on `nprog` programs (the GLM-5.3 layer's by default)."""

    H: int
    I: int  # noqa: E741 (the intermediate size, named as in the kernels)
    E: int
    K: int  # entries per row list (top-k)
    W: int
    nprog: int
    BN: int = 64  # gate_up column tile
    BND: int = 32  # down column tile
    BI: int = 128  # SiLU column block
    BLK: int = 128
    KSG: int = 1  # gate_up split-K (span: the partial slots a column tile can receive)
    num_warps: int = 4
    span: bool = False  # gate_up as stream-K spans (`moe._gateup_spans`); a bench variant
    PER: int = 1  # (column tile, K block) items a gate_up span (span only)
    down_stages: int = 0  # down's slot loop pipelined this deep, every load (0: one slot after another)
    fastcvt: bool = False  # e4m3 weights converted on sm_90's integer and bf16 pipes (`numerics.e4m3_bf16`)
    down_step: int = 1  # slots an iteration of the pipelined down loop (1, 2 or 4)
    gate_dot: int = 0  # gate_up's MMA form: 0 x @ w^T, 1 swap-AB w @ x^T (bf16), 2 swap-AB e4m3 (span default)
    gate_stages: int = 0  # gate_up's k-loops pipelined this deep with every load (0: Triton's default)
    down_ids: bool = False  # the pipelined down loop picks the slots' expert ids from registers (moe_down IDV)
    # e4m3 weights converted to f16 on sm_90's conversion unit for f16 MMAs (FASTCVT numerics.CVT_F16),
    # xq and inter held as f16 bits in their bf16 buffers (`pointer_table`): the same exact products
    f16: bool = False
    # down as items (`moe.moe_down_items`: (slot, column tile) items in equal spans, each tile
    # combined by its last item's program), its loop pipelined down_stages deep
    down_items: bool = False
    down_dot: int = 0  # down_items' MMA form: 0 as gate_dot 0 (exact products), 2 e4m3 swap-AB

    @property
    def FASTCVT(self) -> int:
        """The stages' FASTCVT: `numerics.CVT_F16` for f16, else fastcvt."""
        from mono_common.stages.numerics import CVT_F16

        return CVT_F16.value if self.f16 else int(self.fastcvt)

    @property
    def BM(self) -> int:
        return max(16, 1 << (self.W - 1).bit_length())

    @property
    def WP2(self) -> int:
        return max(2, 1 << (self.W - 1).bit_length())

    @property
    def NSLOT(self) -> int:
        # the shared expert and at most every listed expert once
        return 1 + min(self.E, self.W * self.K)

    @staticmethod
    def make(H: int, I: int, E: int, K: int, W: int, nprog: int, bn: int | None = None, bnd: int = 32,  # noqa: E741
             blk: int = 128, ksg: int | None = None, num_warps: int = 4, span: bool = False,
             per: int | None = None, down_stages: int = 0, fastcvt: bool = False, down_step: int = 1,
             gate_dot: int | None = None, gate_stages: int = 0, down_ids: bool = False,
             f16: bool = False, down_items: bool = False, down_dot: int = 0) -> MoePlan:
        """`span`: gate_up as stream-K spans of `per` items (default: the shared expert's and one
        row's top-k items over the grid, as split-K picks its factor), BN 128 unless given;
        else split-K tiles, BN 64 unless given. `down_stages`: down's slot loop pipelined this
        deep (`stages.moe._down_tile_pipelined`); `fastcvt`: sm_90's weight conversion (a CUDA
        launch only; `launch_moe` refuses it elsewhere); `f16`: the weights to f16 and f16 MMAs
        instead (sm_90 too; not with fastcvt, nor with the spans' e4m3 MMA form)."""
        if f16 and (fastcvt or gate_dot == 2 or (span and gate_dot is None)):
            raise ValueError("f16 converts the weights for bf16-form MMAs: not with fastcvt, nor with the spans' "
                             "e4m3 MMA form (gate_dot 2, the span default)")
        if down_stages < 0 or gate_stages < 0:
            raise ValueError(f"pipelining depths {down_stages}, {gate_stages} must be 0 (off) or more")
        if down_step not in (1, 2, 4) or (down_step > 1 and not down_stages):
            raise ValueError(f"down step {down_step}: 1, or 2 or 4 with a pipelined down loop (down_stages > 0)")
        if down_ids and not down_stages:
            raise ValueError("down_ids is a form of the pipelined down loop: give down_stages > 0")
        if down_items and (down_ids or down_step > 1 or not down_stages):
            raise ValueError("down_items is its own down loop: give down_stages > 0 (its depth), without down_ids "
                             "or down_step")
        if down_dot not in (0, 2) or (down_dot and (not down_items or f16)):
            raise ValueError(f"down MMA form {down_dot}: 0, or 2 (e4m3) with down_items and without f16")
        if down_items and W > 8:
            raise ValueError(f"down_items combines at most 8 rows, not {W}")
        if gate_dot is None:
            gate_dot = 2 if span else 0
        if gate_dot not in ((0, 1, 2) if span else (0, 1)):
            raise ValueError(f"gate_up MMA form {gate_dot}: 0 (x @ w^T), 1 (w @ x^T) or, spans only, 2 (e4m3 w @ x^T)")
        loop = dict(down_stages=down_stages, fastcvt=fastcvt, down_step=down_step, gate_dot=gate_dot,
                    gate_stages=gate_stages, down_ids=down_ids, f16=f16, down_items=down_items,
                    down_dot=down_dot)
        if H % blk or H % bnd:
            raise ValueError(f"hidden {H} must be a multiple of the block {blk} and of the down tile {bnd}")
        if bnd > blk:
            raise ValueError(f"down tile {bnd} is wider than the scale block {blk}: a tile reads one block's scale")
        if E & (E - 1):
            raise ValueError(f"expert count {E} must be a power of two (pad the pool)")
        bi = min(128, I)
        if I % bi or bi % blk:
            raise ValueError(f"intermediate {I} does not split into {bi}-column SiLU blocks of {blk}-groups")
        if span:
            bn = 128 if bn is None else bn
            if bn % 16 or bn > 2 * blk:
                raise ValueError(f"column tile {bn} must be a multiple of 16 and at most {2 * blk}")
            if ksg is not None:
                raise ValueError("the span form has no split-K factor (its partial count follows from per)")
            if per is None:
                # the items of the shared expert and one row's top-k cut over the grid: one span a
                # program at one row; more rows use more slots, and the spans are dealt round-robin
                per = _cdiv((1 + K) * _cdiv(2 * I, bn) * (H // blk), nprog)
            if per < 1:
                raise ValueError(f"span length {per} must be at least 1")
            return MoePlan(H, I, E, K, W, nprog, bn, bnd, bi, blk, span_slots(H, blk, per), num_warps, True, per,
                           **loop)
        bn = 64 if bn is None else bn
        if ksg is None:
            # as the GLM-5.3 layer: tiles of the shared expert and one row's top-k cover the grid
            ksg = pick_split_k(_cdiv(2 * I, bn) * (1 + K), H // blk, nprog)
        if (H // blk) % ksg:
            raise ValueError(f"split-K {ksg} does not divide the {H // blk} K blocks")
        return MoePlan(H, I, E, K, W, nprog, bn, bnd, bi, blk, ksg, num_warps, **loop)


def alloc_buffers(plan: MoePlan, L: int, device) -> dict:
    """Scratch, slot tables (one set per step) and the output of L steps; zeroed."""
    import torch

    p = plan
    z = dict(device=device)
    return dict(
        gu=torch.zeros(p.NSLOT, p.KSG, p.W, 2 * p.I, dtype=torch.float32, **z),
        inter=torch.zeros(p.NSLOT, p.W, p.I, dtype=torch.bfloat16, **z),
        inters=torch.zeros(p.NSLOT, p.W, _cdiv(p.I, p.BLK), dtype=torch.float32, **z),
        slot_e=torch.zeros(L, p.NSLOT, dtype=torch.int32, **z),
        slot_w=torch.zeros(L, p.W, p.NSLOT, dtype=torch.float32, **z),
        nslot=torch.zeros(L, dtype=torch.int32, **z),
        out=torch.zeros(L, p.W, p.H, dtype=torch.bfloat16, **z),
        bar=torch.zeros(2, dtype=torch.int32, **z),
        # down_items' weighted slot tiles and column-tile counters (zero between launches)
        z=torch.zeros(p.NSLOT, p.W, p.H, dtype=torch.bfloat16, **z),
        dcnt=torch.zeros(p.H // p.BND, dtype=torch.int32, **z),
    )


def _check(plan: MoePlan, xq, xs, ids, wts, experts, shared):
    p = plan
    L = ids.shape[0]
    w13, s13, w2, s2 = experts
    wsh13, ssh13, wsh2, ssh2 = shared
    want = {
        "xq": (tuple(xq.shape), (p.W, p.H)), "xs": (tuple(xs.shape), (p.W, p.H // p.BLK)),
        "ids": (tuple(ids.shape), (L, p.W, p.K)), "wts": (tuple(wts.shape), (L, p.W, p.K)),
        "w13": (tuple(w13.shape), (p.E, 2 * p.I, p.H)), "w2": (tuple(w2.shape), (p.E, p.H, p.I)),
        "s13": (tuple(s13.shape), (p.E, _cdiv(2 * p.I, p.BLK), p.H // p.BLK)),
        "s2": (tuple(s2.shape), (p.E, p.H // p.BLK, _cdiv(p.I, p.BLK))),
        "wsh13": (tuple(wsh13.shape), (L, 2 * p.I, p.H)), "wsh2": (tuple(wsh2.shape), (L, p.H, p.I)),
        "ssh13": (tuple(ssh13.shape), (L, _cdiv(2 * p.I, p.BLK), p.H // p.BLK)),
        "ssh2": (tuple(ssh2.shape), (L, p.H // p.BLK, _cdiv(p.I, p.BLK))),
    }
    bad = [f"{k} {got} (want {exp})" for k, (got, exp) in want.items() if got != exp]
    if bad:
        raise ValueError(f"MoE stage inputs do not match the plan {plan}: " + "; ".join(bad))
    tensors = (xq, xs, ids, wts, *experts, *shared)
    if not all(t.is_contiguous() for t in tensors):
        raise ValueError("MoE stage inputs must be contiguous (the kernel computes row-major offsets)")


def pointer_table(plan: MoePlan, xq, xs, ids, wts, experts, shared, bufs: dict):
    """The int64 pointer table of `stages.entries.moe_entry` (slots `MOE_*`), on x's device.
    The quantised x goes in as the stages read it: xq itself, or (plan.f16) its values as f16
    bits in a bf16 tensor (exact: e4m3 values), kept in bufs["xk"] while the table points at it."""
    import torch

    from mono_common.stages import entries as EN

    bufs["xk"] = xq.to(torch.float16).view(torch.bfloat16) if plan.f16 else xq
    by_slot = {
        EN.MOE_IDS: ids, EN.MOE_WTS: wts, EN.MOE_XQ: bufs["xk"], EN.MOE_XS: xs,
        EN.MOE_W13: experts[0], EN.MOE_S13: experts[1], EN.MOE_W2: experts[2], EN.MOE_S2: experts[3],
        EN.MOE_WSH13: shared[0], EN.MOE_SSH13: shared[1], EN.MOE_WSH2: shared[2], EN.MOE_SSH2: shared[3],
        EN.MOE_GU: bufs["gu"], EN.MOE_INTER: bufs["inter"], EN.MOE_INTERS: bufs["inters"],
        EN.MOE_SLOT_E: bufs["slot_e"], EN.MOE_SLOT_W: bufs["slot_w"], EN.MOE_NSLOT: bufs["nslot"],
        EN.MOE_OUT: bufs["out"], EN.MOE_BAR: bufs["bar"], EN.MOE_Z: bufs["z"], EN.MOE_DCNT: bufs["dcnt"],
    }
    ptrs = [0] * EN.MOE_NPTR
    for slot, t in by_slot.items():
        i = slot.value
        if i not in EN.MOE_UNALIGNED and t.data_ptr() % 16:
            raise ValueError(f"pointer table slot {i} is not 16-byte aligned (the kernel assumes it is)")
        ptrs[i] = t.data_ptr()
    return torch.tensor(ptrs, dtype=torch.int64, device=xq.device)


def launch_moe(plan: MoePlan, xq, xs, ids, wts, experts, shared, routed_scale: float, bufs: dict,
               staged: bool = False, barrier: bool = False, tab=None, stages: tuple[int, int] = (0, 2)):
    """One launch over the L = ids.shape[0] steps (`stages.entries.moe_entry`), its three stages
    linked by grid hand-offs; `staged`: one launch a stage and step instead (no hand-off, the
    interpreter's mode). xq: x's e4m3 values as bf16 [W, H], xs their fp32 scales. `barrier`:
    a hand-off after each step too. `tab`: the pointer table when the caller keeps one (a
    captured graph must not rebuild it). `stages`: (first, last) of a fused launch, the others
    left out (a bench times gate_up (0, 0) or down (2, 2) alone; down reads the slot tables and
    SiLU output an earlier whole launch left). Returns bufs["out"] [L, W, H] bf16."""
    import torch

    from mono_common.stages.entries import moe_entry

    _check(plan, xq, xs, ids, wts, experts, shared)
    if (plan.fastcvt or plan.f16) and xq.device.type == "cuda" and torch.version.hip:
        raise ValueError("fastcvt and f16 are sm_90's conversions: a HIP device converts with the plain cast "
                         "(fastcvt=False, f16=False)")
    if staged and (barrier or tuple(stages) != (0, 2)):
        raise ValueError("a staged launch has no hand-offs and runs every stage (barrier and stages need the "
                         "fused launch)")
    if not 0 <= stages[0] <= stages[1] <= 2:
        raise ValueError(f"stages {stages} is not (first, last) with 0 <= first <= last <= 2")
    p = plan
    L = ids.shape[0]
    if tab is None:
        tab = pointer_table(plan, xq, xs, ids, wts, experts, shared, bufs)
    # with hand-offs every program must be resident: a cooperative launch refuses a grid that
    # is not, instead of spinning forever
    opts = dict(launch_cooperative_grid=True) if not staged and xq.device.type == "cuda" else {}
    if xq.device.type == "cuda" and not torch.version.hip:
        # the GLM-5.3 layer's register budget (two 4-warp programs an SM); left to itself ptxas
        # capped the pipelined-down forms at 128-168 registers and spilled (sm_90, session 14)
        opts["maxnreg"] = MAXNREG_SM90
    if not staged:
        bufs["bar"].zero_()
    # staged: step by step, since the steps share the scratch (gu, inter) that a stage's
    # launch over every step would overwrite before the next stage read it
    for l0, n in [(li, 1) for li in range(L)] if staged else [(0, L)]:
        for first, last in ((0, 0), (1, 1), (2, 2)) if staged else (tuple(stages),):
            moe_entry[(p.nprog,)](
                tab, float(routed_scale), l0, n,
                W=p.W, BM=p.BM, WP2=p.WP2, H=p.H, E=p.E, K=p.K, I=p.I, BN=p.BN, BND=p.BND, BI=p.BI, BLK=p.BLK,
                KSG=p.KSG, NSLOT=p.NSLOT, FIRST=first, LAST=last, BAR=barrier, SPAN=p.span, PER=p.PER,
                DSTG=p.down_stages, FASTCVT=p.FASTCVT, DSTEP=p.down_step, GDOT=p.gate_dot, GSTG=p.gate_stages,
                IDV=p.down_ids, DIT=p.down_items, DDOT=p.down_dot,
                num_warps=p.num_warps, **opts)
    return bufs["out"]


def quantise_x(x, blk: int = 128):
    """x [W, H] bf16 -> (e4m3 values as bf16, fp32 scales [W, H // blk]) on x's device: the
    per-128-group quantisation the layer's producer applies (`numerics.quant_blocks`), done
    by `ref.fp8.per_token_group_quant` on the CPU, the path the H200 run checked: before
    ref.fp8 divided by a tensor, torch on CUDA divided absmax by 448 as a multiply by the
    reciprocal, other scales and codes than the kernel's, the stage's output ~2 % off."""
    import torch

    from mono_common.ref.fp8 import per_token_group_quant

    q, s = per_token_group_quant(x.cpu(), blk)
    return q.to(torch.bfloat16).contiguous().to(x.device), s.contiguous().to(x.device)


def run_moe(plan: MoePlan, x, ids, wts, experts, shared, routed_scale: float = 1.0, staged: bool = False):
    """out [L, W, H] bf16 of every step (x quantised here)."""
    xq, xs = quantise_x(x, plan.BLK)
    bufs = alloc_buffers(plan, ids.shape[0], x.device)
    return launch_moe(plan, xq, xs, ids, wts, experts, shared, routed_scale, bufs, staged=staged).clone()
