"""SGLang 0.5.23's byte layouts of DeepSeek-V4.1's per-layer state, written and read in torch.

Both ISAs serve the V4 layout by default (`SGLANG_DSV4_KV_LAYOUT` defaults to "v4";
`select_dsv4_kv_layout` picks the V4.1 layouts only on request, on SM100 or gfx950 with
aiter_sparse). Layouts (`DeepSeekV4TokenToKVPool`):

* SWA and compressed KV pools (`DeepSeekV4SingleKVPool`, `KVLayout.V4`): uint8
  [pages, page_bytes]; a page holds `page` token rows of nope e4m3 + rope bf16
  (nope + 2*rope bytes, 576 for V4.1) followed by `page` scale rows of nope/64 ue8m0 bytes + 1
  pad byte (8); page_bytes rounds page * (row + scales) up to a multiple of the row (576).
  The SWA pool's page is the SWA page (= --page-size, 256); a ratio-R compressed pool's page is
  page_size / R and its slot is full slot // R.
* C4 indexer keys (`DeepSeekV4IndexerPool`, fp8): uint8 [pages, page * (D + 4)]: `page` e4m3
  keys of D bytes, then `page` fp32 scales; page = page_size / 4 (64).
* V4.1 ratio-1/2 indexer keys (fp4, `force_fp4`): uint8 [pages, page * (D/2 + D/32)]: `page`
  packed e2m1 rows (low nibble = even index), then `page` rows of D/32 ue8m0 bytes; page =
  `DSV41_INDEX_PAGE_SIZE` (64 without DeepGEMM's paged sparse logits).
* Compress state (`CompressStatePool.kv_score_buffer`): fp32 [rows, last_dim], the last row
  the empty one (kv 0, score -inf). C4 rows follow the SWA pages (swa_page * ring + swa % ring,
  last_dim 4*hd); C128 (offline) and ratio 2 are request rings (req * ring + pos % ring, 2*hd).

Shapes are generic in (nope, rope, D) so the tiny config uses the same code; SGLang's own
readers (tests) fix 448 / 64 / 128.
"""

from __future__ import annotations

import torch

from .quant import E2M1_VALUES

__all__ = [
    "SGLANG_READS",
    "ape_hotfix",
    "empty_state",
    "index_fp4_read",
    "index_fp4_row_bytes",
    "index_fp4_write",
    "index_fp8_read",
    "index_fp8_write",
    "req_ring_loc",
    "swa_ring_loc",
    "v4_page_bytes",
    "v4_read",
    "v4_token_bytes",
    "v4_write",
]

SGLANG_READS: tuple[str, ...] = (
    "sglang.kernels.ops.attention.dsv4.kv_layout.KVLayout.V4",
    "sglang.kernels.ops.attention.dsv4.kv_layout.KVLayout.page_bytes",
    "sglang.kernels.ops.attention.dsv4.dequant_k_cache.NOPE_ROPE_BYTES",
    "sglang.kernels.ops.attention.dsv4.dequant_k_cache.PADDED_SCALE_PER_TOKEN",
    "sglang.kernels.ops.kvcache.dsv4_main_kv_store.SetKAndS",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4SingleKVPool.create_buffer",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4IndexerPool.get_index_k_dequant",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool.source_layer_of",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.get_compress_state_ring_size",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.get_swa_ring_size",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.select_dsv4_kv_layout",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.DSV41_INDEX_PAGE_SIZE",
    "sglang.srt.mem_cache.deepseek_v4_compress_state.CompressStatePool.translate_from_swa_loc_to_state_loc",
    "sglang.srt.mem_cache.deepseek_v4_compress_state.CompressStatePool.translate_from_req_position_to_state_loc",
    "sglang.srt.mem_cache.deepseek_v4_compress_state.KVAndScore.clear",
    "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch",
    "sglang.srt.layers.attention.dsv4.compressor.Compressor._apply_ape_hotfix",
    "sglang.test.kernels.deepseek_v4.k_cache_reference.set_k_and_s_torch",
    "sglang.test.kernels.deepseek_v4.k_cache_reference.dequantize_k_cache_paged_ref",
)

