"""Runs SGLang 0.5.23's KDA and pooled-index Triton kernels under the Triton interpreter.

Run as a script (TRITON_INTERPRET must be set before Triton loads, so the tests start it in a
subprocess): `python sglang_triton_interp.py OUT.pt`. It builds seeded inputs at the tiny
config, runs SGLang's kernels on them and saves inputs and outputs for the tests to compare
with the reference. One change to SGLang's code: `fla.op.exp` is the bare `tl.exp` bound to a
module global, which the interpreter cannot call outside a jit function, so
`fused_recurrent.exp` is replaced by a jit function returning `tl.exp(x)` (the same op).
"""

from __future__ import annotations

import os
import sys
import types

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _exp(x):
    return tl.exp(x)




def kda(out: dict) -> None:
    from sglang.kernels.ops.attention.fla import fused_recurrent as fr

    fr.exp = _exp
    g = torch.Generator().manual_seed(31)
    b, h, k = 4, 3, 32
    inp = {
        "qkv": torch.randn(b, 3 * h * k, generator=g).bfloat16(),
        "a": torch.randn(b, h * k, generator=g).bfloat16(),
        "b": torch.randn(b, h, generator=g).bfloat16(),
        "A_log": torch.log(1 + 15 * torch.rand(h, generator=g)),
        "dt_bias": torch.randn(h * k, generator=g) * 0.5,
        "ssm": torch.randn(6, h, k, k, generator=g) * 0.1,
        "slots": torch.tensor([4, -1, 0, 2], dtype=torch.int32),
    }
    for lb in (None, -5.0):
        ssm = inp["ssm"].clone()
        o = torch.empty(b, 1, h, k, dtype=torch.bfloat16)
        fr.fused_recurrent_kda_packed_decode(
            inp["qkv"], inp["a"], inp["b"], inp["A_log"], inp["dt_bias"], k**-0.5, ssm, o, inp["slots"],
            use_qk_l2norm_in_kernel=True, lower_bound=lb,
        )
        out[f"kda_out_{lb}"], out[f"kda_ssm_{lb}"] = o[:, 0], ssm
    out["kda_in"] = inp


def conv(out: dict) -> None:
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    g = torch.Generator().manual_seed(32)
    b, c, k = 4, 96, 4
    inp = {
        "x": torch.randn(b, c, generator=g).bfloat16(),
        "conv": torch.randn(6, k - 1, c, generator=g).bfloat16(),
        "w": torch.randn(c, k, generator=g) * 0.5,
        "slots": torch.tensor([5, 0, -1, 3], dtype=torch.int32),
    }
    state = inp["conv"].clone()
    y = causal_conv1d_update(inp["x"], state.transpose(-1, -2), inp["w"], None, activation="silu", conv_state_indices=inp["slots"])
    out["conv_in"], out["conv_out"], out["conv_state"] = inp, y, state


def gated_norm(out: dict) -> None:
    from sglang.kernels.ops.attention.fla.fused_norm_gate import layer_norm_gated_fwd

    g = torch.Generator().manual_seed(33)
    inp = {
        "x": torch.randn(12, 128, generator=g).bfloat16(),
        "g": torch.randn(12, 128, generator=g).bfloat16(),
        "w": (1 + 0.1 * torch.randn(128, generator=g)).bfloat16(),
    }
    y, *_ = layer_norm_gated_fwd(
        inp["x"].clone(), inp["g"], inp["w"], None, activation="sigmoid", eps=1e-5, is_rms_norm=True
    )
    out["norm_in"], out["norm_out"] = inp, y


