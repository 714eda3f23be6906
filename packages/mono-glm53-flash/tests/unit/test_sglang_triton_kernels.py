"""The KDA and pooled-index reference against SGLang 0.5.23's own Triton kernels, run by the
Triton interpreter on the CPU (in a subprocess: TRITON_INTERPRET must be set before Triton
loads; see sglang_triton_interp.py for the one patch the interpreter needs).

The kernels compute in fp32 like the reference but reduce in their own order (`tl.sum`), so
fp32 results may differ in the last bits. The interpreter casts fp32 to bf16 by dropping the
low 16 bits (toward zero, numpy has no bf16) where a GPU rounds to nearest even, so a bf16
result may differ by one bf16 ulp; and its e4m3 store rounds wrongly near binade edges, so
fp8 values are compared before that store.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mono_glm53_flash import reference as R
from mono_glm53_flash.config import REAL, tiny

pytest.importorskip("sglang")

SCRIPT = Path(__file__).with_name("sglang_triton_interp.py")


@pytest.fixture(scope="module")
def sglang_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("interp") / "out.pt"
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0 and out.exists(), (p.stdout + p.stderr)[-3000:]
    data = torch.load(out, weights_only=False)
    errors = {k: v for k, v in data.items() if k.startswith("error_")}
    assert not errors, f"the interpreter could not run: {errors}"
    return data


def _bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within one bf16 ulp (2 x 2^-8 relative: the interpreter truncates where the reference
    rounds to nearest), measured against the row's max for values near zero, where a
    different fp32 sum order may flip the last bit."""
    g, w = got.float(), want.float()
    tol = 2**-8 * torch.maximum(w.abs(), w.abs().amax(-1, keepdim=True) * 2**-8) + 1e-30
    assert ((g - w).abs() <= 2 * tol).all(), (g - w).abs().max()


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_kda_recurrent_update_equals_fused_recurrent_kda_packed_decode(sglang_run, lower_bound):
    inp = sglang_run["kda_in"]
    ssm = inp["ssm"].clone()
    h, k = inp["ssm"].shape[1], inp["ssm"].shape[-1]
    out = R.kda_recurrent_update(
        inp["qkv"], inp["a"], inp["b"], inp["A_log"], inp["dt_bias"], ssm, inp["slots"].long(), k**-0.5, lower_bound
    )
    want_out, want_ssm = sglang_run[f"kda_out_{lower_bound}"], sglang_run[f"kda_ssm_{lower_bound}"]
    live = inp["slots"] >= 0
    _bf16_close(out[live], want_out[live])
    assert torch.equal(out[~live], torch.zeros_like(out[~live]))  # the kernel writes zeros for a pad row
    assert torch.equal(want_out[~live], torch.zeros_like(want_out[~live]))
    # fp32 state: the same update, sums in another order
    assert torch.allclose(ssm, want_ssm, rtol=1e-5, atol=1e-6 * want_ssm.abs().max())
    untouched = [i for i in range(ssm.shape[0]) if i not in inp["slots"].tolist()]
    assert torch.equal(ssm[untouched], inp["ssm"][untouched])
    assert not torch.allclose(ssm[inp["slots"][live].long()], inp["ssm"][inp["slots"][live].long()])
    assert out.shape == (4, h, k)


def test_causal_conv1d_update_equals_sglang(sglang_run):
    inp = sglang_run["conv_in"]
    state = inp["conv"].clone()
    y = R.causal_conv1d_update(inp["x"], state, inp["w"], inp["slots"].long())
    live = inp["slots"] >= 0
    _bf16_close(y[live], sglang_run["conv_out"][live])
    # the window is a copy of bf16 inputs: exact, pad slot untouched
    assert torch.equal(state, sglang_run["conv_state"])
    assert torch.equal(state[5, -1], inp["x"][0]) and torch.equal(state[5, :-1], inp["conv"][5, 1:])


def test_gated_rms_norm_equals_fused_norm_gate_kernel(sglang_run):
    inp = sglang_run["norm_in"]
    _bf16_close(R.gated_rms_norm(inp["x"], inp["g"], inp["w"], 1e-5), sglang_run["norm_out"])


