"""The forward SGLang routes a served decode step to: `GlmMonoForward.forward(plan, ...)`.

It replaces `GlmMoeDsaForCausalLM.forward` (= `DeepseekV2ForCausalLM.forward`) for the
shape keys the spec serves, and does what that forward does with the covered layers
swapped out:

1. SGLang's `embed_tokens`, then `residual_batch.start`, as `DeepseekV2Model.forward`;
2. SGLang's own decoder layers 0..2 (dense MLP), called exactly as SGLang calls them;
3. the residual stream exported as the plain (mlp output, residual) pair with
   `residual_batch.to_pp` (which completes the owed all-reduce);
4. one launch per covered layer 3..77 through a `CoveredLayer` (below), reading SGLang's
   MLA KV and index-K pools, the page table (`req_to_token`) and the weights in place and
   writing the KV row and the index key of EVERY row of the step (graph-padded rows
   included: SGLang points them at its padding slot);
5. SGLang's final norm (`access.final_norm_pair`, add and norm together) and its
   `logits_processor`.

Nothing on this path reads a device value on the host: the shapes come from `plan.key`,
every per-step value (positions, slots, lengths, page table) is passed as a device
tensor, so a captured graph replays with the values of its own step.

The covered-layer launch is one call on an object with this interface (`CoveredLayer`):

    run(layer_id, hidden, residual, step, caches, prev_topk) -> (hidden, residual, topk)

hidden: [rows, H] bf16, the previous layer's MLP output after its all-reduce (not yet
added); residual: [rows, H] bf16; step: `StepInputs`; caches: `LayerCaches` (this
layer's kv [slots, 1, 576] bf16 and index_k [pages, 64*132] uint8, SGLang's buffers);
prev_topk: the previous layer's top-k (int32 [rows, index_topk] logical positions) or
None. It returns the layer's MLP output and residual as SGLang's layer leaves them, and
its top-k. The kernel's launcher implements it; `ReferenceLayer` (build.py) implements
it with the torch reference (mono_glm53.reference), which is what the CPU forward
test plugs in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

SGLANG_READS = (
    "sglang.srt.layers.layer_boundary.residual.batch.start",
    "sglang.srt.layers.layer_boundary.residual.batch.to_pp",
    "sglang.srt.layers.layer_boundary.residual.access.final_norm_pair",
    "sglang.srt.utils.common.BumpAllocator",
    "sglang.srt.models.deepseek_v2.DeepseekV2Model.forward",
    "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.forward",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch#out_cache_loc",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch#seq_lens",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch#req_pool_indices",
    "sglang.srt.model_executor.forward_context.get_token_to_kv_pool",
    "sglang.srt.model_executor.forward_context.get_req_to_token_pool",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch#batch_size",
    "sglang.srt.mem_cache.memory_pool.ReqToTokenPool",
    "sglang.srt.mem_cache.memory_pool.MLATokenToKVPool.get_key_buffer",
    "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool.get_index_k_with_scale_buffer",
    "sglang.srt.layers.layer_boundary.adapters.attention.get_attn_tp_context",
    "sglang.kernels.plugin_kernels.amd.spec.Plan",
    "sglang.kernels.plugin_kernels.amd.spec.ShapeKey",
)


@dataclass
class StepInputs:
    """One step's device tensors, SGLang's own (read in place, never copied to the host).

    positions [rows] int64; out_cache_loc [rows] int64 (the slot each row writes, in the
    MLA cache and the index-K cache alike); seq_lens [rows] int32/int64 (context with the
    new token); req_pool_indices [rows] int64; req_to_token [reqs, max_ctx] int32 (the
    page table: logical position -> slot); max_seq_len: a host int, graph-static (the
    pool's context width), the widest context a row may have.
    """

    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor
    req_to_token: torch.Tensor
    max_seq_len: int


@dataclass
class LayerCaches:
    """One layer's views of SGLang's pools (the same storage, written in place)."""

    kv: torch.Tensor
    index_k: torch.Tensor | None


class CoveredLayer(Protocol):
    def run(
        self,
        layer_id: int,
        hidden: torch.Tensor,
        residual: torch.Tensor,
        step: StepInputs,
        caches: LayerCaches,
        prev_topk: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def token_to_kv_pool(forward_batch: Any) -> Any:
    """The KV pool of the step (SGLang's `DSATokenToKVPool`), from the forward context the
    model runner sets around every forward (forward_context.py: get_token_to_kv_pool)."""
    from sglang.srt.model_executor.forward_context import get_token_to_kv_pool

    return get_token_to_kv_pool()


def page_table(forward_batch: Any) -> torch.Tensor:
    """The page table `ReqToTokenPool.req_to_token` [reqs, max_ctx] int32, in place."""
    from sglang.srt.model_executor.forward_context import get_req_to_token_pool

    return get_req_to_token_pool().req_to_token


def step_inputs(positions: torch.Tensor, forward_batch: Any) -> StepInputs:
    table = page_table(forward_batch)
    return StepInputs(
        positions=positions,
        out_cache_loc=forward_batch.out_cache_loc,
        seq_lens=forward_batch.seq_lens,
        req_pool_indices=forward_batch.req_pool_indices,
        req_to_token=table,
        max_seq_len=int(table.shape[1]),
    )


def layer_caches(pool: Any, layer_id: int) -> LayerCaches:
    return LayerCaches(
        kv=pool.get_key_buffer(layer_id),
        index_k=pool.get_index_k_with_scale_buffer(layer_id),
    )


def report_mode_refusal(check_mode: bool) -> str | None:
    """Why the guard's report mode cannot serve, or None. In report mode a stopped launch
    returns and only a host `guard.check()` (a device sync) tells; this forward never syncs
    (graphs replay without Python), so the step would go on with the previous step's outputs.
    Check mode (eager) is the exception: there every launch is checked before its outputs are
    used (`GlmLayerKernel.launch` checks the guard after each launch in report mode)."""
    from mono_common.guard_host import MODE_ENV, resolve_mode

    if resolve_mode() == "report" and not check_mode:
        return (f"{MODE_ENV}=report: a stopped launch would hand the next layer stale outputs, since a "
                "served step never reads the device on the host; unset it (fault mode stops the process "
                "on a failed wait) or run check mode (SGLANG_AMD_MONO_CHECK=1, eager), which checks "
                "every launch")
    return None


class GlmMonoForward:
    """The built object's forward (see the module doc). `layer_hook`, when set (check
    mode), wraps every covered launch: hook(layer_id, run, hidden, residual, step, caches,
    prev_topk, forward_batch, positions) -> the same triple. Refuses the guard's report mode
    outside check mode (`report_mode_refusal`)."""

    def __init__(
        self,
        model: Any,
        launcher: CoveredLayer,
        covered: Sequence[int],
        *,
        input_context: Callable[[Any], Any] | None = None,
        layer_hook: Callable[..., Any] | None = None,
    ):
        refused = report_mode_refusal(check_mode=layer_hook is not None)
        if refused:
            raise ValueError(f"mono-glm53: {refused}")
        self.model = model
        self.launcher = launcher
        self.covered = tuple(covered)
        self.first_covered = self.covered[0]
        self.input_context = input_context
        self.layer_hook = layer_hook

    def forward(
        self,
        plan: Any,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: Any,
        input_embeds: torch.Tensor | None = None,
        pp_proxy_tensors: Any = None,
    ) -> Any:
        from sglang.srt.layers.layer_boundary.residual import access
        from sglang.srt.layers.layer_boundary.residual import batch as residual_batch
        from sglang.srt.utils.common import BumpAllocator

        rows = plan.key.rows
        if input_ids.shape[0] != rows:  # shapes are host metadata: no device sync
            raise RuntimeError(f"mono-glm53: step of {input_ids.shape[0]} rows routed as {plan.key}")
        ctx = (
            self.input_context(forward_batch)
            if self.input_context is not None
            else contextlib.nullcontext()
        )
        inner = self.model.model
        with ctx:
            hidden = inner.embed_tokens(input_ids) if input_embeds is None else input_embeds
            residual_batch.start(forward_batch)
            zero_allocator = BumpAllocator(
                buffer_size=len(inner.layers) * 2, dtype=torch.float32, device=positions.device
            )
            topk = None
            next_ids = getattr(inner, "next_full_attention_layer_id", {}) or {}
            for i in range(self.first_covered):
                hidden, layer_topk = inner.layers[i](
                    positions,
                    hidden,
                    forward_batch,
                    zero_allocator,
                    None,
                    None,
                    prev_topk_indices=topk,
                    captured_last_layer_outputs=None,
                    next_full_attention_layer_id=next_ids.get(i),
                )
                if layer_topk is not None:
                    topk = layer_topk
            pair = residual_batch.to_pp(hidden, forward_batch)
            hidden, residual = pair.tensors["hidden_states"], pair.tensors.get("residual")
            if residual is None:
                raise RuntimeError("mono-glm53: the dense layers left no residual")
            step = step_inputs(positions, forward_batch)
            pool = token_to_kv_pool(forward_batch)
            for i in self.covered:
                caches = layer_caches(pool, i)
                if self.layer_hook is None:
                    hidden, residual, topk = self.launcher.run(i, hidden, residual, step, caches, topk)
                else:
                    hidden, residual, topk = self.layer_hook(
                        i, self.launcher.run, hidden, residual, step, caches, topk,
                        forward_batch, positions,
                    )
            hidden = access.final_norm_pair(hidden, residual, inner.norm)
        return self.model.logits_processor(input_ids, hidden, self.model.lm_head, forward_batch, None)
