"""SGLang's Triton kernels (mhc_combine, the Sinkhorn split, the V4 KV dequantizer, the RoPE
kernel) and the non-CUDA decoder mixin that calls them, against the reference, under the
Triton interpreter on the CPU. One subprocess runs every check (the interpreter must be on
before SGLang's kernels are decorated); see _sglang_triton_checks.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")

CHECKS = (
    "mhc_combine",
    "hc_split_sinkhorn",
    "non_cuda_decoder_mixin",
    "dequantize_k_cache_paged_dsv4",
    "apply_rotary_emb_triton",
)


@pytest.fixture(scope="module")
def results() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               # the torch form of deepseek_v4_mhc.post (TileLang's has no CPU form)
               SGLANG_OPT_USE_TILELANG_MHC_POST="0")
    script = Path(__file__).with_name("_sglang_triton_checks.py")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", CHECKS)
def test_sglang_triton_kernel_matches_reference(results, name):
    assert name in results, f"the check script did not run {name}"
    ok, detail = results[name]
    assert ok, f"{name}: {detail}"
