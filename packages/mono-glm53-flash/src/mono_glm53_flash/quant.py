"""The number formats of GLM-5.3-Flash's decode step, in plain torch (no sglang import).

FP8 (e4m3fn, max 448), from mono-common (`mono_common.ref.fp8`, re-exported here):
- weights: block-quantised, one fp32 scale (`weight_scale_inv`) a `block` x `block` tile
  (`block_quant`, `block_dequant`).
- activations of an FP8 linear: one scale a token and 128-group, absmax / 448, no rounding
  of the scale (`per_token_group_quant`, `fp8_block_linear`).
- index query / pooled index keys: `act_quant(..., scale_fmt="ue8m0")` rounds the scale up
  to a power of two (the key compression kernel does the same with amax clamped to 1e-4).

MXFP4 (OCP MX: e2m1 elements, one e8m0 power-of-two scale a 32-element group):
- two elements a byte, the even element in the low nibble (`fp8_utils.dequant_mxfp4`,
  `quark_w4a4_mxfp4._dequant_mxfp4_to_bf16`); e8m0 byte b is 2 ** (b - 127), 255 is NaN.
- SGLang keeps the scales as fp32 values on CUDA and as float8_e8m0fnu bytes on ROCm/XPU
  (`Fp8MoEMethod.create_weights`, `fp4_scale_dtype`); `mxfp4_dequant` reads either.

Activation formats of the MXFP4 expert GEMMs (`quant_act`): "bf16" (W4A16: SGLang's CUDA
MXFP4 expert kernels multiply dequantised weights by bf16 activations), "mxfp8" (the
published gfx950 port; AITER's a8w4) and "mxfp4" (W4A4: AITER's default native MXFP4 MoE and
Quark). The mx activation quantisers follow the OCP MX v1.0 scale rule (shared exponent
floor(log2(amax)) - emax of the element format); AITER's own rounding of the activation
scale is not reproduced here (aiter's kernels do not run on the CPU).
"""

from __future__ import annotations

import torch

from mono_common.ref.fp8 import act_quant, block_dequant, block_quant, fp8_block_linear, per_token_group_quant

__all__ = [
    "SGLANG_READS",
    "FP8",
    "FP8_MAX",
    "E2M1_VALUES",
    "block_quant",
    "block_dequant",
    "per_token_group_quant",
    "act_quant",
    "fp8_block_linear",
    "bf16_linear",
    "mxfp4_pack",
    "mxfp4_unpack",
    "mxfp4_dequant",
    "mxfp4_quant",
    "e8m0_decode",
    "e8m0_encode",
    "quant_act",
    "ACT_FORMATS",
]

#: The SGLang 0.5.23 functions whose arithmetic this module mirrors.
SGLANG_READS: tuple[str, ...] = (
    "sglang.srt.layers.quantization.fp8_utils.block_quant_dequant",
    "sglang.srt.layers.quantization.fp8_utils.dequant_mxfp4",
    "sglang.srt.layers.quantization.fp8_utils.triton_w8a8_block_fp8_linear",
    "sglang.srt.layers.quantization.quark.schemes.quark_w4a4_mxfp4._dequant_mxfp4_to_bf16",
    "sglang.kernels.ops.quantization.fp8_kernel._per_token_group_quant_8bit",
    "sglang.kernels.ops.quantization.act_quant_triton._act_quant_kernel",
    "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.create_weights",
)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BF16 = torch.bfloat16
#: e2m1 code -> value (bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
ACT_FORMATS = ("bf16", "mxfp8", "mxfp4")


# ---- FP8: mono-common's references of SGLang's FP8 quantisers (mono_common.ref.fp8) --------
# block_quant / block_dequant (`block_quant_dequant`), per_token_group_quant
# (`_per_token_group_quant_8bit`), act_quant (`act_quant_triton.act_quant`, scale_fmt "ue8m0"
# rounds the scale up to a power of two) and fp8_block_linear (the W8A8 block linear).


