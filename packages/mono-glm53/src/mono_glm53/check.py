"""Check mode: `SGLANG_AMD_MONO_CHECK=1` (eager decode only).

Every covered layer of every routed step runs twice on the same input: the launch, then
SGLang's own `DeepseekV2DecoderLayer` (its attention backend, its MoE) on copies of the
launch's inputs (hidden and residual cloned, the residual stream rebuilt with
`ResidualStream.from_handoff`) and on the cache rows as they were before the launch (the
rows the step writes are snapshot, restored for SGLang's layer, and the launch's rows
are written back afterwards, so what the server keeps is the launch's). Then three outputs
are compared with `mono_common.check.compare` against the spec's `NUMERICS`:

- `layer.stream`: the residual stream the next layer reads (mlp output + residual, fp32);
- `layer.kv`: the MLA KV row each step row wrote (576 bf16 values);
- `layer.index_k`: the index key each row wrote, dequantized (fp8 e4m3 x its fp32 scale).

Every value out of bounds is logged (layer, output, metric, value, bound); none is
dropped. The launch's outputs are what the step continues with. The check costs a
second layer per layer and a few row copies: it is a debugging mode, refused under CUDA
graphs (config_disable_reasons and here).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from mono_common.check import Violation, compare

logger = logging.getLogger(__name__)

CHECK_ENV = "SGLANG_AMD_MONO_CHECK"
LAUNCH = "layer"

SGLANG_READS = (
    "sglang.srt.layers.layer_boundary.residual.stream.ResidualStream.from_handoff",
    "sglang.srt.layers.layer_boundary.residual.add_norm.PLAIN_ADD",
    "sglang.srt.layers.layer_boundary.residual.batch.to_pp",
    "sglang.srt.utils.common.BumpAllocator",
    "sglang.srt.models.deepseek_v2.DeepseekV2DecoderLayer.forward",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch#residual_stream",
)


#: Bounds SGLang's `Numerics` cannot name (it takes cosine, max_abs and rel only), checked
#: beside the spec's NUMERICS: the stream's relative error ||mono - sglang|| / ||sglang||,
#: which a cosine cannot see when an error scales the whole output. 0.05 is the kernel's own
#: bound on the layer output against the reference (mono_glm53.kernels.numerics:
#: glm53_layer.hidden.rel_l2_max; CPU worst 0.034); the stream adds the residual to it, whose
#: error is smaller (0.0025 on the CPU). Not measured against SGLang's own layer: no machine
#: here serves SGLang with the checkpoint.
REL_L2_BOUNDS: dict[str, float] = {"layer.stream.rel_l2": 0.05}


def check_enabled() -> bool:
    return os.environ.get(CHECK_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def dequant_index_keys(index_k: torch.Tensor, loc: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The keys at slots `loc` of an index-K page buffer [pages, page*(D+4)] uint8
    (per page: page keys of D fp8 bytes, then page fp32 scales), as fp32 [rows, D]."""
    page = index_k.shape[1] // (head_dim + 4)
    pages, off = loc // page, loc % page
    rows = index_k[pages]  # [rows, page*(D+4)]
    cols = off[:, None] * head_dim + torch.arange(head_dim, device=loc.device)
    keys = torch.gather(rows, 1, cols).contiguous().view(torch.float8_e4m3fn).float()
    scol = page * head_dim + off[:, None] * 4 + torch.arange(4, device=loc.device)
    scale = torch.gather(rows, 1, scol).contiguous().view(torch.float32)
    return keys * scale


def compare_layer(
    layer_id: int,
    mono: dict[str, torch.Tensor],
    sglang: dict[str, torch.Tensor],
    bounds: Any,
) -> list[Violation]:
    out = []
    for output in ("stream", "kv", "index_k"):
        if output in mono:
            out += compare(LAUNCH, output, mono[output], sglang[output], bounds)
    for v in out:
        logger.warning("mono-glm53 check: layer %d: %s", layer_id, v.describe())
    return out