def _interp_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 as the Triton interpreter casts: the low 16 bits dropped (toward zero)."""
    return (x.float().contiguous().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)


def _closing_group(inp):
    """Keys and scores of the group request 0 closes (position 259: slots 256..259)."""
    slots = [(256 + j) % 4 for j in range(4)]
    keys = torch.stack([inp["key"][0] if j == 3 else inp["tail_k"][0, p] for j, p in enumerate(slots)])
    scores = torch.stack([inp["score"][0] if j == 3 else inp["tail_s"][0, p] for j, p in enumerate(slots)])
    return keys, scores


def test_kpool_compress_update_equals_sglangs_decode_kernel(sglang_run):
    inp = sglang_run["kpool_in"]
    s = REAL  # SGLang's index geometry: D 128, kpool 4, 64 pooled keys a 256-token page
    state = R.MlaState(
        kv=torch.zeros(1, 1, 1),
        index_k=torch.zeros_like(sglang_run["kpool_buf"]),
        tail_k=inp["tail_k"].clone(),
        tail_score=inp["tail_s"].clone(),
    )
    di = R.DecodeInputs(
        positions=inp["positions"],
        seq_lens=inp["seq_lens"],
        req_pool_indices=inp["req_pool_indices"],
        out_cache_loc=inp["out_cache_loc"],
        req_to_token=inp["req_to_token"],
        mamba_slots=torch.zeros(3, dtype=torch.long),
    )
    weights = {"self_attn.indexer.index_kpool_compress_ape": inp["ape"]}
    R.kpool_compress_update(inp["key"], inp["score"], weights, state, di, s)
    assert torch.equal(state.tail_k, sglang_run["kpool_tail_k"])
    assert torch.equal(state.tail_score, sglang_run["kpool_tail_s"])
    want = sglang_run["kpool_buf"]
    # exactly one pooled key was written (request 0 closed group 64: page 1, row 0)
    assert torch.equal(state.index_k.nonzero()[:, 0].unique(), torch.tensor([1]))
    k_got, s_got = R.read_index_key(state, 1, 0, s)
    k_want, s_want = R.read_index_key(R.MlaState(torch.zeros(1), want, state.tail_k, state.tail_score), 1, 0, s)
    assert torch.equal(s_got, s_want) and float(s_got) > 0
    # The pooled key's values before the e4m3 cast: the kernel ran once more with an fp32 buffer
    # (the interpreter's own e4m3 store rounds wrongly near binade edges). The interpreter also
    # truncates fp32 -> bf16 casts (numpy has no bf16), so the reference is evaluated with
    # that rounding for this comparison; the fp32 sums in another order may still move a value
    # across a truncation boundary: at most one bf16 ulp of the key, over the scale.
    vals = sglang_run["kpool_values"][1, :128]
    keys, scores = _closing_group(inp)
    mine_interp = R.kpool_compress(keys, scores, inp["ape"], _interp_bf16).float() / s_got
    ulp = 2.0 ** (torch.floor(torch.log2(mine_interp.abs().clamp_min(2**-100) * s_got)) - 7) / s_got
    assert ((vals - mine_interp.clamp(-448, 448)).abs() <= ulp).all()
    assert (vals == mine_interp.clamp(-448, 448)).float().mean() >= 0.95
    # with round-to-nearest-even casts (the GPU's), the reference's bytes are the correct e4m3
    # of its values
    mine = R.kpool_compress(keys, scores, inp["ape"]).float() / s_got
    assert torch.equal(k_got, mine.clamp(-448, 448).to(torch.float8_e4m3fn).float())
    # and the kernel's bytes, through the interpreter's store, mostly agree
    assert (k_got == k_want).float().mean() >= 0.9
    assert torch.equal(state.index_k[:, 64 * 128 :], want[:, 64 * 128 :])  # the scale rows


def test_kpool_topk_expands_groups_and_appends_the_tail_as_sglang(sglang_run):
    inp = sglang_run["topk_in"]
    s = tiny(index_topk=16, index_kpool=4)
    di = R.DecodeInputs(
        positions=inp["seq_lens"].long() - 1,
        seq_lens=inp["seq_lens"],
        req_pool_indices=torch.arange(4),
        out_cache_loc=torch.ones(4, dtype=torch.long),
        req_to_token=torch.zeros(4, 64, dtype=torch.int32),
        mamba_slots=torch.arange(4),
    )
    logits = [inp["logits"][r, : int(n) // 4] for r, n in enumerate(inp["seq_lens"])]
    got = R.kpool_topk(logits, di, s)
    want = sglang_run["topk_out"]
    assert got.shape == want.shape == (4, s.topk_width)
    for r in range(4):
        # the same tokens; the order of the selected groups is the top-k kernel's
        assert sorted(got[r].tolist()) == sorted(want[r].tolist()), r
        tail = int(inp["seq_lens"][r]) % 4
        assert got[r][got[r] >= 0].tolist()[-tail or len(got[r]) :] == want[r][want[r] >= 0].tolist()[-tail or len(want[r]) :]
