"""The library stages' standalone entries compile for gfx950 and sm_90 on the CPU with zero
spills, at GLM-5.3's shapes and the tilings `mono bench stages` and the layer use, and fit the
resident grid (2 programs per SM on sm_90, 1 per CU on gfx950)."""

import re

import pytest

triton = pytest.importorskip("triton")

from mono_common import compilecheck as cc  # noqa: E402
from mono_common.stages.entries import gemv_entry, gemv_pair_entry  # noqa: E402

GEMV_SIG = {"x_ptr": "*bf16", "xs_ptr": "*fp32", "w_ptr": "*u8", "s_ptr": "*fp32", "out_ptr": "*fp32",
            "bar_ptr": "*i32", "L": "i32", "fix_ptr": "*i32"}
# (K, rows, BN, span, PER, KS, prefetch, warps, dot): the layer's form (128-column stream-K
# spans on e4m3 swap-AB MMAs) at 1, 2 and 8 rows, and the 64-column split-K tile it replaced.
# The register-prefetch forms spill on sm_90 (255 registers): benchmark-only, not compiled here.
GEMV_CASES = [
    (6144, 1, 128, True, 4, 1, False, 4, 2),
    (6144, 2, 128, True, 4, 1, False, 4, 2),
    (2048, 8, 128, True, 2, 1, False, 4, 2),
    (6144, 2, 64, False, 1, 8, False, 4, 0),
]
RESIDENT = {"sm_90": 2, "gfx950": 1}
STAGES = {"sm_90": 3, "gfx950": 2}


@pytest.mark.parametrize("target", ["sm_90", "gfx950"])
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: f"K{c[0]}-r{c[1]}-bn{c[2]}-{'span' if c[3] else 'ks'}")
def test_gemv_entry_compiles_without_spills(target, case, record_property):
    k, rows, bn, span, per, ks, pre, warps, dot = case
    ce = dict(N=6144, K=k, W=rows, BM=max(16, rows), BN=bn, BLK=128, KS=ks, PER=per, SLOTS=8, SPAN=span, FMT=1,
              XQ=False, PRE=pre, DOT=dot, BAR=True, AMD=target == "gfx950")
    # as the layer launches compile: no AMD buffer ops, Triton's default pipelining depth per ISA
    res = cc.compile_kernel(gemv_entry, GEMV_SIG, ce, target, num_warps=warps, pointer_align=16,
                            num_stages=STAGES[target], amd_buffer_ops=False)
    record_property("resources", cc.format_resources(res))
    assert res.spills == 0, cc.format_resources(res)
    assert res.max_resident() >= RESIDENT[target], cc.format_resources(res)


@pytest.mark.parametrize("pfn,insn", [(1, "prefetch.global.L2"), (2, "cp.async.bulk.prefetch.L2.global")],
                         ids=["lines", "bulk"])
def test_gemv_entry_with_the_next_set_requested_ahead_compiles_without_spills(pfn, insn, record_property):
    """bench variants s128fqn / s128fqb (PFN 1 / 2, sm_90 only): the layer's q_a/kv_a form with
    each weight set's successor requested into the L2 first, a line a lane or as bulk
    prefetches; the prefetch instruction is in the PTX and the SASS assembles."""
    ce = dict(N=2624, K=6144, W=1, BM=16, BN=128, BLK=128, KS=1, PER=4, SLOTS=8, SPAN=True, FMT=1, XQ=True,
              PRE=False, DOT=2, BAR=True, AMD=False, PFN=pfn)
    res = cc.compile_kernel(gemv_entry, GEMV_SIG, ce, "sm_90", num_warps=4, pointer_align=16,
                            num_stages=STAGES["sm_90"], amd_buffer_ops=False)
    record_property("resources", cc.format_resources(res))
    assert res.spills == 0, cc.format_resources(res)
    assert res.max_resident() >= RESIDENT["sm_90"], cc.format_resources(res)
    assert insn in res.asm["ptx"]


