"""Reference of `mono_common.stages.moe`: SwiGLU experts over block-FP8 weights, as SGLang 0.5.23.

  silu_and_mul(x [..., 2I], native=False) -> [..., I]
  expert_mlp(x [T, H], w13 [2I, H], s13, w2 [H, I], s2, blk) -> [T, H] bf16
      one expert (DeepseekV2MLP: the shared expert), x quantised per blk group inside
  routed_experts(x [T, H], ids [T, K], wts [T, K], w13 [E, 2I, H], s13, w2 [E, H, I], s2,
                 routed_scale, blk) -> [T, H] bf16
      every row's listed experts (fused_experts_impl with the FP8 block Triton runner)
  moe_over_slots(x, ids, wts, experts, shared=None, routed_scale=1.0, blk=128) -> [T, H] bf16
      routed experts + the shared expert added in bf16 (DeepseekV2MoE's `routed += shared`)

Weights are e4m3 (or their uint8 bits) with fp32 block scales [cdiv(N, blk), cdiv(K, blk)];
`experts` and `shared` are (w13, s13, w2, s2) tuples. The kernel sums a row's slots in expert-id
order and SGLang's `moe_sum_reduce` in the row's top-k order: the two differ by fp32 rounding
(pass ids sorted per row to compare them op for op). GEMMs run through `ref.fp8.fp8_block_linear`
(exact fp32 on the CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mono_common.ref.fp8 import fp8_block_linear, per_token_group_quant

__all__ = ["silu_and_mul", "expert_mlp", "routed_experts", "moe_over_slots"]

BF16 = torch.bfloat16


def _e4m3(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.float8_e4m3fn) if w.dtype == torch.uint8 else w


def silu_and_mul(x: torch.Tensor, native: bool = False) -> torch.Tensor:
    """SwiGLU on [..., 2I] = [gate | up]. Default: the CUDA `silu_and_mul` kernel (fp32, one
    rounding); `native`: `sglang.srt.layers.activation.SiluAndMul.forward_native` (bf16 ops)."""
    d = x.shape[-1] // 2
    if native:
        return F.silu(x[..., :d]) * x[..., d:]
    g, u = x[..., :d].float(), x[..., d:].float()
    return (F.silu(g) * u).to(x.dtype)


def expert_mlp(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
               blk: int = 128, pre_quant: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """`DeepseekV2MLP.forward` of one FP8 block expert (no reduce): gate_up GEMM -> bf16,
    SiLU-and-mul -> bf16, requantised per blk group, down GEMM -> bf16. x [T, H] bf16;
    `pre_quant` passes x already quantised (q, s). Returns [T, H] bf16."""
    gu = fp8_block_linear(x, _e4m3(w13), s13, blk, pre_quant=pre_quant)
    return fp8_block_linear(silu_and_mul(gu), _e4m3(w2), s2, blk)


def routed_experts(x: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor,
                   w2: torch.Tensor, s2: torch.Tensor, routed_scale: float = 1.0, blk: int = 128) -> torch.Tensor:
    """`FusedMoE` with the FP8 block-128 Triton runner (`fused_experts_impl`): x quantised once
    per token group, per (row, slot) the expert's MLP, its bf16 output times the routing weight
    in fp32 -> bf16 (`intermediate_cache3`), then the fp32 sum over the row's slots in list
    order x routed_scale -> bf16 (`moe_sum_reduce`). Gathers each slot's expert weights
    (data-dependent, graph-capturable). ids [T, K] int, wts [T, K] fp32. Returns [T, H] bf16.
    An id outside [0, E) adds nothing (the slot lists' empty entry; SGLang never makes one)."""
    t, k = ids.shape
    xq, xs = per_token_group_quant(x, blk)
    # an id outside [0, E) is an empty entry (the stage's slot lists): weight 0 on any expert
    valid = (ids >= 0) & (ids < w13.shape[0])
    wts = torch.where(valid, wts.float(), 0.0)
    flat = torch.where(valid, ids, 0).reshape(-1).long()
    g13, gs13 = w13.index_select(0, flat), s13.index_select(0, flat)
    g2, gs2 = w2.index_select(0, flat), s2.index_select(0, flat)
    outs: list[torch.Tensor] = []
    for i in range(t):
        for j in range(k):
            slot = i * k + j
            y = expert_mlp(x[i : i + 1], g13[slot], gs13[slot], g2[slot], gs2[slot], blk,
                           pre_quant=(xq[i : i + 1], xs[i : i + 1]))
            outs.append(y.float() * wts[i, j])
    per_slot = torch.stack(outs, 0).view(t, k, -1).to(BF16)
    return (per_slot.float().sum(dim=1) * routed_scale).to(BF16)


def moe_over_slots(x: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, experts: tuple, shared: tuple | None = None,
                   routed_scale: float = 1.0, blk: int = 128) -> torch.Tensor:
    """What `stages.moe` computes for rows x [T, H] bf16 with per-row lists ids / wts [T, K]:
    the routed experts' weighted sum x routed_scale, plus the shared expert (weight 1) added
    in bf16. Returns [T, H] bf16."""
    out = routed_experts(x, ids, wts, *experts, routed_scale=routed_scale, blk=blk)
    if shared is not None:
        out = (out.float() + expert_mlp(x, *shared, blk=blk).float()).to(BF16)
    return out
