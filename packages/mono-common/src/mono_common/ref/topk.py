"""Reference of `mono_common.stages.topk`: the exact top-k with its index-order rule.

  order_keys(x fp32) -> int64 keys whose integer order is the stage's order of the scores
  topk_index_order(scores [W, >= n] fp32, seqlen [W], k) -> [W, k] int64, the stage's output
      exactly: the keys above the k-th largest in index order, then the keys equal to it in
      index order until k are placed; a row of n <= k tokens takes 0..n-1, then -1

The set equals `torch.topk`'s whenever the k-th largest score is not tied (SGLang's indexer
top-k picks the same set; among ties SGLang's kernels may pick other indices).
"""

from __future__ import annotations

import torch

__all__ = ["order_keys", "topk_index_order"]


def order_keys(x: torch.Tensor) -> torch.Tensor:
    """The stage's `okey`: fp32 bits made order-preserving (so -0.0 sorts below +0.0)."""
    b = x.float().contiguous().view(torch.int32).long()
    return (b ^ ((b >> 31) & 0x7FFFFFFF)) + 2**31


def topk_index_order(scores: torch.Tensor, seqlen: torch.Tensor, k: int) -> torch.Tensor:
    out = torch.full((scores.shape[0], k), -1, dtype=torch.int64)
    for m, n in enumerate(seqlen.tolist()):
        if n <= k:
            out[m, :n] = torch.arange(n)
            continue
        key = order_keys(scores[m, :n].cpu())
        thr = torch.topk(key, k).values[-1]
        above = torch.nonzero(key > thr).flatten()
        ties = torch.nonzero(key == thr).flatten()[: k - above.numel()]
        out[m] = torch.cat([above, ties])
    return out
