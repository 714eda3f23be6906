"""GPU (H200) tests of the layer kernel's measurement knobs (`kernels.layer.KNOBS`): each knob set's
fused launch, where programs really race (o_proj's last-arrival sums, the index scores'
histogram atomics), writes the default fused launch's bits: outputs, MLA and index-K caches,
over three steps in a row, with random per-program stage delays on the last."""

import os

import pytest
import torch

# No skipif here: the mono pytest plugin marks tests/kernels `gpu`, skips them without a GPU
# and fails them under --require-gpu.

KNOB_SETS = {
    "oproj_fixup": dict(oproj_fixup=True),
    # the first radix pass as a stage of its own (sm_90's default has it in the index scores)
    "hist_in_scores_off": dict(hist_in_scores=False),
    "gateup_forms": dict(gateup_bn=128, gateup_dot=1),
    "splits": dict(qkva_programs=240, index_split=8, index_tile=128, down_step=2),
    # the integer e4m3 rounding instead of sm_90's conversion unit (the default there): the
    # whole layer's bits the same, as mono-common's test_numerics_gpu finds for each value
    "int_quant": dict(hw_quant=False),
    # the radix passes as one runtime loop, with and without the first pass in the scores; the
    # code probe's two forms (their stores go to an unused stamp entry)
    "radix_loop": dict(radix_loop=True),
    "radix_loop_tk6": dict(radix_loop=True, hist_in_scores=False),
    # every hand-off a call of one copy of its code, with the delays of the third step
    "sync_call": dict(sync_call=True, radix_loop=True),
    "code_pad": dict(code_pad=["mla", 8]),
    # the next layer's first weights requested ahead (here the layer's own: real addresses)
    "next_layer": dict(next_layer_prefetch="down", sync_call=True),
    "code_pad_loop": dict(code_pad=["oproj", -8]),
    # addnorm's rows one program each (the default cuts them in chunks over the programs: 48 of
    # 128 at 2 rows, 24 of 256 at 8)
    "norm_one_program": dict(norm_spread=False),
    # the MoE's weights to bf16 on the integer pipes and bf16 MMAs (the default: to f16 on the
    # conversion unit and f16 MMAs): the same exact products
    "moe_bf16": dict(moe_f16=False),
    # the index keys to bf16 on the integer pipes and bf16 MMAs (the default: to f16 on the
    # conversion unit and f16 MMAs): the same exact products
    "index_bf16": dict(index_f16=False),
    # down's slot ids read once as a vector: the next slot's copies in flight (two slots a
    # step at 8 rows, one at 2)
    "down_ids": dict(down_ids=True),
    # down as (column tile, slot) items in equal spans, each tile summed by its last item's
    # program (a counter a tile, set back to zero by it): 32- and 64-column tiles (64 sets the
    # all-reduce's blocks too)
    "down_items": dict(down_items=True),
    "down_items64": dict(down_items=64),
    # the top-k's write counting the rows itself (ctx 4096: every row, the count stage and its
    # wait left out)
    "count_in_write": dict(count_in_write=True),
    # the SiLU folded into gate_up: each slot's last tile (a counter a slot, set back to zero
    # by it) runs the slot's SiLU, hand-off 19 folded
    "silu_fold": dict(silu_fold=True),
    # the index scores' page table read two tiles ahead, the next tile's keys requested early
    "index_prefetch": dict(index_prefetch=True),
    # the top-k stages' threshold derived once a tile (the default, a TP8 rank on sm_90: once a
    # run of a program's contiguous tiles)
    "radix_per_tile": dict(radix_prefix_once=False),
    # the post-attention norm's rows in chunks over the programs, as addnorm's
    "postnorm_spread": dict(postnorm_spread=True),
    # the weights' L2 prefetches from the last 64 programs only, and from every program (the
    # default, a TP8 rank on sm_90: none): only the timing may change
    "prefetch_64": dict(prefetch_programs=64),
    "prefetch_all": dict(prefetch_programs=True),
    # the prefetches at three of their sites only, o_proj's set after the index scores
    "prefetch_sites": dict(prefetch_sites=["qb", "oproj_late", "down"]),
    # q_b and the indexer's wq_b as one loop over each program's spans of both: the bits of the
    # two span loops (`_BASES`), not of the default's joint GEMV
    "qb_pair": dict(qb_pair=True),
    # o_proj's input rounded to e4m3 by the integer form in its spans (the default: on the
    # conversion unit): the same bits
    "oproj_int_quant": dict(oproj_hw_quant=False),
    # every program's prefetches as bulk prefetches (16 KB an instruction)
    "prefetch_bulk": dict(prefetch_programs=True, prefetch_bulk=True),
    # the whole top-k of a step with rows of at most 4096 tokens in one stage, one program a
    # row (ctx 4096: every step; ctx 1000: rows at most k take the row path's short writer)
    "topk_row": dict(topk_row=True),
    # and the absorption moved beside it, off the index scores' path
    "topk_row_absorb": dict(topk_row=True, topk_row_absorb=True),
    # the radix stages for every step (the default at a TP8 rank on sm_90: a step whose rows
    # all have at most 4096 tokens takes its top-k in two stages on every program,
    # `layer.default_knobs`)
    "topk_spread_off": dict(topk_spread=False),
    # the spread top-k in one stage: each tile finds its row's threshold itself
    "topk_spread_select": dict(topk_spread_select=True),
    # the value projection combining its head's MLA chunks itself, hand-off 14 folded
    "wuv_combine": dict(wuv_combine=True),
    # the post-attention norm in the router's programs (and o_proj's last-span sums), hand-off
    # 17 folded
    "norm_in_router": dict(norm_in_router=True),
    # the absorption tiles summing q_nope per 64-row block (the default at a TP8 rank on sm_90:
    # once for all their chunks, the q_pe RoPE items tiles of their own)
    "absorb_gather_off": dict(absorb_gather=False),
    # every hand-off's wait polled by one thread's loop (mono-common's guard.wait_ge_spin)
    "handoff_spin": dict(handoff_spin=True),
    "all": dict(oproj_fixup=True, hist_in_scores=False, gateup_bn=128, hw_quant=False, radix_loop=True,
                sync_call=True),
}
# the knobs of the build a set's bits are compared with, where not the default's: a set that
# yields a default of other bits (`layer._DEFAULT_YIELDS`) is compared with the build without it
_BASES = {"qb_pair": dict(qb_joint=False)}
_REF = {}
# MONO_KNOB_PART=i/n: only every n-th set from the i-th (bench/gpu_suite.sh runs the sets as n
# pytest processes at once); unset: every set
_PART = os.environ.get("MONO_KNOB_PART", "0/1")
_I, _N = (int(v) for v in _PART.split("/"))


