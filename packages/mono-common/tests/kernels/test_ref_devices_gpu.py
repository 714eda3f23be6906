"""GPU: the torch references' FP8 quantisers give the same bits on CUDA as on the CPU.

A CUDA-side reference is compared with kernels bit for bit (mono-glm53's numerics); torch's
CUDA division by a Python scalar is a multiply by the reciprocal, which once made the
activation scales differ from the CPU's in ~49 % of the groups (session 11, ref.fp8._div).
"""

import torch

from mono_common.ref import fp8


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().view(torch.uint8) if a.dtype == fp8.FP8_DTYPE else a.cpu(),
                       b.view(torch.uint8) if b.dtype == fp8.FP8_DTYPE else b)


def test_quantisers_match_the_cpu_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 6144, generator=g) * 3).to(torch.bfloat16)
    for name, fn in (("per_token_group_quant", lambda t: fp8.per_token_group_quant(t, 128)),
                     ("index_k_quant", fp8.index_k_quant),
                     ("act_quant", lambda t: fp8.act_quant(t, 128))):
        (qc, sc), (qg, sg) = fn(x), fn(x.cuda())
        assert _same(sg, sc), f"{name}: scales differ in {float((sg.cpu() != sc).float().mean()):.3%}"
        assert _same(qg, qc), name
    w = torch.randn(512, 1024, generator=g) * 0.02
    (qc, sc), (qg, sg) = fp8.block_quant(w, 128), fp8.block_quant(w.cuda(), 128)
    assert _same(sg, sc) and _same(qg, qc)


def test_exact_fp8_linear_matches_the_cpu():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(4, 6144, generator=g) * 3).to(torch.bfloat16)
    w, ws = fp8.block_quant(torch.randn(512, 6144, generator=g) * 0.02, 128)
    with fp8.fp8_gemm_backend("exact"):
        yc = fp8.fp8_block_linear(x, w, ws, 128)
        yg = fp8.fp8_block_linear(x.cuda(), w.cuda(), ws.cuda(), 128)
    # the fp32 GEMM's summation order differs (cuBLAS vs the CPU): bf16 outputs may move one ulp
    rel = float((yg.cpu().float() - yc.float()).norm() / yc.float().norm())
    assert rel < 1e-3, rel
