"""Random inputs for the library stages' tests (interpreter and GPU alike).

`mla_inputs(plan, ctx, page, gen, short_row)` builds a sparse-MLA decode case for a
`linked_host` MLA plan: qabs [W, NH, KVL + RD] (bf16 values in fp32, as the layer's absorb
stage writes them), a latent cache of W requests x ctx tokens [W * ctx, KVL + RD] bf16 laid out
in shuffled pages of `page` tokens, the request-to-token table [W, ctx] int32, each row's TOPK
distinct positions in index order [W, TOPK] int32 and the request ids [W] int64.
"""

from __future__ import annotations

import torch


def mla_inputs(plan, ctx: int, page: int, gen: torch.Generator, short_row: int | None = None):
    """(q, kv, topk, req, rtt) as the module docstring says. short_row: that row has fewer than
    TOPK tokens, so it selects them all and pads with -1."""
    W, D = plan.W, plan.KVL + plan.RD
    q = torch.randn(W, plan.NH, D, generator=gen).bfloat16().float()
    kv = torch.randn(W * ctx, D, generator=gen).bfloat16()
    pages = torch.randperm(W * ctx // page, generator=gen).view(W, ctx // page)
    rtt = (pages[:, :, None] * page + torch.arange(page)).reshape(W, ctx).int()
    topk = torch.stack([torch.randperm(ctx, generator=gen)[:plan.TOPK].sort().values for _ in range(W)]).int()
    if short_row is not None:
        n = plan.TOPK // 2 + 3
        topk[short_row] = torch.where(torch.arange(plan.TOPK) < n, torch.arange(plan.TOPK), -1).int()
    return q, kv, topk, torch.arange(W, dtype=torch.int64), rtt