def kpool(out: dict) -> None:
    """`kpool_decode_update_and_maybe_write_cache` at SGLang's real index geometry (D 128,
    64 pooled keys a 256-token page), three requests: one closing a group, one not, a pad."""
    from sglang.srt.layers.attention.dsa import kpool_fp8_index as kp

    g = torch.Generator().manual_seed(34)
    kpool_, d, page = 4, 128, 256
    pool = types.SimpleNamespace(index_kpool=kpool_, tail_extra_slots=0, index_page_size=page // kpool_, index_head_dim=d, page_size=page)
    n_pages, reqs = 5, 3
    req_to_token = torch.zeros(reqs, 2 * page, dtype=torch.int32)
    for r, pages in enumerate(([3, 1], [2, 4], [0, 0])):
        for j, p in enumerate(pages):
            req_to_token[r, j * page : (j + 1) * page] = p * page + torch.arange(page)
    positions = torch.tensor([259, 42, 7])  # 259 % 4 == 3 closes group 64 (page 1 of request 0)
    inp = {
        "tail_k": torch.randn(reqs + 1, kpool_, d, generator=g).bfloat16(),
        "tail_s": torch.randn(reqs + 1, kpool_, d, generator=g).bfloat16(),
        "key": torch.randn(reqs, d, generator=g).bfloat16(),
        "score": torch.randn(reqs, d, generator=g).bfloat16(),
        "ape": torch.randn(kpool_, d, generator=g) * 0.5,
        "req_to_token": req_to_token,
        "positions": positions,
        "seq_lens": (positions + 1).to(torch.int32),
        "out_cache_loc": torch.tensor([int(req_to_token[0, 259]), int(req_to_token[1, 42]), 0]),
        "req_pool_indices": torch.arange(reqs),
    }
    buf = torch.zeros(n_pages, pool.index_page_size * (d + 4), dtype=torch.uint8)
    tail_k, tail_s = inp["tail_k"].clone(), inp["tail_s"].clone()
    page_table_64 = (req_to_token[:, ::64] // 64).contiguous()
    kp.kpool_decode_update_and_maybe_write_cache(
        pool, buf, tail_k, tail_s, inp["key"], inp["score"], inp["ape"], page_table_64,
        inp["req_pool_indices"], positions, inp["seq_lens"], inp["out_cache_loc"], round_scale=True,
    )
    out["kpool_in"], out["kpool_buf"], out["kpool_tail_k"], out["kpool_tail_s"] = inp, buf, tail_k, tail_s
    # The interpreter emulates the e4m3 store with its own rounding (wrong near binade edges
    # and on ties), so the kernel also runs once with an fp32 buffer in place of its fp8 view:
    # the store then keeps the clamped fp32 values the hardware would round to e4m3.
    vals = torch.zeros(buf.numel(), dtype=torch.float32)
    scales = torch.zeros(buf.numel() // 4, dtype=torch.float32)
    kp._kpool_decode_update_and_maybe_write_cache_kernel[(reqs,)](
        vals, scales, inp["tail_k"].clone(), inp["tail_s"].clone(), inp["key"], inp["score"], inp["ape"],
        page_table_64, inp["req_pool_indices"], positions, inp["seq_lens"], inp["out_cache_loc"],
        tail_k.stride(0), tail_k.stride(1), tail_s.stride(0), tail_s.stride(1), inp["key"].stride(0),
        inp["score"].stride(0), inp["ape"].stride(0), page_table_64.stride(0), page_table_64.stride(1),
        REQ_POOL_SIZE=tail_k.shape[0], PAGE_SIZE=page, BUF_NUMEL_PER_PAGE=buf.shape[1],
        PRESHUFFLE_TILE=kp._preshuffle_tile(), POOL_SIZE=kpool_, TAIL_SIZE=tail_k.shape[1], HEAD_DIM=d,
        BLOCK_TABLE_COLS=page_table_64.shape[1], S_OFFSET_NBYTES_IN_PAGE=pool.index_page_size * d,
        ROUND_SCALE=True, BLOCK_D=d, INDEX_PAGE_SIZE=pool.index_page_size,
    )
    out["kpool_values"] = vals.view(n_pages, -1)[:, : pool.index_page_size * d]


def topk_tail(out: dict) -> None:
    """SGLang's expansion of selected groups to tokens and its tail append, on given groups."""
    from sglang.srt.layers.attention.dsa import kpool_fp8_index as kp

    g = torch.Generator().manual_seed(35)
    kpool_, topk = 4, 16
    seq_lens = torch.tensor([43, 9, 16, 3], dtype=torch.int32)
    pool_lens = seq_lens // kpool_
    logits = torch.randn(4, 16, generator=g)
    groups = torch.zeros(4, topk // kpool_, dtype=torch.int32)
    for r in range(4):
        n = min(int(pool_lens[r]), topk // kpool_)
        groups[r, :n] = torch.topk(logits[r, : int(pool_lens[r])], n).indices.int()
    valid = torch.arange(topk // kpool_)[None, :] < torch.minimum(pool_lens, torch.tensor(topk // kpool_))[:, None]
    expanded = kp.expand_pooled_groups_to_topk(groups, valid, topk=topk, kpool=kpool_)
    out["topk_in"] = {"seq_lens": seq_lens, "logits": logits}
    out["topk_out"] = kp.append_kpool_tail_to_topk(expanded, seq_lens, pool_lens.int(), kpool_)


def main(path: str) -> None:
    out: dict = {}
    for part in (kda, conv, gated_norm, kpool, topk_tail):
        try:
            part(out)
        except Exception as exc:  # noqa: BLE001 - report which kernel the interpreter could not run
            out[f"error_{part.__name__}"] = f"{type(exc).__name__}: {exc}"
    torch.save(out, path)


if __name__ == "__main__":
    main(sys.argv[1])
