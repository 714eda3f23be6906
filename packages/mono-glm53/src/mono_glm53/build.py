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
  GlmLayerKernel`, one instance per width, fused (one launch a layer) or staged
  (MONO_GLM53_KERNEL_MODE=staged), built for the page table's width (SGLang's
  req_to_token is context + 4 + draft tokens wide, wider than max_position_embeddings);
- `ReferenceLayer`: the torch reference (mono_glm53.reference), selected with
  `MONO_GLM53_LAYER=reference`. It is correct and slow (dozens of kernels a layer); the
  CPU forward test uses it, and it lets the plumbing be tried on a GPU before the kernel.

Tensor parallelism (TP > 1, the kernel): the launches all-reduce inside the kernel through
peer buffers that `layer_peers` allocates here, at install, across SGLang's TP group (read
through SGLang's parallel state: `get_tp_group()`, its CPU (gloo) group, rank and size):
one set of regions per built width (`kernels.layer.peer_requests`) plus the guard's abort
flag, all in one `mono_common.peer.allocate` (IPC handles exchanged over the CPU group;
the size handshake fails on every rank at once). Every kernel of the rank shares one
`Guard` whose abort flag is that peer region, so one rank's expired wait stops every
rank's launch. The widths the kernel serves at this TP size are the spec's table
(`spec.WIDTHS_BY_TP`); a routed step of another width runs SGLang's own forward.
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
    "sglang.srt.distributed.parallel_state.get_tp_group",
    "sglang.srt.distributed.parallel_state.GroupCoordinator#cpu_group",
    "sglang.srt.distributed.parallel_state.GroupCoordinator#rank_in_group",
    "sglang.srt.distributed.parallel_state.GroupCoordinator#world_size",
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
    """What `SPEC.build` returns: `forward(plan, *args, **kwargs)` runs a routed step.

    `widths`: the routed widths (BuildContext.widths); `served`: those the launcher runs at
    this TP size (the spec's table); a routed step of another width runs `standard` (the
    model's own forward as it was before install: SGLang's path)."""

    def __init__(self, forward: GlmMonoForward, widths: Sequence[int], launcher_kind: str,
                 served: Sequence[int] | None = None, standard: Any = None):
        self._forward = forward
        self.widths = tuple(widths)
        self.served = tuple(self.widths if served is None else served)
        self.launcher_kind = launcher_kind
        self._standard = standard

    def forward(self, plan: Any, *args: Any, **kwargs: Any) -> Any:
        rows = plan.key.rows
        if rows in self.widths and rows not in self.served and self._standard is not None:
            return self._standard(*args, **kwargs)
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
    host read) is not called here: the routed path never syncs.

    `peers` (TP > 1): `LayerPeers` from `layer_peers`, whose regions every width's kernel
    all-reduces through and whose guard they share. `nprog` / `cooperative`: the grid (None:
    the whole GPU) and the cooperative launch; tests running several rank processes on one
    GPU give each rank a share of the SMs and launch plainly."""

    def __init__(self, shape: Any, weights: dict, context: Any, mode: str, peers: LayerPeers | None = None,
                 nprog: int | None = None, cooperative: bool = True):
        from mono_common import guard_watch
        from mono_glm53.kernels.layer import GlmLayerKernel

        self._cls, self._watch = GlmLayerKernel, guard_watch.watch
        self.shape, self.weights, self.mode = shape, weights, mode
        self.widths = tuple(context.widths)
        self.deadline_s = float(context.deadline_s)
        self.peers = peers
        self.nprog, self.cooperative = nprog, cooperative
        self.kernels: dict[int, Any] = {}

    def kernel(self, layer_id: int, width: int, max_seq_len: int) -> Any:
        """Built on the first step of a width (eager warmup, before capture), as wide as the
        page table's rows (`max_seq_len`: SGLang's req_to_token is [reqs, context_len + 4 +
        draft tokens]; every read of a row is masked by its sequence length, so no row is
        read past its table row and every context SGLang admits fits)."""
        if width not in self.kernels:
            tp = {}
            if self.peers is not None:
                if width not in self.peers.by_width:
                    raise RuntimeError(f"mono-glm53: width {width} has no peer buffers (built for "
                                       f"{sorted(self.peers.by_width)})")
                tp = dict(world=self.peers.world, peers=self.peers.by_width[width], guard=self.peers.guard)
            k = self._cls(
                self.shape, self.weights[layer_id], width=width, max_seq_len=int(max_seq_len),
                indexer=True, deadline_s=self.deadline_s, nprog=self.nprog,
                cooperative=self.cooperative, **tp,
            )
            # a stopped launch's error word reaches the log before the fault ends the process
            self._watch(k.guard, f"mono-glm53 TP rank {k.rank} of {k.world}")
            self.kernels[width] = k
        return self.kernels[width]

    def run(self, layer_id, hidden, residual, step: StepInputs, caches: LayerCaches, prev_topk):
        rows = hidden.shape[0]
        if rows not in self.widths:
            raise RuntimeError(f"mono-glm53: a step of {rows} rows has no built width ({self.widths})")
        k = self.kernel(layer_id, rows, step.max_seq_len)
        k.set_inputs(hidden, residual, step)
        out, res, topk = k.launch(caches, mode=self.mode, weights=self.weights[layer_id])
        return out, res, topk


def _kernel_launcher(shape: Any, weights: dict, context: Any, peers: LayerPeers | None = None):
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
    return KernelLayer(shape, weights, context, mode, peers)


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


@dataclasses.dataclass
class LayerPeers:
    """One TP rank's peer buffers for its layer launches: `by_width[w]` the regions of the
    width-w kernel (`kernels.layer.peer_requests` names), `guard` the Guard every kernel of
    the rank shares, its abort flag a peer region (`mono_common.peer.ABORT_REGION`)."""

    rank: int
    world: int
    by_width: dict[int, Any]
    guard: Any
    buffers: Any  # the mono_common.peer.PeerBuffers all of it lives in


def layer_peers(shape: Any, widths: Sequence[int], *, group=None, comm=None, device=None,
                deadline_s: float = 2.0, mode: str | None = None) -> LayerPeers:
    """Allocate, across the ranks of `group` (a torch.distributed CPU group: SGLang's TP CPU
    group in a server) or `comm` (mono_common.peer.Comm), the peer regions of every width's
    layer launch and the shared abort flag, in ONE `mono_common.peer.allocate` (handshake
    first: a rank asking for other sizes or widths fails every rank at once), and the rank's
    Guard over that flag (`mode`: MONO_GUARD_MODE or fault)."""
    from mono_common import peer
    from mono_common.guard_host import Guard
    from mono_glm53.kernels.layer import peer_requests
    from mono_glm53.kernels.stages import STAGE_NAMES

    comm = comm or peer.torch_comm(group)
    world = comm.world
    if shape.tp_size != world:
        raise ValueError(f"mono-glm53: the layer shape is cut for TP {shape.tp_size}, the TP group has {world} ranks")
    requests = [(f"w{w}.{name}", nbytes, kind) for w in widths for name, nbytes, kind in peer_requests(shape, w, world)]
    bufs = peer.allocate([*requests, peer.ABORT_REGION], device=device, comm=comm)
    guard = Guard(world, device=device, mode=mode, deadline_s=deadline_s,
                  stage_names=dict(enumerate(STAGE_NAMES)), abort=peer.abort_args(bufs))
    return LayerPeers(comm.rank, world, {w: bufs.scoped(f"w{w}") for w in widths}, guard, bufs)


def tp_group() -> tuple[Any, int, int]:
    """(CPU group, rank, size) of SGLang's TP group, read through its parallel state."""
    from sglang.srt.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    return group.cpu_group, int(group.rank_in_group), int(group.world_size)


def _input_context():
    try:
        from sglang.srt.layers.layer_boundary.adapters.attention import get_attn_tp_context

        tp_context = get_attn_tp_context()
        return tp_context.maybe_input_scattered
    except Exception:  # noqa: BLE001 - not initialised (CPU tests): no input scattering
        return None


def build(model: Any, hf_config: Any, context: Any, *, shape: Any = None) -> BuiltGlm53:
    from mono_glm53.spec import WIDTHS, WIDTHS_BY_TP

    widths = tuple(context.widths)
    if not widths or not set(widths) <= set(WIDTHS):
        raise ValueError(f"mono-glm53: cannot build widths {widths}: the kernel has widths {WIDTHS}")
    tp_size, tp_rank = _tp()
    # A TP size the spec does not list never gets here in a server (SGLang refuses it at
    # startup); tools and CPU tests build one rank (TP 1) with every width.
    cap = WIDTHS_BY_TP.get(context.isa, {}).get(tp_size)
    served = widths if cap is None else tuple(w for w in widths if w in cap)
    standard = model.forward  # SGLang's forward, before install replaces it
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
        peers = None
        if tp_size > 1:
            group, rank, world = tp_group()
            if (rank, world) != (tp_rank, tp_size):
                raise RuntimeError(f"mono-glm53: SGLang's TP group is rank {rank} of {world}, its parallel "
                                   f"context rank {tp_rank} of {tp_size}")
            peers = layer_peers(shape, served, group=group, device=torch.device("cuda", torch.cuda.current_device()),
                                deadline_s=float(context.deadline_s))
        launcher = _kernel_launcher(shape, weights, context, peers)
    hook = None
    from mono_glm53.check import check_enabled, make_check_hook

    if check_enabled():
        hook = make_check_hook(model, hf_config)
    fwd = GlmMonoForward(
        model, launcher, covered, input_context=_input_context(), layer_hook=hook
    )
    if served != widths:
        logger.info("mono-glm53: at TP %d on %s the kernel serves widths %s; routed steps of %s rows run "
                    "SGLang's path (spec.WIDTHS_BY_TP)", tp_size, context.isa, list(served),
                    [w for w in widths if w not in served])
    return BuiltGlm53(fwd, widths, kind, served, standard)
