"""Numerics helpers every stage shares: bf16 / e4m3 rounding, exact division, block quantisation.

All functions are `@triton.jit` device functions on fp32 tensors of any shape:
  rbf(x) -> bf16          fp32 -> bf16, round to nearest even (also under the interpreter)
  bf16r(x) -> fp32        round to bf16 and back (SGLang stores bf16 between ops)
  div_rn(a, b) -> fp32    correctly rounded division (scales must match torch bit for bit)
  e4m3_bits(x, HW) -> int32  fp32 -> e4m3fn code 0..255, RNE, saturating at +-448 (HW: sm_90's
                          conversion unit, the same bits)
  e4m3_val(code) -> fp32  e4m3fn code -> value
  e4m3_bf16(w, FAST) -> bf16  uint8 e4m3fn codes -> bf16 values (FAST: on the integer and bf16
                          FMA pipes instead of the conversion unit, sm_90 only)
  dot(a, b) -> fp32       bf16 x bf16 -> fp32 tl.dot (fp32 IEEE upcasts under the interpreter)
  dot16(a, b) -> fp32     the same on f16 operands
  e4m3_f16(w) -> f16      uint8 e4m3fn codes -> f16 values (sm_90's conversion unit, a pair an
                          instruction)
  e4m3_operand(w, CVT), dot_as(a, b, CVT)  the weights converted and multiplied in the form CVT
                          names: bf16 (False / True, e4m3_bf16's FAST) or f16 (CVT_F16)
  dot_fp8(w, xt) -> fp32  e4m3 x e4m3 tl.dot on FP8 tensor cores
  quant_blocks(v [D], D, BLK, HW) -> (e4m3 values as bf16 [D], fp32 scale [D // BLK])
                          per-BLK-group activation quantisation (SGLang's per_token_group_quant)

Why hand-rolled: the Triton 3.8 interpreter truncates fp32 -> bf16, misrounds fp32 -> fp8 and
computes bf16 x bf16 tl.dot wrongly; these helpers give the compiled code's bits on the CPU too.
"""

import os

import triton
import triton.language as tl

INTERP = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def dot(a, b):
    """bf16 x bf16 -> fp32 dot (operands rounded to bf16 first)."""
    if INTERP:
        r = tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32),
                   input_precision="ieee")
    else:
        r = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    return r


# `e4m3_operand` / `dot_as`'s conversion forms beside e4m3_bf16's (False / True): the e4m3
# weights to f16 on sm_89+'s conversion unit and f16 MMAs
CVT_F16 = tl.constexpr(2)


@triton.jit
def dot16(a, b):
    """f16 x f16 -> fp32 dot (operands rounded to f16 first; e4m3 values are exact in f16 as in
    bf16, so on e4m3 values this is `dot`'s sum of exact products)."""
    if INTERP:
        r = tl.dot(a.to(tl.float16).to(tl.float32), b.to(tl.float16).to(tl.float32), input_precision="ieee")
    else:
        r = tl.dot(a.to(tl.float16), b.to(tl.float16))
    return r


@triton.jit
def dot_fp8(w_bits, xq_t):
    """e4m3 x e4m3 -> fp32 dot: w_bits uint8 e4m3 codes [M, K], xq_t e4m3 values (held as bf16)
    [K, N]. On FP8 tensor cores (exact products; the accumulation inside one MMA keeps fewer
    bits than fp32 on sm_90). Under the interpreter: fp32 IEEE on the upcasts."""
    if INTERP:
        r = tl.dot(w_bits.to(tl.float8e4nv, bitcast=True).to(tl.float32), xq_t.to(tl.float32),
                   input_precision="ieee")
    else:
        r = tl.dot(w_bits.to(tl.float8e4nv, bitcast=True), xq_t.to(tl.float8e4nv))
    return r


