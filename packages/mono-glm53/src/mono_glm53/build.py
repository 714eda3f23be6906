"""`SPEC.build`: once per TP rank at install, before SGLang sizes the KV pool.

It reads the loaded model's weights in place (SGLang's parameters, never re-laid out),
keeps the few copies the launch needs and records them in `BuildContext.copies` (SGLang
logs them, binding.py:564-572), picks the covered-layer launcher for the widths in
`BuildContext.widths`, and returns `BuiltGlm53`, whose `forward(plan, input_ids,
positions, forward_batch, ...)` is `GlmMonoForward.forward` (forward.py).

Copies (keys `(kind, layer)`):
- ("w_uk", i) / ("w_uv", i): contiguous W_UK [H_l, 192, 512] / W_UV [H_l, 512, 256] packs
  of SGLang's bf16 `w_kc` / `w_vc` (which are strided views of a transposed buffer);
- ("router", i): a bf16 copy of the gate, only when SGLang keeps it fp32 (router_fp32;
  model_disable_reasons has already checked that bf16 holds it exactly);
- ("rotary",): the fp32 cos/sin table of the MLA RoPE, from SGLang's `cos_sin_cache`
  (max_position_embeddings rows; config_disable_reasons refuses a longer served context).

Launchers (the object forward.py's `CoveredLayer` interface describes):
- `KernelLayer` (the default): the Triton layer kernel, `mono_glm53.kernels.layer.
  GlmLayerKernel`, one instance per (layer, width), fused (one launch a layer) or staged
  (MONO_GLM53_KERNEL_MODE=staged);
- `ReferenceLayer`: the torch reference (mono_glm53.reference), selected with
  `MONO_GLM53_LAYER=reference`. It is correct and slow (dozens of kernels a layer); the
  CPU forward test uses it, and it lets the plumbing be tried on a GPU before the kernel.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch

from mono_glm53.forward import GlmMonoForward, LayerCaches, StepInputs
from mono_glm53.refusals import PAGE_SIZE, covered_layers

logger = logging.getLogger(__name__)

LAYER_ENV = "MONO_GLM53_LAYER"  # "kernel" (default) or "reference"

SGLANG_READS = (
    "sglang.kernels.plugin_kernels.amd.spec.BuildContext#widths",
    "sglang.kernels.plugin_kernels.amd.spec.BuildContext#copies",
    "sglang.kernels.plugin_kernels.amd.spec.BuildContext#deadline_s",
    "sglang.kernels.plugin_kernels.amd.spec.BuildContext#isa",
    "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA",
    "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding",
    "sglang.srt.layers.layer_boundary.adapters.attention.get_attn_tp_context",
    "sglang.srt.distributed.tensor_model_parallel_all_reduce",
    "sglang.srt.runtime_context.get_parallel",
)


def layer_shape(hf_config: Any, *, tp_size: int, tp_rank: int):
    """This rank's `GlmLayerShape`, with the checkpoint's FP8 block and SGLang's page."""
    from mono_glm53.config import GlmLayerShape

    shape = GlmLayerShape.from_hf_config(hf_config, tp_size=tp_size, tp_rank=tp_rank)
    quant = getattr(hf_config, "quantization_config", None) or {}
    block = (quant.get("weight_block_size") or [shape.block])[0] if isinstance(quant, dict) else shape.block
    return dataclasses.replace(shape, block=int(block), page=PAGE_SIZE)


def layer_weights(layer: Any, shape: Any, copies: dict, layer_id: int) -> dict[str, torch.Tensor]:
    """One covered layer's weights keyed like `mono_glm53.weights.make_weights`: SGLang's
    parameters in place, plus the W_UK/W_UV packs and (if fp32) a bf16 router copy.

    SGLang fuses the shared expert as routed expert index E (num_fused_shared_experts 1);
    its gate_up/down are views of expert E."""
    w = {name: p.data for name, p in layer.named_parameters()}
    attn, mlp = layer.self_attn, layer.mlp
    e = shape.n_experts
    w_uk = attn.w_kc.contiguous()
    w_uv = attn.w_vc.contiguous()
    copies[("w_uk", layer_id)] = w_uk
    copies[("w_uv", layer_id)] = w_uv
    w["self_attn.w_kc"], w["self_attn.w_vc"] = w_uk, w_uv
    gate = mlp.gate.weight.data
    if gate.dtype != torch.bfloat16:
        gate = gate.to(torch.bfloat16)
        copies[("router", layer_id)] = gate
    w["mlp.gate.weight"] = gate
    ex = mlp.experts
    for name in ("w13_weight", "w2_weight"):
        full = getattr(ex, name).data
        scale = getattr(ex, name + "_scale_inv").data
        w[f"mlp.experts.{name}"] = full[:e]
        w[f"mlp.experts.{name}_scale_inv"] = scale[:e]
    if shape.n_shared:
        w["mlp.shared_experts.gate_up_proj.weight"] = ex.w13_weight.data[e]
        w["mlp.shared_experts.gate_up_proj.weight_scale_inv"] = ex.w13_weight_scale_inv.data[e]
        w["mlp.shared_experts.down_proj.weight"] = ex.w2_weight.data[e]
        w["mlp.shared_experts.down_proj.weight_scale_inv"] = ex.w2_weight_scale_inv.data[e]
    return w


