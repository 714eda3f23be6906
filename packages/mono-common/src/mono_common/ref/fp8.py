"""FP8 e4m3 quantisation as SGLang 0.5.23 does it for GLM-5.3, in plain torch.

Weights: block-128 e4m3 with an fp32 `weight_scale_inv` of shape [ceil(N/128), ceil(K/128)]
(`Fp8LinearMethod`, layers/quantization/fp8.py). Activations of an FP8 block linear are
quantised per token group of 128 before the GEMM: on the H200 the linear dispatches to
`deepgemm_w8a8_block_fp8_linear_with_fallback` (layers/quantization/fp8_utils.py), which calls
`sglang_per_token_group_quant_fp8(x, 128, column_major_scales=True, scale_tma_aligned=True,
scale_ue8m0=DEEPGEMM_SCALE_UE8M0)`; `DEEPGEMM_SCALE_UE8M0` is False on sm_90, so the
activation scales are plain fp32 `absmax / 448` (the column-major/TMA layout changes storage,
not values). The Triton fallback (`triton_w8a8_block_fp8_linear`) quantises the same way.
The GEMM then sums, per 128-wide K block, (q_x . q_w) * s_x * s_w in fp32 and writes bf16.

Three other FP8 quantisers appear in the layer, each mirrored here:

* `act_quant` (kernels/ops/quantization/act_quant_triton.py): the unfused indexer's q, block
  128, `scale_fmt="ue8m0"` -> scale rounded up to a power of two, amax floor 1e-4, x / scale.
* `index_k_quant` (kernels/jit/csrc/dsa/fused_store_index_cache.cuh and
  deepseek_v32/indexer_k.cuh): the index-K cache write on CUDA, one plain fp32 scale per
  token (NOT ue8m0, despite the indexer's `scale_fmt`), amax floor 1e-4, x * (1 / scale).
* the fused indexer's q (deepseek_v4/main_norm_rope.cuh, kRopeFirst, no Hadamard): same
  formula as `index_k_quant`.

What cannot be mirrored bit for bit: DeepGEMM's / cuBLAS's accumulation order inside a GEMM,
and Triton's fp32 division (which may lower to an approximate divide). Casts to e4m3 round
to nearest even after clamping to +-448, as the kernels do.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "block_quant",
    "block_dequant",
    "per_token_group_quant",
    "act_quant",
    "index_k_quant",
    "fp8_block_linear",
    "set_fp8_gemm_backend",
    "get_fp8_gemm_backend",
    "fp8_gemm_backend",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _div(a: torch.Tensor, b: float) -> torch.Tensor:
    """a / b rounded as IEEE division on every device. torch on CUDA divides by a Python
    scalar as a multiply by its reciprocal, which misses the correctly rounded quotient in the
    last bit (49.5 / 50; pytorch/pytorch#186618): the H200's activation scales `absmax / 448`
    then differed from the CPU's in ~49 % of the groups (session 11). A tensor divisor takes
    the true division on both."""
    return a / torch.full_like(a, b)


def _expand_block_scale(s: torch.Tensor, n: int, k: int, block: int) -> torch.Tensor:
    return s.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)[..., :n, :k]


def block_quant(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a [..., N, K] tensor to e4m3 with one fp32 scale per block x block tile.

    Builds checkpoint-like weights (scale = tile amax / 448, so each tile uses the full e4m3
    range); returns (weight e4m3 [..., N, K], weight_scale_inv fp32 [..., ceil(N/b), ceil(K/b)]).
    """
    *lead, n, k = w.shape
    nb, kb = _cdiv(n, block), _cdiv(k, block)
    wf = w.float()
    pad = torch.zeros(*lead, nb * block, kb * block, dtype=torch.float32, device=w.device)
    pad[..., :n, :k] = wf
    tiles = pad.view(*lead, nb, block, kb, block)
    amax = tiles.abs().amax(dim=(-3, -1)).clamp_min(1e-12)
    scale = _div(amax, FP8_MAX)
    q = (tiles / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.view(*lead, nb * block, kb * block)[..., :n, :k].contiguous().to(FP8_DTYPE)
    return q, scale.contiguous()


def block_dequant(
    w: torch.Tensor, scale_inv: torch.Tensor, block: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Block-FP8 weight to `dtype`.

    Mirrors `sglang.srt.layers.quantization.fp8_utils.block_quant_dequant` (fp32 product of
    the e4m3 value and its tile's scale, then one cast).
    """
    *_, n, k = w.shape
    return (w.to(torch.float32) * _expand_block_scale(scale_inv, n, k, block)).to(dtype)


def per_token_group_quant(x: torch.Tensor, group: int, eps: float = 1e-10) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group e4m3 quantisation of the activations of an FP8 block linear.

    Mirrors `sglang.kernels.ops.quantization.fp8_kernel._per_token_group_quant_8bit` (and the
    CUDA JIT `per_token_group_quant` the H200 runs): s = max(absmax, 1e-10) / 448,
    q = clamp(x * (1 / s), -448, 448). Returns (q [..., K] e4m3, s [..., K/group] fp32).
    """
    *lead, k = x.shape
    if k % group:
        raise ValueError(f"K={k} is not a multiple of the group {group}")
    xg = x.float().reshape(*lead, k // group, group)
    s = _div(xg.abs().amax(dim=-1).clamp_min(eps), FP8_MAX)
    inv = 1.0 / s
    q = (xg * inv[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(*lead, k), s


def act_quant(x: torch.Tensor, block: int = 128, scale_fmt: str | None = "ue8m0") -> tuple[torch.Tensor, torch.Tensor]:
    """The DSA indexer's activation quantiser (unfused CUDA path for the index q).

    Mirrors `sglang.kernels.ops.quantization.act_quant_triton.act_quant`: amax floored at 1e-4,
    scale = amax / 448 rounded up to a power of two when `scale_fmt` is set ("ue8m0", which
    the Indexer passes), q = clamp(x / scale). Returns (q e4m3, s fp32 [..., K/block]).
    """
    *lead, k = x.shape
    xg = x.float().reshape(*lead, k // block, block)
    amax = xg.abs().amax(dim=-1).clamp_min(1e-4)
    if scale_fmt is not None:
        s = torch.exp2(torch.ceil(torch.log2(amax * (1.0 / FP8_MAX))))
    else:
        s = amax * (1.0 / FP8_MAX)
    q = (xg / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(*lead, k), s


def index_k_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One-scale-per-row e4m3 quantisation used by the CUDA index-K store and fused index q.

    Mirrors `fused_store_indexer_cache` / `fused_k_indexer_norm_rope_store` /
    `fused_q_indexer_rope_hadamard_quant` (kernels/jit/csrc): s = max(1e-4, absmax) / 448 in
    plain fp32 (no power-of-two rounding), q = clamp(x * (1 / s)). x: [..., D] (bf16 or fp32).
    Returns (q e4m3 [..., D], s fp32 [...]).
    """
    xf = x.float()
    s = _div(xf.abs().amax(dim=-1).clamp_min(1e-4), FP8_MAX)
    inv = 1.0 / s
    q = (xf * inv[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, s


# ---- the FP8 block GEMM -------------------------------------------------------------------
# "exact": fp32 dequant of both operands and an fp32 matmul (CPU default; the reference).
# "scaled_mm": torch's block-scaled FP8 GEMM (1x128 activations, 128x128 weights), the same
#   recipe as DeepGEMM on sm_90; used on CUDA where it runs and matches "exact".
# "auto": scaled_mm on CUDA when a probe for that shape passed, else exact.
_BACKEND = "auto"
_SCALED_MM_OK: dict[tuple[int, int, int, int], bool] = {}


def set_fp8_gemm_backend(name: str) -> None:
    global _BACKEND
    if name not in ("auto", "exact", "scaled_mm"):
        raise ValueError(name)
    _BACKEND = name


def get_fp8_gemm_backend() -> str:
    return _BACKEND


@contextlib.contextmanager
def fp8_gemm_backend(name: str):
    """`set_fp8_gemm_backend(name)` for the block, the previous backend restored after it."""
    old = _BACKEND
    set_fp8_gemm_backend(name)
    try:
        yield
    finally:
        set_fp8_gemm_backend(old)


def _exact_gemm(xq, xs, w, ws, block):
    k = xq.shape[1]
    xd = xq.float() * xs.repeat_interleave(block, dim=-1)[:, :k]
    wd = block_dequant(w, ws, block, torch.float32)
    return (xd @ wd.t()).to(torch.bfloat16)


def _scaled_mm_variants():
    """Ways to call torch's block-scaled FP8 GEMM (the API moved between torch releases)."""

    def nf(xq, xs, w, ws):  # torch.nn.functional.scaled_mm (torch >= 2.9), SGLang's XPU form
        from torch.nn.functional import ScalingType, scaled_mm

        return scaled_mm(
            xq,
            w.t(),
            xs,
            ScalingType.BlockWise1x128,
            ws.t(),
            ScalingType.BlockWise128x128,
            output_dtype=torch.bfloat16,
        )

    def nf_mmajor(xq, xs, w, ws):  # the same with M-major activation scales (cuBLAS layout)
        return nf(xq, xs.t().contiguous().t(), w, ws)

    def private(xq, xs, w, ws):  # torch._scaled_mm infers the recipe from the scale shapes
        return torch._scaled_mm(xq, w.t(), scale_a=xs.t().contiguous().t(), scale_b=ws.t(), out_dtype=torch.bfloat16)

    return [("F.scaled_mm", nf), ("F.scaled_mm/M-major", nf_mmajor), ("torch._scaled_mm", private)]


_SCALED_MM_VARIANT = None  # (name, fn) that passed the first probe
_SCALED_MM_BY_SHAPE: dict[tuple[int, int, int, int], tuple[str, object]] = {}
# cuBLAS's block-scaled FP8 GEMM on sm_90 rejects M not a multiple of 4 (seen on the H200 with
# torch 2.11): pad the activation rows with zeros (their scale 1), as DeepGEMM pads M, and
# drop the padded output rows.
_M_ALIGN = 4


def _pad_rows(xq, xs):
    m = xq.shape[0]
    mp = -(-m // _M_ALIGN) * _M_ALIGN
    if mp == m:
        return xq, xs
    zq = torch.zeros(mp - m, xq.shape[1], dtype=xq.dtype, device=xq.device)
    zs = torch.ones(mp - m, xs.shape[1], dtype=xs.dtype, device=xs.device)
    return torch.cat((xq, zq)), torch.cat((xs, zs))


def _scaled_mm_gemm(xq, xs, w, ws, block):
    m = xq.shape[0]
    fn = _SCALED_MM_BY_SHAPE[(m, w.shape[0], w.shape[1], block)][1]
    pq, ps = _pad_rows(xq, xs)
    return fn(pq, ps, w, ws)[:m]


def _scaled_mm_usable(xq, xs, w, ws, block) -> bool:
    """Probe (once per shape, outside graph capture) that torch's block-scaled GEMM runs here
    and agrees with the fp32 dequantised GEMM; remember the verdict and the call form."""
    global _SCALED_MM_VARIANT
    key = (xq.shape[0], w.shape[0], w.shape[1], block)
    ok = _SCALED_MM_OK.get(key)
    if ok is not None:
        return ok
    if block != 128 or torch.cuda.is_current_stream_capturing():
        return False
    ref = _exact_gemm(xq, xs, w, ws, block).float()
    tol = 2e-2 * max(ref.abs().max().item(), 1e-6)
    variants = _scaled_mm_variants()
    if _SCALED_MM_VARIANT is not None:
        variants.sort(key=lambda v: v[0] != _SCALED_MM_VARIANT[0])
    ok = False
    pq, ps = _pad_rows(xq, xs)
    for v in variants:
        try:
            got = v[1](pq, ps, w, ws)[: xq.shape[0]].float()
            if got.shape == ref.shape and (got - ref).abs().max().item() <= tol:
                _SCALED_MM_VARIANT = _SCALED_MM_VARIANT or v
                _SCALED_MM_BY_SHAPE[key] = v
                ok = True
                break
        except Exception:  # unsupported shape/arch/torch: try the next form, else fall back
            continue
    _SCALED_MM_OK[key] = ok
    return ok


def scaled_mm_variant() -> str:
    return _SCALED_MM_VARIANT[0] if _SCALED_MM_VARIANT else "none"


def fp8_block_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    block: int,
    pre_quant: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """y = x @ W^T for a block-FP8 W, with SGLang's per-token-group activation quantisation.

    Mirrors `sglang.srt.layers.quantization.fp8_utils.deepgemm_w8a8_block_fp8_linear_with_fallback`
    (the H200 path of `Fp8LinearMethod.apply`): quantise x per token group of `block`
    (`per_token_group_quant`), block-scaled FP8 GEMM, bf16 out. x: [..., K] bf16;
    weight: [N, K] e4m3; weight_scale_inv: [ceil(N/b), K/b] fp32. `pre_quant` passes an
    already quantised (q, s) of x (SGLang's quantise-once MoE input). Returns [..., N] bf16.
    """
    *lead, k = x.shape
    if pre_quant is None:
        xq, xs = per_token_group_quant(x.reshape(-1, k), block)
    else:
        xq, xs = pre_quant[0].reshape(-1, k), pre_quant[1].reshape(-1, k // block)
    use_mm = x.is_cuda and _BACKEND != "exact"
    if use_mm and _scaled_mm_usable(xq, xs, weight, weight_scale_inv, block):
        y = _scaled_mm_gemm(xq, xs, weight, weight_scale_inv, block)
    elif use_mm and _BACKEND == "scaled_mm":
        raise RuntimeError(f"block-scaled scaled_mm unavailable for M={xq.shape[0]}, W={tuple(weight.shape)}")
    else:
        y = _exact_gemm(xq, xs, weight, weight_scale_inv, block)
    return y.reshape(*lead, weight.shape[0])
