"""Reference of `mono_common.stages.gemv`: x [W, K] @ w [N, K]^T over block-FP8 or bf16 weights.

`block_fp8_gemv(x, w, s, blk)` quantises x per row and K block (SGLang's per_token_group_quant)
and returns fp64 sum_kb (xq_kb . wq_kb) * s_x[row, kb] * s_w[col // blk, kb] as fp32 [W, N]:
the value the kernel approximates with fp32 accumulation. `bf16_gemv(x, w)` likewise in fp64.
"""

from __future__ import annotations

import torch

from mono_common.ref.fp8 import per_token_group_quant

__all__ = ["block_fp8_gemv", "bf16_gemv"]


def block_fp8_gemv(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, blk: int = 128) -> torch.Tensor:
    """x [W, K] bf16, w [N, K] e4m3 (or its uint8 bits), s [cdiv(N, blk), K // blk] fp32."""
    n, k = w.shape
    if w.dtype == torch.uint8:
        w = w.view(torch.float8_e4m3fn)
    xq, xs = per_token_group_quant(x, blk)
    nkb = k // blk
    xd = xq.double().view(-1, nkb, blk)
    wd = w.double().view(n, nkb, blk)
    per_block = torch.einsum("mbk,nbk->mnb", xd, wd)  # [W, N, nkb], exact in fp64
    sw = s.double().repeat_interleave(blk, dim=0)[:n]  # [N, nkb]
    return (per_block * xs.double()[:, None, :] * sw[None, :, :]).sum(-1).float()


def bf16_gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [W, K] bf16, w [N, K] bf16 -> fp32 [W, N] (fp64 sums)."""
    return (x.double() @ w.double().t()).float()
