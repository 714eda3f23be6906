"""Position and rotation helpers of attention stages: RoPE and the Sylvester Hadamard rotation.

  rope_apply(x_ptr, pos, cs_ptr, RD, NEOX) -> fp32 [RD]: RoPE of RD fp32 values at x_ptr at
      position pos, cs_ptr the fp32 [positions, RD] cos | sin table (RotaryEmbedding's
      cos_sin_cache layout); NEOX pairs (i, i + RD/2), else interleaved (2i, 2i + 1). The same
      as rope_rotate(x_ptr, *rope_cs(pos, cs_ptr, RD, NEOX), RD, NEOX): the table read apart,
      for a caller that requests it before its values are ready
  hadamard(src_ptr, D, hscale) -> fp32 [D]: x[D] @ H_D * hscale, H the Sylvester matrix
      (SGLang's rotate_activation for the DSA indexer)
References: mono_common.ref.rope.
"""

import triton
import triton.language as tl


@triton.jit
def _rope_lanes(RD: tl.constexpr, NEOX: tl.constexpr):
    """Each lane's partner, sign and cos | sin column: NEOX pairs (i, i + RD/2), else (2i, 2i + 1)."""
    j = tl.arange(0, RD)
    HALF: tl.constexpr = RD // 2
    if NEOX:
        partner = (j + HALF) % RD
        sgn = tl.where(j < HALF, -1.0, 1.0)
        ci = j % HALF
    else:
        partner = j ^ 1
        sgn = tl.where((j & 1) == 0, -1.0, 1.0)
        ci = j // 2
    return j, partner, sgn, ci


@triton.jit
def rope_cs(pos, cs_ptr, RD: tl.constexpr, NEOX: tl.constexpr):
    """(cos, sin) [RD] of position pos as each lane of `rope_rotate` takes them: the table read
    alone, so a caller can request it before the values to rotate are ready (the table row is
    not in the L2 after a weight stream: an HBM round trip of its own)."""
    j, partner, sgn, ci = _rope_lanes(RD, NEOX)
    HALF: tl.constexpr = RD // 2
    return tl.load(cs_ptr + pos * RD + ci), tl.load(cs_ptr + pos * RD + HALF + ci)


@triton.jit
def rope_rotate(x_ptr, c, s, RD: tl.constexpr, NEOX: tl.constexpr):
    """RoPE of the RD fp32 values at x_ptr with `rope_cs`'s (c, s): `rope_apply`'s values."""
    j, partner, sgn, ci = _rope_lanes(RD, NEOX)
    x = tl.load(x_ptr + j)
    xp = tl.load(x_ptr + partner)
    return x * c + sgn * (xp * s)


@triton.jit
def rope_apply(x_ptr, pos, cs_ptr, RD: tl.constexpr, NEOX: tl.constexpr):
    """RoPE of the RD fp32 values at x_ptr at position pos (fp32 math, as SGLang's CUDA kernels);
    cs row = cos[RD/2] | sin[RD/2] (RotaryEmbedding's cos_sin_cache layout)."""
    c, s = rope_cs(pos, cs_ptr, RD, NEOX)
    return rope_rotate(x_ptr, c, s, RD, NEOX)


@triton.jit
def hadamard(src_ptr, D: tl.constexpr, hscale):
    """x[D] @ H_D * hscale, x read from memory one element a step (a [D, D] sign matrix would
    spill, and a [16, D] chunk summed over its rows is a cross-warp reduction whose offsets
    hold scalar registers on gfx950), Sylvester H[i, j] = (-1)^popcount(i & j), fp32."""
    j = tl.arange(0, D)
    acc = tl.zeros([D], tl.float32)
    # 16 steps unrolled a group: their loads are independent, so a group's are in flight
    # together (one step an iteration paid a load latency each, ~3 us at D = 128 on the H200;
    # a whole unroll held 128 loaded values in scalar registers and spilled on gfx950); the
    # sum keeps its order
    G: tl.constexpr = 16 if D >= 16 else D
    for i0 in range(0, D, G):
        for g in tl.static_range(G):
            acc = _hadamard_step(acc, i0 + g, j, src_ptr)
    return acc * hscale


@triton.jit
def _hadamard_step(acc, i, j, src_ptr):
    """acc + H[i, j] * x[i] for every lane j."""
    a = i & j
    p = a ^ (a >> 16)
    p = p ^ (p >> 8)
    p = p ^ (p >> 4)
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    return acc + tl.where((p & 1) == 0, 1.0, -1.0) * tl.load(src_ptr + i)
