"""Normalisation helpers of the stages.

  rmsnorm_vec(x [D] fp32, w_ptr bf16 [D], D, eps) -> fp32 [D] holding bf16 values: RMSNorm in
      fp32 with one bf16 rounding of the output (SGLang's RMSNorm CUDA kernels)
"""

import triton
import triton.language as tl

from mono_common.stages.numerics import bf16r


@triton.jit
def rmsnorm_vec(x, w_ptr, D: tl.constexpr, eps):
    """RMSNorm of an fp32 vector with a bf16 weight: fp32 math, one bf16 rounding. The weight is
    requested before the sum of squares, whose cross-warp reduction ends in a barrier that no
    later load crosses (after a weight stream the norm weight is not in the L2: an HBM round
    trip of its own behind the reduction)."""
    w = tl.load(w_ptr + tl.arange(0, D)).to(tl.float32)
    var = tl.sum(x * x, 0) / D
    return bf16r(x * tl.rsqrt(var + eps) * w)
