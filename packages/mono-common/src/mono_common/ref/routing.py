"""Reference of `mono_common.stages.routing`: biased top-k expert routing, as SGLang 0.5.23.

  biased_topk(logits [T, E], bias [E], top_k, renormalize, routed_scaling) ->
      (weights [T, top_k] fp32, ids [T, top_k] int32, unsorted)
"""

from __future__ import annotations

import torch

__all__ = ["biased_topk"]


def biased_topk(logits: torch.Tensor, correction_bias: torch.Tensor, top_k: int, renormalize: bool = True,
                routed_scaling: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mirrors `sglang.srt.layers.moe.topk.biased_topk_impl` (= `biased_grouped_topk_impl` with
    n_group = topk_group = 1, what the CUDA `moe_fused_gate` computes): fp32 sigmoid scores,
    choose top-k of scores + bias, gather the unbiased scores, renormalise with an fp32 sum
    + 1e-20, optionally x routed_scaling (SGLang applies it here only when the MoE runner fuses
    it; on the H200 triton/DeepGEMM runners it is applied to the expert sum instead)."""
    scores = logits.float().sigmoid()
    choice = scores + correction_bias.view(1, -1).float()
    _, ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)
    wts = scores.gather(1, ids)
    if renormalize:
        wts = wts / (wts.sum(dim=-1, keepdim=True, dtype=torch.float32) + 1e-20)
    if routed_scaling is not None:
        wts = wts * routed_scaling
    return wts.float(), ids.to(torch.int32)