class CheckHook:
    """The layer hook `GlmMonoForward` calls per covered layer in check mode."""

    def __init__(self, model: Any, hf_config: Any, bounds: Any | None = None):
        from mono_glm53.spec import NUMERICS

        self.model = model
        self.hf_config = hf_config
        self.bounds = dict(bounds if bounds is not None else {**NUMERICS.bounds, **REL_L2_BOUNDS})
        self.index_head_dim = int(getattr(hf_config, "index_head_dim", 128))
        self.violations: list[tuple[int, Violation]] = []
        self.layers_checked = 0

    def sglang_layer(self, layer_id, hidden, residual, forward_batch, positions, prev_topk):
        """SGLang's own decoder layer on (hidden, residual), as DeepseekV2Model calls it."""
        from sglang.srt.layers.layer_boundary.residual import batch as residual_batch
        from sglang.srt.layers.layer_boundary.residual.add_norm import PLAIN_ADD
        from sglang.srt.layers.layer_boundary.residual.stream import ResidualStream
        from sglang.srt.utils.common import BumpAllocator

        inner = self.model.model
        saved = forward_batch.residual_stream
        handle, forward_batch.residual_stream = ResidualStream.from_handoff(
            hidden.clone(), residual.clone(), PLAIN_ADD
        )
        try:
            out, _ = inner.layers[layer_id](
                positions,
                handle,
                forward_batch,
                BumpAllocator(buffer_size=2, dtype=torch.float32, device=positions.device),
                None,
                None,
                prev_topk_indices=prev_topk,
                captured_last_layer_outputs=None,
                next_full_attention_layer_id=(getattr(inner, "next_full_attention_layer_id", {}) or {}).get(layer_id),
            )
            pair = residual_batch.to_pp(out, forward_batch)
        finally:
            forward_batch.residual_stream = saved
        return pair.tensors["hidden_states"], pair.tensors["residual"]

    def __call__(self, layer_id, run, hidden, residual, step, caches, prev_topk, forward_batch, positions):
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{CHECK_ENV}=1 runs SGLang's layer beside every launch and cannot be captured: "
                "start the server with --disable-cuda-graph"
            )
        loc = step.out_cache_loc
        has_index = caches.index_k is not None and caches.index_k.numel() > 0
        page = caches.index_k.shape[1] // (self.index_head_dim + 4) if has_index else 1
        pages = loc // page
        kv_before = caches.kv[loc].clone()
        idx_before = caches.index_k[pages].clone() if has_index else None
        h_in, r_in = hidden.clone(), residual.clone()

        h, r, topk = run(layer_id, hidden, residual, step, caches, prev_topk)
        mono = {"stream": h.float() + r.float(), "kv": caches.kv[loc].float().clone()}
        kv_mono = caches.kv[loc].clone()
        idx_mono = caches.index_k[pages].clone() if has_index else None
        if has_index:
            mono["index_k"] = dequant_index_keys(caches.index_k, loc, self.index_head_dim)

        caches.kv[loc] = kv_before
        if has_index:
            caches.index_k[pages] = idx_before
        h_ref, r_ref = self.sglang_layer(layer_id, h_in, r_in, forward_batch, positions, prev_topk)
        ref = {"stream": h_ref.float() + r_ref.float(), "kv": caches.kv[loc].float().clone()}
        if has_index:
            ref["index_k"] = dequant_index_keys(caches.index_k, loc, self.index_head_dim)
        # the server continues with the launch's cache rows
        caches.kv[loc] = kv_mono
        if has_index:
            caches.index_k[pages] = idx_mono

        found = compare_layer(layer_id, mono, ref, self.bounds)
        self.violations += [(layer_id, v) for v in found]
        self.layers_checked += 1
        return h, r, topk


def make_check_hook(model: Any, hf_config: Any) -> CheckHook:
    logger.warning(
        "mono-glm53: %s=1: every covered layer also runs SGLang's layer and is compared "
        "(eager decode only; slow)",
        CHECK_ENV,
    )
    return CheckHook(model, hf_config)