def test_gemv_entry_quantising_x_on_the_conversion_unit_compiles_smaller(record_property):
    """bench variant s128fh (HWX, sm_90 only): a layer's o_proj form, x quantised in the loop,
    its e4m3 rounding on the conversion unit: 0 spills, two programs an SM, and less SASS than
    the integer form (19.1 against 13.6 KB under Triton 3.8 at [6144 x 2048], 2 rows: the bound
    is the integer form's size less 4 KB)."""
    ce = dict(N=6144, K=2048, W=2, BM=16, BN=128, BLK=128, KS=1, PER=3, SLOTS=6, SPAN=True, FMT=1, XQ=False,
              PRE=False, DOT=2, BAR=True, AMD=False)
    size = {}
    for hwx in (False, True):
        res = cc.compile_kernel(gemv_entry, GEMV_SIG, dict(ce, HWX=hwx), "sm_90", num_warps=4, pointer_align=16,
                                num_stages=STAGES["sm_90"], amd_buffer_ops=False)
        assert res.spills == 0 and res.max_resident() >= RESIDENT["sm_90"], cc.format_resources(res)
        size[hwx] = cc.sass_bytes(res)
    record_property("resources", f"sm_90 SASS bytes: integer form {size[False]}, conversion unit {size[True]}")
    assert size[True] <= size[False] - 4096, size


@pytest.mark.parametrize("target", ["sm_90", "gfx950"])
def test_called_gemv_span_compiles_without_spills(target, record_property):
    """bench variant s128fqc (CALL): the layer's q_a/kv_a form as a call of one copy of the
    span's code, its shapes runtime values (`gemv.gemv_span_call`): one function, called."""
    ce = dict(N=2624, K=6144, W=2, BM=16, BN=128, BLK=128, KS=1, PER=4, SLOTS=8, SPAN=True, FMT=1, XQ=True,
              PRE=False, DOT=2, BAR=True, AMD=target == "gfx950", CALL=True)
    res = _resident_without_spills(gemv_entry, GEMV_SIG, ce, target, record_property, "gemv called span")
    if target == "sm_90":
        ptx = res.asm["ptx"]
        assert len(set(re.findall(r"\.func\s+(\S+?)\(", ptx))) == 1 and "call.uni" in ptx


@pytest.mark.parametrize("target", ["sm_90", "gfx950"])
def test_gemv_span_fixup_compiles_without_spills(target, record_property):
    """The layer's q_a/kv_a form with its column tiles summed by their last span (FIX)."""
    ce = dict(N=2624, K=6144, W=2, BM=16, BN=128, BLK=128, KS=1, PER=5, SLOTS=11, SPAN=True, FMT=1, XQ=True,
              PRE=False, DOT=2, BAR=True, AMD=target == "gfx950", FIX=True)
    res = cc.compile_kernel(gemv_entry, GEMV_SIG, ce, target, num_warps=4, pointer_align=16,
                            num_stages=STAGES[target], amd_buffer_ops=False)
    record_property("resources", cc.format_resources(res))
    assert res.spills == 0, cc.format_resources(res)
    assert res.max_resident() >= RESIDENT[target], cc.format_resources(res)


SMALL = [
    ("topk", "topk_entry", {"scores_ptr": "*fp32", "stride_sc": "i32", "seqlen_ptr": "*i32", "tkh_ptr": "*i32",
                            "tkc_ptr": "*i32", "topk_ptr": "*i32", "nck": "i32", "pass_rt": "i32"},
     [dict(W=8, TOPK=2048, STAGE=st) for st in range(6)] + [dict(W=8, TOPK=2048, STAGE=1, RT=True)]
     + [dict(W=8, TOPK=2048, STAGE=st, ONCE=True) for st in (3, 4, 5)]),
    ("topk_first", "topk_first_entry", {"scores_ptr": "*fp32", "stride_sc": "i32", "seqlen_ptr": "*i32",
                                        "tkh_ptr": "*i32"}, [dict(W=8, TOPK=2048, TB=64)]),
    ("routing", "routing_entry", {"lg_ptr": "*fp32", "bias_ptr": "*fp32", "w_ptr": "*fp32", "used_ptr": "*i32",
                                  "live_ptr": "*i32"},
     [dict(W=8, BM=8, E=256, TOPE=8, KSR=8, LIVE=False), dict(W=8, BM=8, E=256, TOPE=8, KSR=8, LIVE=True)]),
    ("rmsnorm", "rmsnorm_entry", {"x_ptr": "*fp32", "w_ptr": "*bf16", "out_ptr": "*fp32", "eps": "fp32"},
     [dict(D=512)]),
    ("rope", "rope_entry", {"x_ptr": "*fp32", "pos_ptr": "*i64", "cs_ptr": "*fp32", "out_ptr": "*fp32"},
     [dict(RD=64, NEOX=True), dict(RD=64, NEOX=False)]),
    ("hadamard", "hadamard_entry", {"x_ptr": "*fp32", "out_ptr": "*fp32", "hscale": "fp32"}, [dict(D=128)]),
]


