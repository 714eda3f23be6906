"""The layer kernel's pointer table: which tensor each slot of a row holds, and its dtype.

The kernel takes one device table (int64 addresses) instead of ~80 pointer arguments and
loads each pointer in the stage that uses it, so a pointer is live for one stage only: on
gfx950 the arguments otherwise sit in scalar registers for the whole launch and spill
(~230 SGPRs at the TP8 shard). A side-by-side launch of R simulated ranks passes R rows.

`SLOTS` then `SCALARS` is the row layout; `<NAME>` (upper case) is the slot index as a Triton constexpr,
what the kernel reads as `P.<NAME>`; `DTYPES` is the element type the kernel casts each slot
to, and the host checks every tensor it puts in a table against it (and its alignment).
"""

import triton.language as tl

SLOTS = (
    ("x", "bf16"),
    ("res", "bf16"),
    ("pos", "i64"),
    ("loc", "i64"),
    ("seqlen", "i32"),
    ("req", "i64"),
    ("rtt", "i32"),
    ("prev_topk", "i32"),
    ("kv_cache", "bf16"),
    ("idx_cache", "u8"),
    ("cs", "fp32"),
    ("w_in", "bf16"),
    ("wqkv", "u8"),
    ("sqkv", "fp32"),
    ("wqa", "bf16"),
    ("wkva", "bf16"),
    ("wqb", "u8"),
    ("sqb", "fp32"),
    ("wkc", "bf16"),
    ("wvc", "bf16"),
    ("wo", "u8"),
    ("so", "fp32"),
    ("w_post", "bf16"),
    ("wg", "bf16"),
    ("bias", "fp32"),
    ("w13", "u8"),
    ("s13", "fp32"),
    ("w2", "u8"),
    ("s2", "fp32"),
    ("wsh13", "u8"),
    ("ssh13", "fp32"),
    ("wsh2", "u8"),
    ("ssh2", "fp32"),
    ("wiq", "u8"),
    ("siq", "fp32"),
    ("wk", "u8"),
    ("sk", "fp32"),
    ("wwp", "bf16"),
    ("lnw", "fp32"),
    ("lnb", "fp32"),
    ("out", "bf16"),
    ("res_out", "bf16"),
    ("topk", "i32"),
    ("resid1", "bf16"),
    ("hn", "bf16"),
    ("hnq", "bf16"),
    ("hns", "fp32"),
    ("qkva", "fp32"),
    ("ikw", "fp32"),
    ("qn", "bf16"),
    ("qnq", "bf16"),
    ("qns", "fp32"),
    ("rope", "fp32"),
    ("iwraw", "fp32"),
    ("qb", "fp32"),
    ("iq", "fp32"),
    ("qabs", "fp32"),
    ("iq8", "fp32"),
    ("iwt", "fp32"),
    ("scores", "fp32"),
    ("tkh", "i32"),
    ("tkc", "i32"),
    ("tkfine", "i32"),
    ("part", "fp32"),
    ("ml", "fp32"),
    ("attn", "bf16"),
    ("ov", "bf16"),
    ("op", "fp32"),
    ("h2", "bf16"),
    ("h2q", "bf16"),
    ("h2s", "fp32"),
    ("lg", "fp32"),
    ("gu", "fp32"),
    ("slot_e", "i32"),
    ("slot_w", "fp32"),
    ("nslot", "i32"),
    ("inter", "bf16"),
    ("inters", "fp32"),
    ("mz", "bf16"),
    ("ap", "bf16"),
    ("ar1", "bf16"),
    ("dp", "bf16"),
    ("cnt", "i32"),
    ("epoch", "i32"),
    ("abort", "i32"),
    ("abort_tab", "i64"),
    ("err", "i64"),
    ("ar1_mbox", "i64"),
    ("ar1_flag", "i64"),
    ("ar2_mbox", "i64"),
    ("ar2_flag", "i64"),
    ("stamps", "i64"),
)
# Scalars of the launch, after the pointers (fp32 in the low 4 bytes of the slot): as kernel
# arguments they too would hold scalar registers for the whole launch. rank, the guard's
# deadline, the injected delay and the fault stage are per row, so ranks side by side in one
# launch each read their own.
SCALARS = (
    ("eps", "fp32"),
    ("ln_eps", "fp32"),
    ("sm_scale", "fp32"),
    ("iwa", "fp32"),
    ("iwb", "fp32"),
    ("hscale", "fp32"),
    ("routed_scale", "fp32"),
    ("max_pages", "i32"),
    ("stride_rtt", "i32"),
    ("stride_sc", "i32"),
    ("rank", "i32"),
    ("deadline", "i64"),
    ("delay", "i64"),
    ("stall", "i32"),
    ("stamp", "i32"),
    # the next layer's first weights (its fused q_a/kv_a, index wk and weights_proj), requested
    # into the L2 by this launch with Plan.NXS (0: none): addresses, not tensors the launch
    # reads, so they sit after every other word
    ("next_wqkv", "i64"),
    ("next_wk", "i64"),
    ("next_wwp", "i64"),
)
NSLOTS = tl.constexpr(len(SLOTS) + len(SCALARS))  # the row width
DTYPES = dict(SLOTS)
# Every slot but these holds a 16-byte aligned address (checked on the host): the kernel tells
# Triton so, as Triton assumes of an aligned pointer argument. The abort word of rank r is
# 8 * r bytes into the guard's table.
ALIGN = tl.constexpr(16)
UNALIGNED = frozenset({"abort"})

for _i, (_name, _dtype) in enumerate(SLOTS + SCALARS):
    globals()[_name.upper()] = tl.constexpr(_i)
del _i, _name, _dtype