def rotary_table(attn: Any, copies: dict) -> torch.Tensor:
    cache = getattr(attn.rotary_emb, "cos_sin_cache", None)
    if cache is None:
        raise RuntimeError("mono-glm53: the MLA rotary embedding has no cos_sin_cache to copy")
    table = cache.detach().to(torch.float32).contiguous()
    copies[("rotary",)] = table
    return table


class ReferenceLayer:
    """`CoveredLayer` on the torch reference: one covered layer as `mono_glm53.reference`
    computes it, op for op as SGLang (many kernels; not a monokernel)."""

    def __init__(self, shape: Any, weights: dict[int, dict[str, torch.Tensor]], all_reduce=None):
        self.shape = shape
        self.weights = weights
        self.all_reduce = all_reduce

    def run(
        self,
        layer_id: int,
        hidden: torch.Tensor,
        residual: torch.Tensor,
        step: StepInputs,
        caches: LayerCaches,
        prev_topk: torch.Tensor | None,
    ):
        from mono_glm53 import reference as ref

        inputs = ref.DecodeInputs(
            positions=step.positions,
            seq_lens=step.seq_lens,
            req_pool_indices=step.req_pool_indices,
            out_cache_loc=step.out_cache_loc,
            req_to_token=step.req_to_token,
            max_seq_len=step.max_seq_len,
        )
        out = ref.decoder_layer(
            hidden,
            residual,
            inputs,
            ref.LayerCaches(kv=caches.kv, index_k=caches.index_k),
            self.weights[layer_id],
            self.shape,
            all_reduce=self.all_reduce,
            prev_topk=prev_topk,
            run_indexer=True,
        )
        return out.hidden, out.residual, out.topk


class BuiltGlm53:
    """What `SPEC.build` returns: `forward(plan, *args, **kwargs)` runs a routed step."""

    def __init__(self, forward: GlmMonoForward, widths: Sequence[int], launcher_kind: str):
        self._forward = forward
        self.widths = tuple(widths)
        self.launcher_kind = launcher_kind

    def forward(self, plan: Any, *args: Any, **kwargs: Any) -> Any:
        return self._forward.forward(plan, *args, **kwargs)


class KernelLayer:
    """`CoveredLayer` on the Triton layer kernel (`mono_glm53.kernels.layer.GlmLayerKernel`):
    one `GlmLayerKernel` per width, shared by every covered layer (each launch passes its
    layer's weights; the buffers are scratch between launches, and one step's layers run one
    after another on one stream), built lazily on the first step of that width (eager warmup
    before capture), holding its static input buffers; `run` copies the step's rows in
    (device copies, capturable) and launches once ("fused") or once a stage ("staged",
    MONO_GLM53_KERNEL_MODE=staged, for TRITON_INTERPRET=1 and bisecting). Since SGLang routes
    only keys whose rows equal a built width, no row is a kernel pad row. `guard.check()` (a
    host read) is not called here: the routed path never syncs."""

    def __init__(self, shape: Any, weights: dict, context: Any, max_seq_len: int, mode: str):
        from mono_glm53.kernels.layer import GlmLayerKernel

        self._cls = GlmLayerKernel
        self.shape, self.weights, self.mode = shape, weights, mode
        self.widths = tuple(context.widths)
        self.deadline_s = float(context.deadline_s)
        self.max_seq_len = int(max_seq_len)
        self.kernels: dict[int, Any] = {}

    def kernel(self, layer_id: int, width: int, max_seq_len: int) -> Any:
        """Built on the first step of a width (eager warmup, before capture), for the page
        table's width: SGLang's req_to_token is [reqs, context_len], and the kernel's score
        stage must not be built for more pages than a page-table row holds."""
        if width not in self.kernels:
            self.kernels[width] = self._cls(
                self.shape, self.weights[layer_id], width=width,
                max_seq_len=min(self.max_seq_len, int(max_seq_len)) if self.max_seq_len else int(max_seq_len),
                indexer=True, deadline_s=self.deadline_s,
            )
        return self.kernels[width]

    def run(self, layer_id, hidden, residual, step: StepInputs, caches: LayerCaches, prev_topk):
        rows = hidden.shape[0]
        if rows not in self.widths:
            raise RuntimeError(f"mono-glm53: a step of {rows} rows has no built width ({self.widths})")
        k = self.kernel(layer_id, rows, step.max_seq_len)
        k.set_inputs(hidden, residual, step)
        out, res, topk = k.launch(caches, mode=self.mode, weights=self.weights[layer_id])
        return out, res, topk