@pytest.mark.parametrize("target", ["sm_90", "gfx950"])
@pytest.mark.parametrize("name,entry,sig,variants", SMALL, ids=[c[0] for c in SMALL])
def test_small_entries_compile_without_spills(target, name, entry, sig, variants, record_property):
    from mono_common.stages import entries

    for ce in variants:
        res = cc.compile_kernel(getattr(entries, entry), sig, ce, target, num_warps=4, pointer_align=16,
                                num_stages=STAGES[target], amd_buffer_ops=False)
        record_property("resources", f"{name} {ce}: {cc.format_resources(res)}")
        assert res.spills == 0, cc.format_resources(res)
        assert res.max_resident() >= RESIDENT[target], cc.format_resources(res)


@pytest.mark.parametrize("stage", [4, 5])
def test_topk_short_rows_counted_by_the_write_compile_without_spills_on_sm90(stage, record_property):
    """The top-k's count and write stages with rows of at most 4096 tokens counted by the write
    from their keys (`stages.topk` SHORT, mono-glm53's count_in_write). sm_90 only: on gfx950
    the write's one read of 4096 keys spills 11 SGPRs (Triton 3.8, 8 rows; 63 VGPRs), so the
    layer refuses the knob there."""
    from mono_common.stages import entries

    sig = SMALL[0][2]
    res = cc.compile_kernel(entries.topk_entry, sig, dict(W=8, TOPK=2048, STAGE=stage, SHORT=4096), "sm_90",
                            num_warps=4, pointer_align=16, num_stages=STAGES["sm_90"], amd_buffer_ops=False)
    record_property("resources", cc.format_resources(res))
    assert res.spills == 0, cc.format_resources(res)
    assert res.max_resident() >= RESIDENT["sm_90"], cc.format_resources(res)


@pytest.mark.parametrize("stage", [6, 7], ids=["search", "hist-seeded"])
@pytest.mark.parametrize("target,short", [("sm_90", 4096), ("gfx950", 2048)])
def test_topk_one_program_a_row_compiles_without_spills(target, short, stage, record_property):
    """The whole top-k by one program a row (`topk_rows_one`, entry STAGE 6; 7: its search
    seeded by radix pass 0, mono-glm53's topk_row) at the longest rows each ISA holds without
    spilling: sm_90 4096 keys (128 registers under Triton 3.8 with the threshold search a loop),
    gfx950 2048 (at 4096 it spills 18 bytes, Triton 3.8)."""
    from mono_common.stages import entries

    res = cc.compile_kernel(entries.topk_entry, SMALL[0][2], dict(W=8, TOPK=2048, STAGE=stage, SHORT=short), target,
                            num_warps=4, pointer_align=16, num_stages=STAGES[target], amd_buffer_ops=False)
    record_property("resources", cc.format_resources(res))
    assert res.spills == 0, cc.format_resources(res)
    assert res.max_resident() >= RESIDENT[target], cc.format_resources(res)


SPREAD_SIG = {"scores_ptr": "*fp32", "stride_sc": "i32", "seqlen_ptr": "*i32", "tkh_ptr": "*i32", "tkf_ptr": "*i32",
              "topk_ptr": "*i32"}