@triton.jit
def rbf(x):
    """fp32 -> bf16, round to nearest even. The interpreter's own cast truncates, so there
    the rounding is done on the bits (finite values; the +0x7FFF carry is RNE)."""
    if INTERP:
        b = x.to(tl.int32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
        y = b.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        y = x.to(tl.bfloat16)
    return y


@triton.jit
def bf16r(x):
    """Round fp32 to bf16 and back (SGLang stores bf16 between ops)."""
    return rbf(x).to(tl.float32)


@triton.jit
def div_rn(a, b):
    """Correctly rounded fp32 division (Triton's `/` may lower to an approximate divide, and the
    FP8 scales must match torch's bit for bit)."""
    return tl.math.div_rn(a, b)


@triton.jit
def e4m3_bits(x, HW: tl.constexpr = False):
    """fp32 -> e4m3fn bits (int32 0..255), round to nearest even, saturating at 448 (torch's
    clamp-then-cast). The interpreter's own fp32->fp8 cast rounds differently, hence the ints.
    HW (sm_90 only): the conversion unit's `cvt.rn.satfinite` instead, the same bits in a few
    instructions an element where the integer form takes ~20: a stage's code is fetched from
    HBM each launch at ~0.25 us a KB (H200, session 21), so its size is time."""
    if HW and not INTERP:
        return x.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    ab = bits & 0x7FFFFFFF
    e = (ab >> 23) - 127
    # normal: round the 23-bit mantissa to 3 bits on the (exp|mant) word, then rebias 127 -> 7
    rnd = (ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20
    normal = rnd - (120 << 3)
    # subnormal (|x| < 2^-6): value = m * 2^-9 with m rounded to nearest even
    a = ab.to(tl.float32, bitcast=True) * 512.0
    fl = tl.floor(a)
    fr = a - fl
    fli = fl.to(tl.int32)
    up = (fr > 0.5) | ((fr == 0.5) & ((fli & 1) == 1))
    sub = fli + up.to(tl.int32)
    code = tl.where(e >= -6, normal, sub)
    code = tl.minimum(code, 0x7E)
    return code | (sign << 7)


@triton.jit
def e4m3_val(code):
    """e4m3fn bits (int32) -> fp32 value."""
    return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


# Four e4m3fn codes (one 32-bit register) -> four bf16 values (two registers), exactly: each code
# spread into a 16-bit lane, its sign to bit 15 and its exponent and mantissa bits under bf16's
# exponent field (bias 127 instead of 7), then one bf16x2 multiply by 2^120 rebiases it (exact: a
# power of two; e4m3 subnormals are bf16 subnormals before it, normals after).
_E4M3_BF16_PTX = tl.constexpr("""{
.reg .b32 lo, hi, s, m, k;
mov.b32 k, 0x7B807B80;
prmt.b32 lo, $2, 0, 0x4140;
prmt.b32 hi, $2, 0, 0x4342;
shl.b32 s, lo, 8;
shl.b32 m, lo, 4;
and.b32 s, s, 0x80008000;
and.b32 m, m, 0x07F007F0;
or.b32 lo, s, m;
shl.b32 s, hi, 8;
shl.b32 m, hi, 4;
and.b32 s, s, 0x80008000;
and.b32 m, m, 0x07F007F0;
or.b32 hi, s, m;
mul.rn.bf16x2 $0, lo, k;
mul.rn.bf16x2 $1, hi, k;
}""")


@triton.jit
def e4m3_bf16(w, FAST: tl.constexpr = False):
    """uint8 e4m3fn codes -> bf16 values (any shape). FAST (sm_90 only, not under the
    interpreter): integer and bf16x2 instructions instead of Triton's cast, which runs two
    conversion-unit instructions a value (cvt e4m3x2 -> f16x2, f16 -> bf16) at a quarter of the
    SM's rate: converting a [64, 128] weight block that way took ~1 us a K block in the MoE
    gate_up (sm_90 PTX, H200 stamps, session 14). Same values for every finite code; the two
    NaN codes (0x7F, 0xFF) read as +-480, where the cast gives NaN: no FP8 checkpoint stores
    them (quantisers saturate at +-448)."""
    if FAST and not INTERP:
        v = tl.inline_asm_elementwise(_E4M3_BF16_PTX, "=r,=r,r", [w], dtype=tl.bfloat16, is_pure=True, pack=4)
    else:
        v = w.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
    return v


@triton.jit
def e4m3_f16(w):
    """uint8 e4m3fn codes -> f16 values (any shape), exact: one conversion-unit instruction a
    pair of values (sm_89+ `cvt.rn.f16x2.e4m3x2`), where `e4m3_bf16`'s FAST path takes ~6
    integer and bf16 instructions a pair (for `dot16`)."""
    return w.to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def e4m3_operand(w, CVT: tl.constexpr):
    """uint8 e4m3fn codes -> the MMA operand `dot_as` takes for CVT: f16 values (CVT_F16,
    `e4m3_f16`) or bf16 ones (`e4m3_bf16`, CVT its FAST)."""
    if CVT == CVT_F16:
        v = e4m3_f16(w)
    else:
        v = e4m3_bf16(w, CVT)
    return v


@triton.jit
def dot_as(a, b, CVT: tl.constexpr):
    """`dot16` for CVT_F16, else `dot`: the MMA on the operands `e4m3_operand` made."""
    if CVT == CVT_F16:
        r = dot16(a, b)
    else:
        r = dot(a, b)
    return r


@triton.jit
def quant_blocks(v, D: tl.constexpr, BLK: tl.constexpr, HW: tl.constexpr = False):
    """fp32 [D] (bf16 values) -> (e4m3 values as bf16 [D], fp32 scale per BLK group [D // BLK]):
    SGLang's per-token-group FP8 quantisation (scale = max(amax, 1e-10) / 448, q = x * (1 / s)),
    done once by the producer of a GEMV's input. HW: `e4m3_bits`'s sm_90 conversion."""
    v2 = tl.reshape(v, [D // BLK, BLK])
    sxq = div_rn(tl.maximum(tl.max(tl.abs(v2), 1), 1e-10), 448.0)
    inv = div_rn(tl.full([D // BLK], 1.0, tl.float32), sxq)
    q = e4m3_val(e4m3_bits(v2 * inv[:, None], HW)).to(tl.bfloat16)
    return tl.reshape(q, [D]), sxq


@triton.jit
def quant_rows(x, BM: tl.constexpr, HW: tl.constexpr = False):
    """fp32 [BM, BLK] (one K block of BM rows) -> (e4m3 values as bf16 [BM, BLK], fp32 scale
    [BM]): the same quantisation as `quant_blocks`, for a GEMV tile that quantises its input.
    HW: `e4m3_bits`'s sm_90 conversion (the same bits, about half a GEMV span's code)."""
    sxq = div_rn(tl.maximum(tl.max(tl.abs(x), 1), 1e-10), 448.0)
    inv = div_rn(tl.full([BM], 1.0, tl.float32), sxq)
    return e4m3_val(e4m3_bits(x * inv[:, None], HW)).to(tl.bfloat16), sxq
