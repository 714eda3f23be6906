"""References of the norms (`mono_common.stages.norm`), as SGLang 0.5.23 computes them.

  rms_norm(x [..., D], weight [D], eps, residual=None) -> out (or (out, new residual))
  layer_norm(x [..., D], weight [D] fp32, bias [D] fp32, eps) -> x's dtype
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["rms_norm", "layer_norm"]


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
):
    """Mirrors `sglang.srt.layers.layernorm.RMSNorm.forward_native` (fused_add_rms_norm on CUDA
    computes the same: fp32 add, residual stored in x's dtype, variance of the fp32 sum).
    Returns out, or (out, new residual) when `residual` is given."""
    orig = x.dtype
    xf = x.float()
    if residual is not None:
        xf = xf + residual.float()
        residual = xf.to(orig)
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    xf = xf * torch.rsqrt(var + eps)
    out = (xf * weight).to(orig)
    return out if residual is None else (out, residual)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """Mirrors `sglang.srt.layers.layernorm.LayerNorm.forward_native` with fp32 params (the
    indexer's `k_norm`): fp32 layer norm, cast back to x's dtype."""
    return F.layer_norm(x.float(), (x.shape[-1],), weight=weight, bias=bias, eps=eps).to(x.dtype)