@pytest.mark.parametrize("target,stage", [("sm_90", 0), ("sm_90", 1), ("sm_90", 2), ("sm_90", 3), ("gfx950", 0),
                                          ("gfx950", 2)],
                         ids=["sm_90-hist", "sm_90-threshold", "sm_90-write", "sm_90-select", "gfx950-hist",
                              "gfx950-write"])
def test_topk_spread_stages_compile_without_spills(target, stage, record_property):
    """The spread form's stages (`topk_spread_entry`: pass 0 with the fine histograms, the
    threshold, the write, the threshold and write as one stage; mono-glm53's topk_spread and
    topk_spread_select) at rows of 4096 keys, 8 rows in tiles of 128 (`topk.spread_keys` on 264
    programs). The threshold and the one-stage select on gfx950 spill SGPRs (Triton 3.8: the
    row's keys in registers beside the candidate loop, or the bit steps: 41 spilled at the select),
    so mono-glm53 refuses those knobs there."""
    from mono_common.stages import entries

    res = cc.compile_kernel(entries.topk_spread_entry, SPREAD_SIG, dict(W=8, TOPK=2048, STAGE=stage, SHORT=4096, RK=128),
                            target, num_warps=4, pointer_align=16, num_stages=STAGES[target], amd_buffer_ops=False)
    record_property("resources", cc.format_resources(res))
    assert res.spills == 0, cc.format_resources(res)
    assert res.max_resident() >= RESIDENT[target], cc.format_resources(res)


# The linked entries (stages.linked_entries) at the sizes `mono bench stages` runs them: the
# top-k over 200000 keys, sparse MLA of one TP8 rank (8 heads, latent 512 + rope 64) over 2048
# tokens in 64-token chunks as the layer tiles it, partials alone and linked with the combine.
TOPK_LINKED_SIG = {"scores_ptr": "*fp32", "seqlen_ptr": "*i32", "tkh_ptr": "*i32", "tkc_ptr": "*i32",
                   "topk_ptr": "*i32", "bar_ptr": "*i32", "L": "i32"}
MLA_SIG = {"qabs_ptr": "*fp32", "kv_ptr": "*bf16", "topk_ptr": "*i32", "req_ptr": "*i64", "rtt_ptr": "*i32",
           "part_ptr": "*fp32", "ml_ptr": "*fp32", "attn_ptr": "*bf16", "bar_ptr": "*i32", "sm_scale": "fp32",
           "L": "i32"}


def _mla(w, ct, mode, hold=False):
    return dict(W=w, NH=8, KVL=512, RD=64, TOPK=2048, CT=ct, HG=16, MODE=mode, stride_rtt=4096,
                kv_lstride=w * 4096 * 576, HOLD=hold)


LINKED = [
    ("handoff", "handoff_entry", {"bar_ptr": "*i32", "N": "i32"}, [dict(FLAG=False, AMD=False)], ("sm_90", "gfx950")),
    ("topk", "topk_linked_entry", TOPK_LINKED_SIG,
     [dict(W=w, TOPK=2048, stride_sc=200000, nck=782, sc_lstride=w * 200000) for w in (1, 8)], ("sm_90", "gfx950")),
    # the bench's "row" variant: one program a row of 4096 keys, which spills on gfx950 (18 bytes)
    ("topk-row", "topk_linked_entry", TOPK_LINKED_SIG,
     [dict(W=w, TOPK=2048, stride_sc=4096, nck=16, sc_lstride=w * 4096, ROW=4096) for w in (1, 8)], ("sm_90",)),
    # the bench's "spread" variant: radix pass 0, the spread threshold and write, rows of 4096
    # keys (its threshold spills gfx950's SGPRs, as the stage alone)
    ("topk-spread", "topk_linked_entry", TOPK_LINKED_SIG,
     [dict(W=w, TOPK=2048, stride_sc=4096, nck=16, sc_lstride=w * 4096, SPREAD=4096, RK=rk, SEL=sel)
      for w, rk in ((1, 16), (8, 128)) for sel in (False, True)],
     ("sm_90",)),
    ("mla", "mla_entry", MLA_SIG, [_mla(w, 64, m) for w in (1, 8) for m in (0, 2)], ("sm_90", "gfx950")),
    # the bench's 16-token chunks (four times the tiles at one row): the combine unrolled over 128
    # chunks beside the partials holds more than gfx950's 106 SGPRs (5 spilled), so sm_90 only
    ("mla-ct16", "mla_entry", MLA_SIG, [_mla(1, 16, m) for m in (0, 2)], ("sm_90",)),
    # the held-keys chunks (`stages.mla` HOLD) the bench times: 16 and 32 tokens, sm_90 as above
    ("mla-hold", "mla_entry", MLA_SIG, [_mla(w, ct, m, True) for w, ct in ((1, 16), (8, 32)) for m in (0, 2)],
     ("sm_90",)),
]


