"""Reference of `mono_common.stages.mla`: sparse MLA decode over selected tokens (DSA).

  topk_to_slots(topk [W, TOPK], req [W], req_to_token [reqs, ctx]) -> slots [W, TOPK] (-1 kept)
  sparse_mla(q [W, NH, D], kv [slots, D], slots [W, TOPK], kvl, scale) -> [W, NH, kvl]

What SGLang 0.5.23's `DeepseekSparseAttnBackend.forward_decode` computes for one kv head:
softmax(q . kv[slot] * scale) over the valid selected slots, times kv[slot, :kvl]. The math
runs in q's dtype when it is float64 (the tests' exact reference), else in float32 (as SGLang's
fp32 scores and softmax); the caller rounds to bf16 where it compares with a bf16 output.
"""

from __future__ import annotations

import torch

__all__ = ["topk_to_slots", "sparse_mla"]


def topk_to_slots(topk: torch.Tensor, req: torch.Tensor, req_to_token: torch.Tensor) -> torch.Tensor:
    """Logical token positions to physical cache slots through the request's page table row
    (`transform_index_page_table_decode`); -1 stays -1. Returns int64."""
    rows = req_to_token[req.long()]
    slots = torch.gather(rows, 1, topk.clamp_min(0).long()).long()
    return torch.where(topk >= 0, slots, torch.full_like(slots, -1))


def sparse_mla(q: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, kvl: int, scale: float) -> torch.Tensor:
    """q [W, NH, D] (absorbed nope part | rope part), kv [slots, D], slots [W, TOPK] (-1 =
    none): softmax over the valid slots of (q . kv) * scale, times kv[:, :kvl]."""
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    w, topk = slots.shape
    valid = slots >= 0
    kvs = kv[slots.clamp_min(0).reshape(-1)].to(work).view(w, topk, -1)
    s = torch.bmm(q.to(work), kvs.transpose(1, 2)) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    return torch.bmm(torch.softmax(s, dim=-1), kvs[..., :kvl])