def bf16_linear(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype = BF16) -> torch.Tensor:
    """An unquantised linear: exact products, fp32 accumulation, one rounding to `out_dtype`."""
    return (x.float() @ w.float().t()).to(out_dtype)


# ---- MXFP4 -----------------------------------------------------------------------------------
def e8m0_decode(s: torch.Tensor) -> torch.Tensor:
    """Scales as fp32 values: fp32 passes through, float8_e8m0fnu converts, a uint8 byte b is
    2 ** (b - 127) (255, the NaN code, decodes to NaN)."""
    if s.dtype == torch.float32:
        return s
    if s.dtype == torch.uint8:
        v = torch.exp2(s.float() - 127.0)
        return torch.where(s == 255, torch.full_like(v, float("nan")), v)
    return s.float()


def e8m0_encode(v: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 values -> e8m0 bytes (uint8)."""
    return (torch.log2(v).round() + 127).clamp(0, 254).to(torch.uint8)


def mxfp4_unpack(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes (uint8, int8 or float4_e2m1fn_x2) -> fp32 e2m1 values [..., K]."""
    b = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    out = torch.empty(*b.shape[:-1], b.shape[-1] * 2, dtype=torch.float32)
    out[..., 0::2] = lut[(b & 0xF).long()]
    out[..., 1::2] = lut[(b >> 4).long()]
    return out


def mxfp4_pack(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (0..15) [..., K] -> bytes [..., K/2], the even element in the low nibble."""
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def mxfp4_dequant(packed: torch.Tensor, scale: torch.Tensor, group: int = 32) -> torch.Tensor:
    """Packed MXFP4 [..., K/2] with scales [..., K/group] (fp32 values, e8m0 or uint8) -> fp32."""
    v = mxfp4_unpack(packed)
    s = e8m0_decode(scale)
    return (v.view(*v.shape[:-1], -1, group) * s[..., None]).view(v.shape)


def _e2m1_code(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values (already divided by their scale) to the nearest e2m1 code, ties to the
    even code, saturating at +-6."""
    mags = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32)
    a = x.abs().clamp(max=6.0)
    d = (a[..., None] - mags).abs()
    best = d.min(-1, keepdim=True).values
    ties = d == best
    # Among equally near codes take the even one (e2m1 mantissa bit 0).
    even = ties & (torch.arange(8) % 2 == 0)
    code = torch.where(even.any(-1), even.float().argmax(-1), ties.float().argmax(-1))
    return code | ((x < 0) & (code > 0)).to(code.dtype) << 3


def _mx_scale(x: torch.Tensor, group: int, emax: int) -> torch.Tensor:
    g = x.float().view(*x.shape[:-1], -1, group)
    amax = g.abs().amax(-1)
    exp = torch.floor(torch.log2(amax.clamp_min(2.0**-126))) - emax
    return torch.exp2(exp.clamp(-127, 127))


def mxfp4_quant(x: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [..., K] -> (packed bytes [..., K/2], fp32 power-of-two scales [..., K/group])."""
    s = _mx_scale(x, group, emax=2)
    g = x.float().view(*x.shape[:-1], -1, group) / s[..., None]
    return mxfp4_pack(_e2m1_code(g).view(x.shape)), s


def quant_act(x: torch.Tensor, fmt: str, group: int = 32) -> torch.Tensor:
    """The activation an MXFP4 expert GEMM multiplies, dequantised to fp32 (see module doc)."""
    if fmt == "bf16":
        return x.to(BF16).float()
    if fmt == "mxfp8":
        s = _mx_scale(x, group, emax=8)
        g = (x.float().view(*x.shape[:-1], -1, group) / s[..., None]).clamp(-FP8_MAX, FP8_MAX)
        return (g.to(FP8).float() * s[..., None]).view(x.shape)
    if fmt == "mxfp4":
        packed, s = mxfp4_quant(x, group)
        return mxfp4_dequant(packed, s, group)
    raise ValueError(f"activation format {fmt!r} is not one of {ACT_FORMATS}")