# each case on the targets it is built for (a benchmark-only variant on its ISA alone)
LINKED_CASES = [pytest.param(t, *c[:4], id=f"{c[0]}-{t}") for c in LINKED for t in c[4]]


@pytest.mark.parametrize("target,name,entry,sig,variants", LINKED_CASES)
def test_linked_entries_compile_without_spills(target, name, entry, sig, variants, record_property):
    from mono_common.stages import linked_entries

    for ce in variants:
        res = cc.compile_kernel(getattr(linked_entries, entry), sig, ce, target, num_warps=4, pointer_align=16,
                                num_stages=STAGES[target], amd_buffer_ops=False)
        record_property("resources", f"{name} {ce}: {cc.format_resources(res)}")
        assert res.spills == 0, cc.format_resources(res)
        # every program of a linked launch must be resident at once
        assert res.max_resident() >= RESIDENT[target], cc.format_resources(res)


def _resident_without_spills(fn, sig, ce, target, record_property, label):
    """An entry compiled as the bench launches it (4 warps, 16-byte aligned pointers, no AMD
    buffer ops), its resources recorded: no spills, and the launch's programs resident."""
    res = cc.compile_kernel(fn, sig, ce, target, num_warps=4, pointer_align=16, num_stages=STAGES[target],
                            amd_buffer_ops=False)
    record_property("resources", f"{label}: {cc.format_resources(res)}")
    assert res.spills == 0, cc.format_resources(res)
    assert res.max_resident() >= RESIDENT[target], cc.format_resources(res)
    return res


# The split hand-off (stages.handoff.grid_handoff_split, a bench form): its RMW polls on both
# ISAs, and on sm_90 its acquire-load polls, which must stay inside the poll loop.
@pytest.mark.parametrize("target,split,ld", [("sm_90", 8, True), ("sm_90", 1, True), ("sm_90", 8, False),
                                             ("gfx950", 8, False)])
def test_split_handoff_compiles_without_spills(target, split, ld, record_property):
    from mono_common.stages import linked_entries

    res = _resident_without_spills(linked_entries.handoff_entry, {"bar_ptr": "*i32", "N": "i32"},
                                   dict(SPLIT=split, LD=ld, AMD=target == "gfx950"), target, record_property,
                                   f"handoff split {split} ld {ld}")
    if ld:
        ptx = res.asm["ptx"]
        # before the poll loop and inside it
        assert ptx.count("ld.acquire.gpu.global.b32") >= 2, "the acquire-load poll left the loop"


# The spin hand-off (stages.handoff.grid_handoff_spin, a bench form, sm_90 only): thread 0's
# poll loop is inline assembly whose labels must stay local to its braces (the entry inlines it
# in a loop, and ptxas refuses a label defined twice), its RMW or load inside that loop.
@pytest.mark.parametrize("ld", [False, True], ids=["rmw", "load"])
def test_spin_handoff_compiles_without_spills_on_sm90(ld, record_property):
    from mono_common.stages import linked_entries

    res = _resident_without_spills(linked_entries.handoff_entry, {"bar_ptr": "*i32", "N": "i32"},
                                   dict(SPIN=True, LD=ld), "sm_90", record_property, f"handoff spin ld {ld}")
    ptx = res.asm["ptx"]
    poll = "ld.acquire.gpu.global.b32" if ld else "atom.acquire.gpu.global.add.u32"
    loops = re.findall(r"LOOP:(.*?)@p bra LOOP;", ptx, re.S)
    assert loops and all(poll in body for body in loops), "the spin poll is not inside its loop"


