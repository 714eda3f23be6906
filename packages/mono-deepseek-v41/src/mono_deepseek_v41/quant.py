"""The number formats of DeepSeek-V4.1 in plain torch: FP8 blocks, the V4 KV rows, FP4.

Every function quantizes or dequantizes values as one SGLang 0.5.23 path does and names it.
Shapes are in the docstrings; all scale arithmetic is fp32.

* FP8 e4m3 weights in 32x32 blocks with power-of-two (ue8m0) fp32 scales, and the per-token
  32-wide activation groups SGLang's block-FP8 GEMM quantizes (`fp8_block_linear`).
* The V4 KV row SGLang's fused norm+RoPE store writes (448 nope values as e4m3 with one ue8m0
  scale per 64, 64 RoPE values in bf16): `kv_quant_v4`.
* The C4 indexer's fp8 key (Hadamard-rotated, one fp32 scale a token): `index_k_quant_fp8`.
* FP4 e2m1: SGLang's fake quantizers (`fake_quant_fp4`, `fake_quant_compressed_kv`) and the
  MXFP4 routed-expert packing (two codes a byte, low nibble first, one e8m0 scale per 32).
"""

from __future__ import annotations

import torch

__all__ = [
    "SGLANG_READS",
    "E2M1_VALUES",
    "E4M3_MAX",
    "act_quant_groups",
    "ceil_pow2",
    "fake_quant_compressed_kv",
    "fake_quant_fp4",
    "fp8_block_dequant",
    "fp8_block_linear",
    "fp8_block_quant",
    "hadamard",
    "index_k_quant_fp8",
    "kv_quant_v4",
    "mxfp4_dequant",
    "mxfp4_quant",
    "round_e2m1",
]

SGLANG_READS: tuple[str, ...] = (
    "sglang.kernels.ops.quantization.fp4_fake_quant.ceil_pow2",
    "sglang.kernels.ops.quantization.fp4_fake_quant.fake_quant_fp4",
    "sglang.kernels.ops.quantization.fp4_fake_quant.fake_quant_compressed_kv",
    "sglang.kernels.ops.quantization.fp4_fake_quant.round_fp4",
    "sglang.srt.layers.quantization.fp8.DSV4_DEQUANT_FP4_TABLE",
    "sglang.srt.layers.quantization.fp8.cast_e2m1fn_to_e4m3fn",
    "sglang.srt.layers.quantization.fp8_utils.dispatch_w8a8_block_fp8_linear",
    "sglang.srt.layers.quantization.fp8_utils.deepgemm_w8a8_block_fp8_linear_with_fallback",
    "sglang.srt.layers.quantization.fp8_utils.triton_w8a8_block_fp8_linear",
    "sglang.srt.layers.quantization.fp8_utils.block_fp8_scale_to_mxfp8_e8m0",
    "sglang.kernels.ops.quantization.fp8_kernel.sglang_per_token_group_quant_fp8",
    "sglang.srt.models.deepseek_v4._dequant_fp8",
    "sglang.test.kernels.deepseek_v4.k_cache_reference.dequantize_k_cache_paged_ref",
)

E4M3_MAX = 448.0
E2M1_MAX = 6.0
#: e2m1 code -> value (sign in bit 3), as SGLang's `DSV4_DEQUANT_FP4_TABLE`.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
F32 = torch.float32
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn


def ceil_pow2(x: torch.Tensor) -> torch.Tensor:
    """2 ** ceil(log2(x)) for positive finite fp32 x, exact (computed on the IEEE bits), as
    `fp4_fake_quant.ceil_pow2` and the CUDA `cast_to_ue8m0` round a scale up."""
    bits = x.float().contiguous().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exp << 23).view(F32)


def _to_fp8(x: torch.Tensor) -> torch.Tensor:
    # Saturate like the CUDA stores (cvt.rn.satfinite): torch's cast would give NaN past 448.
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