TILE = 64  # V4 nope values sharing one ue8m0 scale


# ---- V4 KV rows ----------------------------------------------------------------------------------
def v4_token_bytes(nope: int, rope: int) -> int:
    """Bytes a token takes in a V4 page: nope e4m3 + rope bf16 + nope/64 scales + 1 pad (584)."""
    return nope + 2 * rope + nope // TILE + 1


def v4_page_bytes(page: int, nope: int, rope: int) -> int:
    """`KVLayout.V4.page_bytes`: page * token bytes, rounded up to the row size (576)."""
    row = nope + 2 * rope
    return -(-page * v4_token_bytes(nope, rope) // row) * row


def _v4_offsets(loc: torch.Tensor, page: int, page_bytes: int, nope: int, rope: int):
    loc = loc.long()
    pg, off = loc // page, loc % page
    row = nope + 2 * rope
    data = pg * page_bytes + off * row
    scale = pg * page_bytes + page * row + off * (nope // TILE + 1)
    return data, scale


def v4_write(buf: torch.Tensor, loc: torch.Tensor, q: torch.Tensor, exp: torch.Tensor, rope_bf16: torch.Tensor,
             page: int) -> None:
    """Store rows (`quant.kv_quant_v4`'s output) at slots `loc` of a V4 pool uint8
    [pages, page_bytes], as `set_k_and_s_torch` / the fused stores do. In place."""
    nope, rope = q.shape[-1], rope_bf16.shape[-1]
    flat = buf.view(-1)
    data, scale = _v4_offsets(loc, page, buf.shape[-1], nope, rope)
    cols = data[:, None] + torch.arange(nope)[None]
    flat[cols] = q.view(torch.uint8)
    rcols = data[:, None] + nope + torch.arange(2 * rope)[None]
    flat[rcols] = rope_bf16.contiguous().view(torch.uint8).view(-1, 2 * rope)
    flat[scale[:, None] + torch.arange(nope // TILE)[None]] = exp


def v4_read(buf: torch.Tensor, loc: torch.Tensor, page: int, nope: int, rope: int) -> torch.Tensor:
    """The bf16 rows [n, nope + rope] FlashMLA reads at slots `loc` (`dequantize_k_cache_paged_ref`:
    e4m3 x 2^(byte - 127), zero below 2^-126; rope as stored)."""
    flat = buf.view(-1)
    data, scale = _v4_offsets(loc, page, buf.shape[-1], nope, rope)
    q = flat[data[:, None] + torch.arange(nope)[None]].view(torch.float8_e4m3fn).float()
    exp = flat[scale[:, None] + torch.arange(nope // TILE)[None]].to(torch.int32)
    s = torch.exp2((exp - 127).float())
    s = torch.where(s < 2.0**-126, torch.zeros_like(s), s).repeat_interleave(TILE, -1)
    r = flat[data[:, None] + nope + torch.arange(2 * rope)[None]].contiguous().view(torch.bfloat16)
    return torch.cat([(q * s).to(torch.bfloat16), r], dim=-1)


# ---- index keys -----------------------------------------------------------------------------------
def index_fp8_write(buf: torch.Tensor, loc: torch.Tensor, q8: torch.Tensor, scale: torch.Tensor, page: int) -> None:
    """C4 index keys: e4m3 [n, D] and fp32 scales [n] into uint8 [pages, page * (D + 4)]."""
    d = q8.shape[-1]
    loc = loc.long()
    pg, off = loc // page, loc % page
    buf[pg[:, None], off[:, None] * d + torch.arange(d)[None]] = q8.view(torch.uint8)
    buf[pg[:, None], page * d + off[:, None] * 4 + torch.arange(4)[None]] = (
        scale.float().contiguous().view(torch.uint8).view(-1, 4))


def index_fp8_read(buf: torch.Tensor, loc: torch.Tensor, page: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `index_fp8_write`: (e4m3 values as fp32 [n, D], fp32 scales [n])."""
    loc = loc.long()
    pg, off = loc // page, loc % page
    q = buf[pg[:, None], off[:, None] * d + torch.arange(d)[None]].view(torch.float8_e4m3fn).float()
    s = buf[pg[:, None], page * d + off[:, None] * 4 + torch.arange(4)[None]].contiguous().view(torch.float32)
    return q, s.view(-1)


def index_fp4_row_bytes(d: int) -> int:
    return d // 2 + d // 32


def index_fp4_write(buf: torch.Tensor, loc: torch.Tensor, values: torch.Tensor, page: int) -> None:
    """V4.1 index keys already on the fp4 grid (`fake_quant_fp4` output) into the fp4 pool:
    codes two a byte (even index low) and one ue8m0 byte per 32 (`store_fp4_index_k_cache`
    with rne; re-quantizing on-grid values reproduces them exactly)."""
    d = values.shape[-1]
    g = values.float().unflatten(-1, (-1, 32))
    amax = g.abs().amax(-1).clamp_min(6 * 2.0**-126)
    bits = (amax / 6.0).view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    scale = (exp << 23).view(torch.float32)
    scaled = (g / scale[..., None]).flatten(-2)
    mags = torch.tensor(E2M1_VALUES[:8])
    codes = (scaled.abs().unsqueeze(-1) == mags).to(torch.uint8).argmax(-1).to(torch.uint8)
    codes = codes | (torch.signbit(scaled).to(torch.uint8) << 3)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    loc = loc.long()
    pg, off = loc // page, loc % page
    buf[pg[:, None], off[:, None] * (d // 2) + torch.arange(d // 2)[None]] = packed
    buf[pg[:, None], page * (d // 2) + off[:, None] * (d // 32) + torch.arange(d // 32)[None]] = exp.to(torch.uint8)


def index_fp4_read(buf: torch.Tensor, loc: torch.Tensor, page: int, d: int) -> torch.Tensor:
    """Inverse of `index_fp4_write` (`DeepSeekV4IndexerPool.get_index_k_dequant`): fp32 [n, D]."""
    loc = loc.long()
    pg, off = loc // page, loc % page
    u = buf[pg[:, None], off[:, None] * (d // 2) + torch.arange(d // 2)[None]]
    codes = torch.stack([u & 0x0F, u >> 4], dim=-1).flatten(1)
    vals = torch.tensor(E2M1_VALUES)[codes.long()]
    e = buf[pg[:, None], page * (d // 2) + off[:, None] * (d // 32) + torch.arange(d // 32)[None]]
    return vals * torch.exp2(e.float() - 127).repeat_interleave(32, -1)


# ---- compress state ---------------------------------------------------------------------------------
def swa_ring_loc(swa_slot: torch.Tensor, ring: int, swa_page: int) -> torch.Tensor:
    """`CompressStatePool.translate_from_swa_loc_to_state_loc` (C4): swa_page * ring + swa % ring."""
    return (swa_slot // swa_page) * ring + swa_slot % ring


def req_ring_loc(req_row: torch.Tensor, pos: torch.Tensor, ring: int, rows: int) -> torch.Tensor:
    """`translate_from_req_position_to_state_loc` (C128 offline, ratio 2): req * ring + pos % ring;
    a negative position is the empty last row."""
    loc = req_row * ring + pos % ring
    return torch.where(pos < 0, torch.full_like(loc, rows - 1), loc)


def empty_state(rows: int, last_dim: int) -> torch.Tensor:
    """A state pool whose every row is empty (`KVAndScore.clear`: kv 0, score -inf)."""
    st = torch.zeros(rows, last_dim, dtype=torch.float32)
    st[:, last_dim // 2 :] = float("-inf")
    return st


def ape_hotfix(ape: torch.Tensor, ratio: int) -> torch.Tensor:
    """`Compressor._apply_ape_hotfix` at load: the overlap compressor's checkpoint ape
    [4, 2*hd] is stored back as cat(ape[:, :hd], ape[:, hd:]) so that its [8, hd] view gives
    the bias of the 8 pooled rows (previous block's overlap halves, then this block's)."""
    if ratio != 4:
        return ape.clone()
    a, b = torch.chunk(ape, 2, dim=-1)
    return torch.cat([a, b], dim=0).reshape(ape.shape).contiguous()