# The flag hand-off (stages.handoff.grid_handoff_flag, a bench variant beside grid_handoff):
# alone N times and after each weight set of the layer's GEMV form. Its waiters poll with plain
# loads that must stay inside the poll loop: gfx950 needs the ".cv" form (AMD=True), without
# which Triton drops `volatile` and LLVM hoists the load (a hang); sm_90 a volatile load.
@pytest.mark.parametrize("target", ["sm_90", "gfx950"])
@pytest.mark.parametrize("entry", ["handoff", "gemv"])
def test_flag_handoff_compiles_without_spills(target, entry, record_property):
    from mono_common.stages import linked_entries

    amd = target == "gfx950"
    if entry == "handoff":
        fn, sig, ce = linked_entries.handoff_entry, {"bar_ptr": "*i32", "N": "i32"}, dict(FLAG=True, AMD=amd)
    else:
        fn, sig = gemv_entry, GEMV_SIG
        ce = dict(N=6144, K=6144, W=1, BM=16, BN=128, BLK=128, KS=1, PER=4, SLOTS=8, SPAN=True, FMT=1, XQ=True,
                  PRE=False, DOT=2, BAR=2, AMD=amd)
    res = _resident_without_spills(fn, sig, ce, target, record_property, f"{entry} flag")
    if amd:
        text = res.asm["amdgcn"]
        # the poll's load (bypassing the CU's cache) before the loop and inside it
        assert text.count("offset:128 sc0 sc1") >= 2, "the flag poll's load left the loop"
        assert "global_atomic_swap" in text
    else:
        text = res.asm["ptx"]
        assert "ld.volatile.global" in text
        for op in ("atom.global.gpu.acq_rel.add", "atom.global.gpu.release.exch", "atom.global.gpu.acquire.add"):
            assert op in text, op


# `entries.gemv_pair_entry`'s pointer arguments
PAIR_SIG = {"x_ptr": "*bf16", "xs_ptr": "*fp32", "wa_ptr": "*u8", "sa_ptr": "*fp32", "oa_ptr": "*fp32",
            "wb_ptr": "*u8", "sb_ptr": "*fp32", "ob_ptr": "*fp32"}


@pytest.mark.parametrize("target", ["sm_90", "gfx950"])
def test_span_pair_and_joint_compile_without_spills_in_less_code(target, record_property):
    """`gemv.gemv_span_pair` and `gemv.gemv_span_joint` (mono-glm53's knobs qb_pair and qb_joint)
    at the TP8 rank's q_b [2048 x 2048] and the indexer's wq_b [4096 x 2048] on 264 programs (own
    spans PER 1 and 2, joint PER 3), 2 rows, x pre-quantised: no spills, two programs an SM on
    sm_90 (the layer's residency), and on sm_90 less SASS than the two inlined spans (the bound:
    the two spans less 3 KB; 14.6 against 8.4 and 8.3 KB under Triton 3.8)."""
    size = {}
    for mode, pera, perb in ((0, 1, 2), (1, 1, 2), (2, 3, 0)):
        ce = dict(NA=2048, NB=4096, PERA=pera, PERB=perb, K=2048, W=2, BM=16, BN=128, XQ=True, DOT=2, PAIR=mode)
        res = cc.compile_kernel(gemv_pair_entry, PAIR_SIG, ce, target, num_warps=4, pointer_align=16,
                                num_stages=STAGES[target], amd_buffer_ops=False)
        assert res.spills == 0 and res.max_resident() >= RESIDENT[target], cc.format_resources(res)
        if target == "sm_90":
            size[mode] = cc.sass_bytes(res)
    if target == "sm_90":
        record_property("resources", f"sm_90 SASS bytes: two spans {size[0]}, pair {size[1]}, joint {size[2]}")
        assert size[1] <= size[0] - 3072 and size[2] <= size[0] - 3072, size