def _kernel_launcher(shape: Any, weights: dict, context: Any, max_seq_len: int):
    try:
        from mono_glm53.kernels import layer as kernel_layer
    except ImportError as exc:
        raise RuntimeError(
            f"mono-glm53: the layer kernel (mono_glm53.kernels.layer) does not import ({exc}); "
            f"set {LAYER_ENV}=reference to run the torch reference layer instead"
        ) from exc
    if not hasattr(kernel_layer, "GlmLayerKernel"):
        raise RuntimeError(
            "mono-glm53: mono_glm53.kernels.layer has no GlmLayerKernel; "
            f"set {LAYER_ENV}=reference to run the torch reference layer"
        )
    mode = os.environ.get("MONO_GLM53_KERNEL_MODE", "fused").strip().lower()
    if mode not in ("fused", "staged"):
        raise ValueError(f"MONO_GLM53_KERNEL_MODE={mode!r}: use 'fused' or 'staged'")
    return KernelLayer(shape, weights, context, max_seq_len, mode)


def launcher_kind() -> str:
    kind = os.environ.get(LAYER_ENV, "kernel").strip().lower() or "kernel"
    if kind not in ("kernel", "reference"):
        raise ValueError(f"{LAYER_ENV}={kind!r}: use 'kernel' or 'reference'")
    return kind


def _tp() -> tuple[int, int]:
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
        return int(par.tp_size), int(par.tp_rank)
    except Exception:  # noqa: BLE001 - no published runtime (tools, CPU tests): one rank
        return 1, 0


def _input_context():
    try:
        from sglang.srt.layers.layer_boundary.adapters.attention import get_attn_tp_context

        tp_context = get_attn_tp_context()
        return tp_context.maybe_input_scattered
    except Exception:  # noqa: BLE001 - not initialised (CPU tests): no input scattering
        return None


def build(model: Any, hf_config: Any, context: Any, *, shape: Any = None) -> BuiltGlm53:
    from mono_glm53.spec import WIDTHS

    widths = tuple(context.widths)
    if not widths or not set(widths) <= set(WIDTHS):
        raise ValueError(f"mono-glm53: cannot build widths {widths}: the kernel has widths {WIDTHS}")
    tp_size, tp_rank = _tp()
    if shape is None:
        shape = layer_shape(hf_config, tp_size=tp_size, tp_rank=tp_rank)
    layers = model.model.layers
    covered = list(covered_layers(hf_config))
    copies = context.copies
    weights = {i: layer_weights(layers[i], shape, copies, i) for i in covered}
    rotary_table(layers[covered[0]].self_attn, copies)
    kind = launcher_kind()
    if kind == "reference":
        all_reduce = None
        if tp_size > 1:
            from sglang.srt.distributed import tensor_model_parallel_all_reduce

            all_reduce = tensor_model_parallel_all_reduce
        launcher = ReferenceLayer(shape, weights, all_reduce)
        logger.warning("mono-glm53: %s=reference: covered layers run the torch reference", LAYER_ENV)
    else:
        from mono_glm53.refusals import unwired_all_reduce_reason

        refused = unwired_all_reduce_reason(tp_size)
        if refused:
            raise ValueError(f"mono-glm53: {refused}")
        launcher = _kernel_launcher(
            shape, weights, context, max_seq_len=int(getattr(hf_config, "max_position_embeddings", 0) or shape.max_position)
        )
    hook = None
    from mono_glm53.check import check_enabled, make_check_hook

    if check_enabled():
        hook = make_check_hook(model, hf_config)
    fwd = GlmMonoForward(
        model, launcher, covered, input_context=_input_context(), layer_hook=hook
    )
    return BuiltGlm53(fwd, widths, kind)
