"""The GLM-5.3 reference layer, its weight and cache layouts, on the CPU (no sglang needed).

Fresh random inputs per test (seeded per test so a failure reproduces). Tolerances: the
reference rounds to bf16 where SGLang does, so two mathematically equal computations that
round in different places (TP shards vs TP1, fused vs unfused indexer) differ by a few bf16
ulps per element and by the FP8 requantisation those ulps can flip; bounds say why.
"""

from __future__ import annotations

import copy

import pytest
import torch

from mono_common.ref import fp8, rope
from mono_glm53 import bench
from mono_glm53 import reference as R
from mono_glm53.config import REAL, GlmLayerShape, tiny
from mono_glm53.weights import (
    FP8_GEMM_WEIGHTS,
    aiter_layout,
    make_caches,
    make_weights,
    shard_weights,
    shuffle_weight_16x16,
    weight_bytes,
)


def _case(s, batch=3, ctx=40, seed=0):
    w = make_weights(s, seed=seed)
    inp, c = make_caches(s, batch, ctx, seed=seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    hid = torch.randn(batch, s.hidden, generator=g).bfloat16()
    res = torch.randn(batch, s.hidden, generator=g).bfloat16()
    return w, inp, c, hid, res


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# ---- config ------------------------------------------------------------------------------
def test_real_config_matches_hf_defaults():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GlmMoeDsaConfig()
    assert GlmLayerShape.from_hf_config(cfg) == REAL
    s8 = GlmLayerShape.from_hf_config(cfg, tp_size=8, tp_rank=3)
    assert s8 == REAL.tp_shard(8, 3)
    assert (s8.heads_per_rank, s8.moe_inter_per_rank, s8.shared_inter_per_rank) == (8, 256, 256)
    assert (REAL.kv_cache_dim, REAL.qkv_a_out, REAL.index_k_token_bytes) == (576, 2624, 132)
    assert REAL.softmax_scale == 256**-0.5
    assert REAL.rope_interleave and not REAL.indexer_rope_interleave and REAL.indexer_hadamard


def test_tiny_shards_and_rejects_bad_tp():
    for tp in (1, 2, 4):
        for r in range(tp):
            tiny(tp, r)
    with pytest.raises(ValueError):
        tiny(8, 0)
    with pytest.raises(ValueError):
        REAL.tp_shard(3, 0)


# ---- weights ----------------------------------------------------------------------------------
def test_weights_layout_and_randomness():
    s = tiny(2, 1)
    w = make_weights(s)
    w2 = make_weights(s)
    hl, il = s.heads_per_rank, s.moe_inter_per_rank
    assert w["self_attn.fused_qkv_a_proj_with_mqa.weight"].shape == (s.qkv_a_out, s.hidden)
    assert w["self_attn.fused_qkv_a_proj_with_mqa.weight_scale_inv"].shape == (s.nblk(s.qkv_a_out), s.nblk(s.hidden))
    assert w["self_attn.q_b_proj.weight"].shape == (hl * s.qk_head, s.q_lora)
    assert w["self_attn.o_proj.weight"].shape == (s.hidden, hl * s.v_head)
    assert w["mlp.experts.w13_weight"].shape == (s.n_experts, 2 * il, s.hidden)
    assert w["mlp.experts.w2_weight_scale_inv"].shape == (s.n_experts, s.nblk(s.hidden), s.nblk(il))
    assert w["self_attn.w_kc"].shape == (hl, s.qk_nope, s.kv_lora)
    assert w["self_attn.w_kc"].stride() == (s.qk_nope * s.kv_lora, 1, s.qk_nope)  # SGLang's strides
    assert w["self_attn.w_vc"].shape == (hl, s.kv_lora, s.v_head)
    assert w["self_attn.w_vc"].stride() == (s.v_head * s.kv_lora, 1, s.kv_lora)
    for k in FP8_GEMM_WEIGHTS:
        assert w[k].dtype == torch.float8_e4m3fn and w[k + "_scale_inv"].dtype == torch.float32
    assert w["mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert w["self_attn.indexer.k_norm.weight"].dtype == torch.float32
    for k, t in w.items():
        assert t.float().abs().sum() > 0, f"{k} is all zeros"
    # fresh per call without a seed
    assert not torch.equal(w["mlp.gate.weight"], w2["mlp.gate.weight"])
    # fused indexer weight: dequantised wk over weights_proj
    fused = w["self_attn.indexer.wk_weights_proj.weight"]
    wk = fp8.block_dequant(
        w["self_attn.indexer.wk.weight"], w["self_attn.indexer.wk.weight_scale_inv"], s.block, torch.bfloat16
    )
    assert torch.equal(fused[: s.index_head_dim], wk)


def test_shard_weights_cut_along_blocks():
    s = tiny()
    full = make_weights(s, seed=3)
    s2, w = shard_weights(full, s, 2, 1)
    # a sharded FP8 weight dequantises to the same slice of the full dequantised weight
    for k, sl in (
        ("self_attn.q_b_proj.weight", (slice(s2.heads_per_rank * s.qk_head, None), slice(None))),
        ("self_attn.o_proj.weight", (slice(None), slice(s2.heads_per_rank * s.v_head, None))),
    ):
        fd = fp8.block_dequant(full[k], full[k + "_scale_inv"], s.block)
        sd = fp8.block_dequant(w[k], w[k + "_scale_inv"], s.block)
        assert torch.equal(fd[sl], sd)
    fd = fp8.block_dequant(full["mlp.experts.w13_weight"], full["mlp.experts.w13_weight_scale_inv"], s.block)
    sd = fp8.block_dequant(w["mlp.experts.w13_weight"], w["mlp.experts.w13_weight_scale_inv"], s.block)
    il, i = s2.moe_inter_per_rank, s.moe_inter
    assert torch.equal(sd[:, :il], fd[:, il : 2 * il]) and torch.equal(sd[:, il:], fd[:, i + il :])


def test_aiter_layout_is_a_permutation_per_16x32_tile():
    w = torch.arange(32 * 64, dtype=torch.int32).remainder(251).to(torch.uint8).view(32, 64)
    sh = shuffle_weight_16x16(w.view(torch.float8_e4m3fn)).view(torch.uint8)
    # first 16 bytes of the shuffled tensor: row 0, k 0..15; next 16: row 1, k 0..15
    assert torch.equal(sh.flatten()[:16], w[0, :16]) and torch.equal(sh.flatten()[16:32], w[1, :16])
    assert torch.equal(sh.flatten().sort().values, w.flatten().sort().values)
    ws = aiter_layout(make_weights(tiny(), seed=4))
    assert ws["mlp.experts.w13_weight"].shape == (8, 256, 256)


# ---- caches -----------------------------------------------------------------------------------
def test_cache_layouts_and_page_table():
    s = tiny()
    inp, c = make_caches(s, 3, 40, seed=5)
    p = s.page
    ppr = 3  # ceil(40 / 16)
    assert c.kv.shape == ((1 + 3 * ppr) * p, 1, s.kv_cache_dim) and c.kv.dtype == torch.bfloat16
    assert c.index_k.shape == (1 + 3 * ppr, p * (s.index_head_dim + 4)) and c.index_k.dtype == torch.uint8
    r2t = inp.req_to_token
    assert r2t.dtype == torch.int32 and r2t.shape == (3, ppr * p)
    pages = r2t[:, ::p] // p
    assert (pages > 0).all() and pages.unique().numel() == 3 * ppr  # page 0 reserved, no reuse
    assert torch.equal(r2t % p, torch.arange(ppr * p).remainder(p).expand(3, -1).int())
    assert torch.equal(inp.out_cache_loc, r2t[:, 39].long())
    assert torch.equal(inp.positions, torch.full((3,), 39)) and (inp.seq_lens == 40).all()


def test_index_k_write_read_roundtrip_bytes():
    s = tiny()
    inp, c = make_caches(s, 2, 37, seed=6)
    key = torch.randn(2, s.index_head_dim).bfloat16()
    R.index_k_cache_write(c.index_k, inp.out_cache_loc, key, s)
    d, p = s.index_head_dim, s.page
    q, sc = fp8.index_k_quant(key)
    for t in range(2):
        loc = int(inp.out_cache_loc[t])
        page, off = divmod(loc, p)
        row = c.index_k[page]
        assert torch.equal(row[off * d : (off + 1) * d], q[t].view(torch.uint8))  # keys first
        assert torch.equal(row[p * d + off * 4 : p * d + off * 4 + 4], sc[t : t + 1].view(torch.uint8))
    k, ks = R.index_k_cache_read(c.index_k, inp, s)
    assert torch.equal(k[:, 36].view(torch.uint8), q.view(torch.uint8)) and torch.equal(ks[:, 36], sc)


# ---- the layer --------------------------------------------------------------------------------
@pytest.mark.parametrize("interleave", [False, True])
def test_tiny_layer_runs_and_writes_caches(interleave):
    s = tiny(indexer_rope_interleave=interleave)
    w, inp, c, hid, res = _case(s, seed=10)
    c0 = copy.deepcopy(c)
    out = R.decoder_layer(hid, res, inp, c, w, s)
    assert out.hidden.shape == (3, s.hidden) and out.hidden.dtype == torch.bfloat16
    assert torch.isfinite(out.hidden.float()).all() and out.hidden.float().abs().mean() > 0.1
    # residual after the post-attention add = input residual + hidden + attention output
    x, r1 = R.input_norm(hid, res, w, s)
    assert torch.equal(r1, (hid.float() + res.float()).bfloat16())
    # topk: index_topk distinct valid positions < seq_len (ctx 40 > topk 16)
    assert ((out.topk >= 0) & (out.topk < 40)).all()
    assert all(row.unique().numel() == s.index_topk for row in out.topk)
    # the MLA cache row of the new token = kv_a-normed latent | roped k_pe, nothing else changed
    loc = inp.out_cache_loc
    latent = R.qkv_a_proj(x, w, s)
    _, k_nope, k_pe = R.latent_norms(latent, w, s)
    cos, sin = rope.rope_cos_sin(inp.positions, s.qk_rope, s.rope_theta)
    k_pe = rope.apply_rope(k_pe, cos, sin, s.rope_interleave)
    assert torch.equal(c.kv[loc, 0], torch.cat((k_nope, k_pe), -1))
    mask = torch.ones(c.kv.shape[0], dtype=torch.bool)
    mask[loc] = False
    assert torch.equal(c.kv[mask], c0.kv[mask])
    # index-K: only the new tokens' key and scale bytes changed
    changed = (c.index_k != c0.index_k).nonzero()[:, 0].unique()
    assert set(changed.tolist()) <= set((loc // s.page).tolist())


def test_layer_is_deterministic_and_skip_indexer_reuses_topk():
    s = tiny()
    w, inp, c, hid, res = _case(s, seed=11)
    a = R.decoder_layer(hid, res, inp, copy.deepcopy(c), w, s)
    b = R.decoder_layer(hid, res, inp, copy.deepcopy(c), w, s)
    assert torch.equal(a.hidden, b.hidden) and torch.equal(a.topk, b.topk)
    cs = copy.deepcopy(c)
    e = R.decoder_layer(hid, res, inp, cs, w, s, prev_topk=a.topk, run_indexer=False)
    assert torch.equal(e.hidden, a.hidden)  # same top-k -> same layer output
    assert torch.equal(cs.index_k, c.index_k)  # a shared-top-k layer writes no index-K
    with pytest.raises(ValueError):
        R.decoder_layer(hid, res, inp, copy.deepcopy(c), w, s, run_indexer=False)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_shards_sum_to_tp1(tp):
    s = tiny()
    w, inp, c, hid, res = _case(s, seed=12)
    one = R.decoder_layer(hid, res, inp, copy.deepcopy(c), w, s)
    shapes, ws = zip(*(shard_weights(w, s, tp, r) for r in range(tp)))
    many = R.decoder_layer_tp(hid, res, inp, [copy.deepcopy(c) for _ in range(tp)], ws, shapes)
    assert torch.equal(many.topk.sort(-1).values, one.topk.sort(-1).values)  # replicated indexer
    # Partial sums round to bf16 per rank before the reduce, and the post-attention norm's
    # input then requantises to FP8 differently in a few groups: ~1% relative at most.
    assert _rel(many.hidden, one.hidden) < 0.03
    assert _rel(many.residual, one.residual) < 0.01


def test_hadamard_preserves_index_scores():
    # The Hadamard rotation is orthonormal and applied to q and k alike: without FP8 rounding
    # the scores are unchanged; with it they differ only by quantisation noise.
    torch.manual_seed(13)
    q = torch.randn(2, 4, 128)
    k = torch.randn(2, 50, 128)
    h = rope.hadamard_matrix(128) * 128**-0.5
    assert torch.allclose(h @ h.t(), torch.eye(128), atol=1e-6)
    raw = torch.einsum("thd,tjd->thj", q, k)
    rot = torch.einsum("thd,tjd->thj", rope.hadamard_rotate(q), rope.hadamard_rotate(k))
    assert torch.allclose(raw, rot, atol=1e-4)


def test_fused_and_unfused_indexer_agree():
    # Same weights, the two CUDA indexer paths (fused / unfused) run with the same rope layout
    # differ in FP8 rounding, the Hadamard, the q-scale format and the wk GEMM precision; the
    # index logits of every (row, key) pair must still agree to a few %.
    s_f = tiny(index_topk=32, indexer_rope_interleave=True)
    w, inp, c, hid, res = _case(s_f, batch=16, ctx=64, seed=14)
    x, _ = R.input_norm(hid, res, w, s_f)
    q_lora, _, _ = R.latent_norms(R.qkv_a_proj(x, w, s_f), w, s_f)
    # the unfused arithmetic with the interleaved rope: force the path flag off
    qu, wu, ku = R.indexer_qk(x, q_lora, inp.positions, w, _Unfused(s_f))
    qf, wf, kf = R.indexer_qk(x, q_lora, inp.positions, w, s_f)
    # Keys agree up to the Hadamard: the unfused wk is an FP8 GEMM on per-token-group
    # quantised x (~2-4 % activation quantisation noise), the fused one a bf16 GEMM.
    assert _rel(ku.float(), rope.hadamard_rotate(kf.float())) < 0.06

    def logits(q, wt, k):
        kq, ks = fp8.index_k_quant(k)
        return R.index_logits(q, wt, kq.expand(q.shape[0], -1, -1), ks.expand(q.shape[0], -1))

    assert _rel(logits(qu, wu, ku), logits(qf, wf, kf)) < 0.1


class _Unfused:
    """A shape view whose indexer takes the unfused path whatever its rope layout."""

    def __init__(self, s):
        self._s = s

    def __getattr__(self, k):
        return getattr(self._s, k)

    indexer_fused = False
    indexer_hadamard = True


def test_real_tp8_shard_single_functions():
    # Real-shape TP8 rank 0, cheap pieces only: the indexer at 4096 context and sparse MLA.
    s = REAL.tp_shard(8, 0)
    g = torch.Generator().manual_seed(15)
    w = {}
    for k, shape in (
        ("self_attn.indexer.wq_b.weight", (s.index_heads * s.index_head_dim, s.q_lora)),
        ("self_attn.indexer.wk.weight", (s.index_head_dim, s.hidden)),
    ):
        w[k], w[k + "_scale_inv"] = fp8.block_quant(torch.randn(shape, generator=g) * shape[1] ** -0.5, 128)
    w["self_attn.indexer.weights_proj.weight"] = (
        torch.randn(s.index_heads, s.hidden, generator=g) * s.hidden**-0.5
    ).bfloat16()
    w["self_attn.indexer.k_norm.weight"] = torch.ones(128) + 0.1 * torch.randn(128, generator=g)
    w["self_attn.indexer.k_norm.bias"] = 0.1 * torch.randn(128, generator=g)
    inp, c = make_caches(s, 2, 4096, seed=16)
    x = torch.randn(2, s.hidden, generator=g).bfloat16()
    q_lora = torch.randn(2, s.q_lora, generator=g).bfloat16()
    topk = R.indexer(x, q_lora, inp, c, w, s)
    assert topk.shape == (2, 2048) and ((topk >= 0) & (topk < 4096)).all()
    assert all(r.unique().numel() == 2048 for r in topk)
    # the top-k set is the 2048 best scores
    q_fp8, wts, _ = R.indexer_qk(x, q_lora, inp.positions, w, s)
    k, ks = R.index_k_cache_read(c.index_k, inp, s)
    logits = R.index_logits(q_fp8, wts, k, ks)
    thr = logits.gather(1, topk.long()).min(-1).values
    assert ((logits >= thr[:, None]).sum(-1) == 2048).all()
    # sparse MLA over those slots, 8 heads, against a dense fp32 softmax restricted to them
    q_nope_out = torch.randn(2, 8, 512, generator=g).bfloat16()
    q_pe = torch.randn(2, 8, 64, generator=g).bfloat16()
    slots = R.topk_to_slots(topk, inp)
    out = R.sparse_mla(q_nope_out, q_pe, c.kv, slots, s)
    kvs = c.kv[slots.long(), 0].float()
    sc = torch.einsum("thd,tkd->thk", torch.cat((q_nope_out, q_pe), -1).float(), kvs) * 256**-0.5
    want = torch.einsum("thk,tkd->thd", sc.softmax(-1), kvs[..., :512])
    assert _rel(out, want) < 4e-3  # one bf16 rounding of the output


def test_floor_bytes_real_tp8_batch1_is_about_91mb():
    s = REAL.tp_shard(8, 0)
    # byte count from shapes alone (meta tensors: no 1 GB allocation on the CPU)
    wm = make_weights(s, device="meta")
    b = weight_bytes(wm, s, experts_read=8)
    assert 85e6 < b < 95e6, b  # facts.md: about 91 MB


def test_bench_runs_on_cpu_tiny(tmp_path):
    rc = bench.main(
        [
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(tmp_path),
            "--widths",
            "1,2",
            "--contexts",
            "64",
            "--replays",
            "1",
            "--warmup",
            "0",
            "--layers",
            "2",
        ]
    )
    assert rc == 0
    import json

    data = json.loads((tmp_path / "glm53_bench.json").read_text())
    # the default shapes: the served checkpoints' indexer path
    assert {r["shape"] for r in data["rows"]} == {"tp1i", "tp8i"} and not data["errors"]
    assert all(r["floor_us"] > 0 and r["bytes"]["total"] > 0 for r in data["rows"])
    assert all(r["layers"] == 2 and r["ceiling_tbs"] == bench.HBM_BYTES_PER_S / 1e12 for r in data["rows"])
    assert data["meta"]["layers"] == 2
    assert "unfused" in bench.PATHS


def test_bench_rotation_runs_every_layer_and_times_per_layer():
    """The timed step runs each layer's step once, in order; a layer's time is the rotation's
    over the layer count; distinct experts come per layer."""
    calls = []

    class Out:
        def __init__(self, ids):
            self.aux = {"topk_ids": torch.tensor(ids)}

    def make(i, ids):
        def step():
            calls.append(i)
            return Out(ids)

        step.check = lambda: calls.append(f"check{i}")
        return step

    steps = [make(0, [[1, 2], [2, 3]]), make(1, [[4, 4], [5, 6]])]
    r = bench._time_path(steps, "cpu", warmup=0, replays=3)
    assert calls == [0, 1] * 5, calls  # two eager runs, then the three timed ones
    assert r["distinct_experts_per_layer"] == [3, 3]
    rot = bench._rotation(steps)
    rot.check()
    assert calls[-2:] == ["check0", "check1"]


def test_bench_chain_tells_each_step_the_next_one_in_the_rotation():
    """Steps with chain(next) learn the step after them, the last one the first (the next replay
    runs it); steps without it are left alone; a one-layer rotation is its own next."""
    told = {}

    def make(i, chained=True):
        def step():
            return i

        step.i = i
        if chained:
            step.chain = lambda nxt: told.__setitem__(i, nxt.i)
        return step

    bench._chain([make(0), make(1, chained=False), make(2)])
    assert told == {0: 1, 2: 0}
    told.clear()
    bench._chain([make(7)])
    assert told == {7: 7}


def test_bench_refuses_an_empty_rotation(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--tiny", "--layers", "0"])
    assert "at least one layer" in capsys.readouterr().err


def test_bench_base_trees_are_named_and_compared_side_by_side(capsys):
    assert bench._bases("/t/a") == {"base": "/t/a"}
    assert bench._bases("v035=/t/a,/t/b") == {"v035": "/t/a", "base2": "/t/b"}
    with pytest.raises(SystemExit, match="twice"):
        bench._bases("x=/a,x=/b")
    row = dict(shape="tp8", context=4096, width=1, floor_us=25.0)
    rows = [dict(row, path="v035", us=300.0), dict(row, path="mono", us=150.0),
            dict(row, width=2, path="mono", us=160.0)]  # no v035 row at width 2: left out
    table = bench._side_by_side(rows, old="v035").splitlines()
    assert len(table) == 2 and "v035 us" in table[0]
    assert table[1].split() == ["tp8", "4096", "1", "300.0", "150.0", "25.0", "6.00x", "2.00x", "-"]
    # --base on the CPU is refused (it times a monokernel), before anything is built
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--tiny", "--base", "/nonexistent"])
    assert "needs --device cuda" in capsys.readouterr().err


def test_bench_knob_sets_are_checked_and_compared_with_mono_bit_for_bit(capsys):
    """--knobs: named knob sets, each a path beside "mono"; unknown knob names are refused
    before anything is built, all at once; the side-by-side table says whether a set's outputs
    are mono's bits (their digests)."""
    row = dict(shape="tp8", context=4096, width=1, floor_us=25.0)
    rows = [dict(row, path="mono", us=180.0, out_digest="ab"), dict(row, path="hf", us=150.0, out_digest="ab"),
            dict(row, width=2, path="mono", us=190.0, out_digest="cd"),
            dict(row, width=2, path="hf", us=170.0, out_digest="ce")]
    table = bench._side_by_side(rows, new="hf", old="mono").splitlines()
    assert [line.split()[-1] for line in table] == ["bits", "same", "DIFF"]
    assert table[1].split()[3:5] == ["180.0", "150.0"]
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--tiny", "--knobs", '{"a": {"handof_flag": true, "x": 1}, "b": {}}'])
    assert "unknown knobs ['a.handof_flag', 'a.x']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--tiny", "--knobs", '{"a": 3}'])
    assert "must map each name to an object" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--tiny", "--knobs", '{"a": {"hist_in_scores": true}}'])
    assert "needs --device cuda" in capsys.readouterr().err
    # the grid and its warps are GlmLayerKernel keywords a set may change too (an SM's 8 warps
    # as one program instead of two)
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--tiny", "--knobs", '{"w8": {"nprog": 132, "num_warps": 8}}'])
    assert "needs --device cuda" in capsys.readouterr().err


def test_bench_served_context_widens_the_page_table_as_a_server_does(tmp_path):
    """--served-context N: the points run on inputs whose page table (so the kernels' score rows
    and tile counts) is N tokens wide, as a server's kernels are built for its context length;
    the columns past the rows' tokens are the padding slot 0; a point longer than N is skipped."""
    s = tiny()
    inp, _ = make_caches(s, 2, 40, seed=1)
    wide = bench.served_inputs(inp, 100, s.page)
    assert wide.max_seq_len == wide.req_to_token.shape[1] == -(-100 // s.page) * s.page
    n = inp.req_to_token.shape[1]
    assert torch.equal(wide.req_to_token[:, :n], inp.req_to_token) and not wide.req_to_token[:, n:].any()
    assert torch.equal(wide.seq_lens, inp.seq_lens)
    with pytest.raises(ValueError, match="shorter than the rows"):
        bench.served_inputs(inp, 8, s.page)
    rc = bench.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--widths", "1", "--contexts", "64,256",
                     "--served-context", "200", "--shapes", "tp8", "--replays", "1", "--warmup", "0", "--layers", "1"])
    assert rc == 0
    import json

    data = json.loads((tmp_path / "glm53_bench.json").read_text())
    assert [(r["context"], r["served_context"]) for r in data["rows"]] == [(64, 208)] and not data["errors"]


def test_bench_shapes_name_the_checkpoints_indexer_path_and_refuse_others(tmp_path, capsys):
    """--shapes tp8i / tp1i: the GLM-5.x checkpoints' interleaved indexer rope (the fused indexer
    path, no Hadamard), tp8 / tp1 the HF default's (with it); a tiny run times tp8i on the CPU; an
    unknown name is refused with the known ones, before anything runs."""
    from mono_glm53.config import REAL, SHAPE_NAMES, named_shape

    assert named_shape("tp8") == REAL.tp_shard(8, 0) and named_shape("tp1") == REAL
    i8 = named_shape("tp8i")
    assert i8.indexer_rope_interleave and not i8.indexer_hadamard and i8.tp_size == 8
    assert named_shape("tp1i").tp_size == 1 and named_shape("tp1i").indexer_fused
    assert named_shape("tp8", use_tiny=True).tp_size == 4 and named_shape("tp8i", use_tiny=True).indexer_fused
    with pytest.raises(ValueError, match=r"shape 'tp2' is not one of " + ", ".join(SHAPE_NAMES)):
        named_shape("tp2")
    rc = bench.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--widths", "1", "--contexts", "64",
                     "--shapes", "tp8i", "--replays", "1", "--warmup", "0", "--layers", "1"])
    assert rc == 0
    import json

    data = json.loads((tmp_path / "glm53_bench.json").read_text())
    assert [r["shape"] for r in data["rows"]] and {r["shape"] for r in data["rows"]} == {"tp8i"} and not data["errors"]
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--tiny", "--shapes", "tp8,tp16,x"])
    assert "--shapes tp16,x: not a shape; the shapes are tp1, tp8, tp1i, tp8i" in capsys.readouterr().err