def _default(width, ctx, base=None):
    """The TP8 shard's case and the three fused steps of the default kernel, or of the one with
    the knobs `base` (one per (width, ctx, base))."""
    from mono_glm53.config import REAL
    from mono_glm53.kernels.harness import build_case, kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel
    from mono_glm53.weights import make_weights

    key = (width, ctx, repr(sorted((base or {}).items())))
    if key not in _REF:
        _REF.clear()
        s = REAL.tp_shard(8, 0)
        w = make_weights(s, device="cuda", seed=0)
        c = build_case(s, width, ctx, True, "cuda", seed=41, weights=w)
        k = GlmLayerKernel(s, w, width, max_seq_len=ctx, **(base or {}))
        _REF[key] = (s, w, c, _steps(k, c, kernel_out))
    return _REF[key]


def _steps(k, c, kernel_out):
    got = [kernel_out(c, k, "fused") for _ in range(2)] + [kernel_out(c, k, "fused", delay=2000)]
    k.guard.check()
    return got


@pytest.mark.parametrize("width,ctx", [(2, 4096), (8, 4096)])
@pytest.mark.parametrize("name", list(KNOB_SETS)[_I::_N])
def test_knob_sets_give_the_default_fused_bits(name, width, ctx):
    from mono_glm53.kernels.harness import kernel_out
    from mono_glm53.kernels.layer import GlmLayerKernel

    s, w, c, want = _default(width, ctx, _BASES.get(name))
    k = GlmLayerKernel(s, w, width, max_seq_len=ctx, **KNOB_SETS[name])
    if k.plan.NXS:
        k.next_weights = w
    for step, ((a, ca), (b, cb)) in enumerate(zip(want, _steps(k, c, kernel_out))):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), (name, step)
        assert torch.equal(ca.kv, cb.kv) and torch.equal(ca.index_k, cb.index_k), (name, step)
