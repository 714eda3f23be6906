"""Rotary embedding and the indexer's Hadamard rotation, as SGLang 0.5.23 computes them.

RoPE. `RotaryEmbedding` (layers/rotary_embedding/base.py) keeps an fp32 cos/sin cache,
`cat(cos(t * inv_freq), sin(t * inv_freq))` with inv_freq = base ** -(arange(0, d, 2) / d).
Two layouts of the rotated pairs:

* neox (`is_neox_style=True`): pair (i, i + d/2), as `x1, x2 = chunk(x, 2)`;
* interleaved / GPT-J (`is_neox_style=False`): pair (2i, 2i + 1), as `x[..., ::2], x[..., 1::2]`.

GLM-5.3's MLA rope is interleaved unless the config sets `rope_interleave=False`; the indexer
rope is neox unless the config sets `indexer_rope_interleave=True` (real GLM-5.x checkpoints
do). The indexer ropes the LEADING `qk_rope` dims of each 128-wide index head; the MLA ropes
the trailing `qk_rope` dims of q (after nope) and the 64 `k_pe` values.

Two arithmetic modes: `native=True` is `RotaryEmbedding.forward_native` (cos/sin cast to the
activation dtype, bf16 arithmetic); the default is the CUDA kernels' arithmetic
(`apply_rope_with_cos_sin_cache_inplace`, the fused indexer kernels): fp32 cos/sin and math,
one rounding to the output dtype. The two differ by at most a bf16 rounding per element.

Hadamard. `rotate_activation` (layers/attention/dsa/dsa_indexer.py) is
`hadamard_transform(x, scale=d ** -0.5)` with the Sylvester-ordered matrix
(H[i, j] = (-1) ** popcount(i & j)), computed in fp32 and returned in x's dtype.
"""

from __future__ import annotations

import torch

__all__ = ["inv_freq", "rope_cos_sin", "apply_rope", "hadamard_matrix", "hadamard_rotate"]


def inv_freq(rotary_dim: int, base: float, device=None) -> torch.Tensor:
    """Mirrors `RotaryEmbedding._compute_inv_freq` (fp32)."""
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device=device) / rotary_dim))


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (cos, sin) [T, rotary_dim/2] for `positions`: the rows of
    `RotaryEmbedding._compute_cos_sin_cache` at those positions (t * inv_freq is one fp32
    multiply either way, so the values are the cache's)."""
    f = inv_freq(rotary_dim, base, positions.device)
    freqs = positions.to(torch.float32)[:, None] * f[None, :]
    return freqs.cos(), freqs.sin()


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    native: bool = False,
) -> torch.Tensor:
    """Rotate x [T, heads, d] (or [T, d]) by per-token cos/sin [T, d/2].

    Mirrors `sglang.srt.layers.rotary_embedding.utils.apply_rotary_emb` when `native`
    (its `forward_native` path), else the CUDA kernels (fp32 math). Returns x's dtype.
    """
    squeeze = x.dim() == 2
    if squeeze:
        x = x[:, None, :]
    work = x.dtype if native else torch.float32
    c = cos[:, None, :].to(work)
    s = sin[:, None, :].to(work)
    xw = x.to(work)
    if interleaved:
        x1, x2 = xw[..., ::2], xw[..., 1::2]
    else:
        x1, x2 = torch.chunk(xw, 2, dim=-1)
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    if interleaved:
        out = torch.stack((o1, o2), dim=-1).flatten(-2)
    else:
        out = torch.cat((o1, o2), dim=-1)
    out = out.to(x.dtype)
    return out[:, 0, :] if squeeze else out


_HADAMARD = {}


def hadamard_matrix(n: int, device=None) -> torch.Tensor:
    """The Sylvester Hadamard matrix of order n (power of 2), fp32, unnormalised.

    Cached per device, so a CUDA graph captured after one eager call copies nothing."""
    if n & (n - 1):
        raise ValueError("Hadamard order must be a power of 2")
    key = (n, str(torch.device(device) if device is not None else "cpu"))
    h = _HADAMARD.get(key)
    if h is None:
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
        h = _HADAMARD[key] = h.to(device)
    return h


def hadamard_rotate(x: torch.Tensor) -> torch.Tensor:
    """Mirrors `sglang.srt.layers.attention.dsa.dsa_indexer.rotate_activation` on CUDA
    (`hadamard_transform(x, scale=d**-0.5)`): fp32 math, x's dtype out."""
    d = x.shape[-1]
    h = hadamard_matrix(d, x.device)
    return ((x.float() @ h) * d**-0.5).to(x.dtype)