# ---- FP8 blocks -------------------------------------------------------------------------------
def fp8_block_quant(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A float [..., N, K] weight -> (e4m3 [..., N, K], fp32 scale [..., ceil(N/b), ceil(K/b)])
    with power-of-two scales, the V4.1 checkpoint format (`scale_fmt: ue8m0`; SGLang keeps the
    scales as fp32 `weight_scale_inv` on CUDA). Partial edge blocks are allowed."""
    *lead, n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    pad = torch.zeros(*lead, nb * block, kb * block, dtype=F32, device=w.device)
    pad[..., :n, :k] = w.float()
    tiles = pad.unflatten(-2, (nb, block)).unflatten(-1, (kb, block))  # [..., nb, b, kb, b]
    amax = tiles.abs().amax(dim=(-3, -1)).clamp_min(1e-10)  # [..., nb, kb]
    scale = ceil_pow2(amax / E4M3_MAX)
    q = _to_fp8(tiles / scale[..., :, None, :, None]).flatten(-4, -3).flatten(-2)
    return q[..., :n, :k].contiguous(), scale


def fp8_block_dequant(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    """e4m3 [..., N, K] with fp32 [..., nb, kb] block scales -> fp32 [..., N, K]
    (`deepseek_v4._dequant_fp8` without its final bf16 rounding)."""
    n, k = q.shape[-2:]
    s = scale.float().repeat_interleave(block, -2).repeat_interleave(block, -1)[..., :n, :k]
    return q.float() * s


def act_quant_groups(x: torch.Tensor, group: int, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token groups of `group` along the last dim -> (e4m3 values, fp32 scales [..., K/group]),
    as `sglang_per_token_group_quant_fp8` (eps 1e-10; power-of-two scales when the checkpoint
    says `scale_fmt: ue8m0`, which the V4.1 checkpoint does)."""
    g = x.float().unflatten(-1, (-1, group))
    scale = g.abs().amax(dim=-1).clamp_min(1e-10) / E4M3_MAX
    if ue8m0:
        scale = ceil_pow2(scale)
    return _to_fp8(g / scale[..., None]).flatten(-2), scale


def fp8_block_linear(
    x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: int, act_ue8m0: bool = True
) -> torch.Tensor:
    """y = x @ W^T of an FP8 block linear: `dispatch_w8a8_block_fp8_linear` picks the native
    block-32 DeepGEMM on sm_90 (`deepgemm_w8a8_block_fp8_linear_with_fallback`, Triton
    otherwise). Both quantize the activation per token group of `block` (the weight's K block)
    and accumulate exact e4m3 products in fp32; this does the same with dequantized operands
    (the accumulation order is not the kernel's). x [..., K] bf16 -> [..., N] bf16."""
    xq, xs = act_quant_groups(x, block, act_ue8m0)
    xd = (xq.float().unflatten(-1, (-1, block)) * xs[..., None]).flatten(-2)
    wd = fp8_block_dequant(w, w_scale, block)
    return (xd @ wd.t()).to(BF16)


# ---- the V4 KV row ------------------------------------------------------------------------------
def kv_quant_v4(row: torch.Tensor, nope: int, tile: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 [n, nope + rope] normed+roped rows -> what SGLang's fused store keeps
    (`fused_k_norm_rope_flashmla`, V4 layout; the compressors' `compress_norm_rope_store` the
    same): (e4m3 nope [n, nope], ue8m0 scale bytes [n, nope/tile] uint8, bf16 rope [n, rope]).

    Quantized from the fp32 values (never rounded to bf16 first); each tile's scale is
    ue8m0(max(1e-4, amax) / 448), rounded up to a power of two."""
    x = row.float()
    tiles = x[:, :nope].unflatten(-1, (-1, tile))
    scale = ceil_pow2(tiles.abs().amax(-1).clamp_min(1e-4) / E4M3_MAX)
    q = _to_fp8(tiles / scale[..., None]).flatten(-2)
    exp = ((scale.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    return q, exp, x[:, nope:].to(BF16)


def kv_dequant_v4(q: torch.Tensor, exp: torch.Tensor, rope: torch.Tensor, tile: int = 64) -> torch.Tensor:
    """Inverse of `kv_quant_v4`: bf16 [n, nope + rope], the values FlashMLA attends (as
    `dequantize_k_cache_paged_ref`: nope * 2^(e-127), rope as stored)."""
    scale = torch.exp2(exp.float() - 127).repeat_interleave(tile, -1)
    return torch.cat([(q.float() * scale).to(BF16), rope.to(BF16)], dim=-1)


# ---- the C4 indexer's keys and queries -----------------------------------------------------------
def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform along the last dim (a power of 2), in fp32: the
    128-point butterfly of the fused indexer kernels (`fused_q_indexer_rope_hadamard_quant`,
    the indexer arm of `compress_norm_rope_store`)."""
    d = x.shape[-1]
    y = x.float()
    h = 1
    while h < d:
        y = y.unflatten(-1, (-1, 2, h))
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack([a + b, a - b], dim=-2).flatten(-3)
        h *= 2
    return y * d**-0.5


def index_k_quant_fp8(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [n, D] rotated index keys -> (e4m3 [n, D], fp32 scale [n]): one plain (not
    power-of-two) scale max(1e-4, amax) / 448 per key, the indexer cache's 132-byte token."""
    scale = k.float().abs().amax(-1).clamp_min(1e-4) / E4M3_MAX
    return _to_fp8(k.float() / scale[:, None]), scale


# ---- FP4 ------------------------------------------------------------------------------------------
def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values in [-6, 6] to the e2m1 grid, ties to even (`fp4_fake_quant.round_fp4`)."""
    mag = x.abs()
    step = torch.where(mag < 2.0, 0.5, torch.where(mag < 4.0, 1.0, 2.0))
    return torch.round(mag / step) * step * torch.sign(x)


def fake_quant_fp4(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """`fp4_fake_quant.fake_quant_fp4`: e2m1 with one ue8m0 scale per `block`, back to x's dtype
    (the V4.1 index queries and keys)."""
    g = x.float().unflatten(-1, (-1, block))
    scale = ceil_pow2(g.abs().amax(-1).clamp_min(6 * 2.0**-126) * (1.0 / E2M1_MAX))
    deq = round_e2m1((g / scale[..., None]).clamp(-E2M1_MAX, E2M1_MAX)) * scale[..., None]
    return deq.flatten(-2).to(x.dtype)


def fake_quant_compressed_kv(x: torch.Tensor) -> torch.Tensor:
    """`fp4_fake_quant.fake_quant_compressed_kv`: e2m1 with one e4m3 scale per 16 (amax / 6
    rounded to e4m3, clamped to [2^-9, 448]), back to x's dtype (the V4.1 ratio-1/2 latents)."""
    g = x.float().unflatten(-1, (-1, 16))
    scale = (g.abs().amax(-1, keepdim=True) * (1.0 / E2M1_MAX)).clamp(2.0**-9, E4M3_MAX)
    scale = scale.to(FP8).float()
    return (round_e2m1((g / scale).clamp(-E2M1_MAX, E2M1_MAX)) * scale).flatten(-2).to(x.dtype)


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """fp32 values already on the e2m1 grid (|x| <= 6) -> 4-bit codes uint8 (sign in bit 3)."""
    mags = torch.tensor(E2M1_VALUES[:8], device=x.device)
    idx = (x.abs().unsqueeze(-1) == mags).to(torch.uint8).argmax(-1).to(torch.uint8)
    return idx | (torch.signbit(x).to(torch.uint8) << 3)


def mxfp4_quant(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """A float [..., N, K] weight -> (packed int8 [..., N, K/2], e8m0 scale bytes uint8
    [..., N, K/group]): the V4.1 routed-expert checkpoint format (two e2m1 codes a byte, the
    even index in the low nibble; scale 2^(e-127) = ceil_pow2(amax / 6))."""
    g = w.float().unflatten(-1, (-1, group))
    scale = ceil_pow2(g.abs().amax(-1).clamp_min(2.0**-126) / E2M1_MAX)
    codes = _e2m1_codes(round_e2m1((g / scale[..., None]).clamp(-E2M1_MAX, E2M1_MAX))).flatten(-2)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    exp = ((scale.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    return packed.view(torch.int8), exp


def mxfp4_dequant(packed: torch.Tensor, scale_exp: torch.Tensor, group: int = 32) -> torch.Tensor:
    """Inverse of `mxfp4_quant`: fp32 [..., N, K] (as `cast_e2m1fn_to_e4m3fn` reads the codes:
    low nibble first, `DSV4_DEQUANT_FP4_TABLE`)."""
    u = packed.view(torch.uint8)
    codes = torch.stack([u & 0x0F, u >> 4], dim=-1).flatten(-2)
    vals = torch.tensor(E2M1_VALUES, device=u.device)[codes.long()]
    scale = torch.exp2(scale_exp.float() - 127).repeat_interleave(group, -1)
    return vals * scale
