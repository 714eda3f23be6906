"""What a server would route to a model's kernel, per ISA and TP size: SGLang's own startup
checks run on the serving setup a model package documents.

A model package describes the server its README shows as a `ServingSetup` and exposes it
through the `mono.serving` entry point group (name: the model's short name, e.g. `glm53`;
value: a zero-argument callable returning the setup). `routes(setup)` then asks SGLang's
`monokernel_disable_reasons` (the check `--enable-amd-monokernel` runs at startup, the
spec's own `config_disable_reasons` included) about that server on every ISA the spec
names, at every TP size its `DeviceLimits` list, and returns one `Route` each: the widths
SGLang would route to the kernel there, or every reason it would not. `mono doctor` prints
them; a model's tests check the setup against SGLang's full startup resolution of the
README's command line.

The checks read the calling process's environment (mono's and SGLang's variables), as a
server started from the same shell would. Importing this module imports nothing heavy;
`routes` imports sglang.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SERVING_GROUP = "mono.serving"
#: SGLang 0.5.23's default decode CUDA-graph batch sizes up to 64 (the larger defaults
#: depend on the GPU's memory and cannot change which widths are covered).
DEFAULT_DECODE_BS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64)

SGLANG_READS = (
    "sglang.srt.kernel_plugins.amd.binding.monokernel_disable_reasons",
    "sglang.srt.kernel_plugins.amd.binding.covered_capture_sizes",
    "sglang.kernels.plugin_kernels.amd.spec.find_spec",
    "sglang.kernels.plugin_kernels.amd.spec.BACKEND",
    "sglang.srt.arg_groups.arg_utils.record_fields",
    "sglang.srt.server_args.ServerArgs",
    "sglang.srt.model_executor.cuda_graph_config.CudaGraphConfig",
    "sglang.srt.model_executor.cuda_graph_config.PhaseConfig",
)


@dataclass(frozen=True)
class ServingSetup:
    """The server a model package's README shows.

    `launch_args`: the `python -m sglang.launch_server` arguments after the model path
    (with `--tp <N>`, which `routes` replaces per TP size). `server_args(tp)`: the values
    SGLang's startup resolution gives that command at TP `tp` for the fields the checks
    read (the rest stay at ServerArgs' defaults). `hf_config()`: the checkpoint's HF config.
    `widths_by_tp`: per ISA, TP size -> the widths the model's build runs on its kernel
    (None: every width SGLang routes); a model may serve fewer widths at one TP size than
    its `DeviceLimits` list, and sends the others to SGLang's own forward."""

    model: str
    architecture: str
    model_path: str
    launch_args: tuple[str, ...]
    server_args: Callable[[int], Mapping[str, Any]]
    hf_config: Callable[[], Any]
    dtype: str = "bfloat16"
    widths_by_tp: Mapping[str, Mapping[int, Sequence[int]]] | None = None

    @property
    def tp(self) -> int:
        """The TP size of the README's command (`--tp`, 1 when absent)."""
        args = list(self.launch_args)
        return int(args[args.index("--tp") + 1]) if "--tp" in args else 1

    def command(self, tp: int | None = None) -> list[str]:
        """The launch command line, with `--tp` set to `tp` when given."""
        args = list(self.launch_args)
        if tp is not None and "--tp" in args:
            args[args.index("--tp") + 1] = str(tp)
        return ["python", "-m", "sglang.launch_server", "--model-path", self.model_path, *args]


@dataclass
class Route:
    """One (ISA, TP size) of a spec: the widths routed to the kernel, or why none is."""

    isa: str
    tp: int
    widths: tuple[int, ...] = ()
    reasons: list[str] = field(default_factory=list)

    @property
    def routed(self) -> bool:
        return bool(self.widths) and not self.reasons


def default_server_args() -> dict[str, Any]:
    """Every ServerArgs field at its declared default (what an unset flag leaves)."""
    import msgspec
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.server_args import ServerArgs

    values = {}
    for f in record_fields(ServerArgs):
        if f.default is not msgspec.NODEFAULT:
            values[f.name] = f.default
        elif f.default_factory is not msgspec.NODEFAULT:
            values[f.name] = f.default_factory()
        else:
            values[f.name] = None
    return values


def server_config(setup: ServingSetup, tp: int) -> types.SimpleNamespace:
    """The resolved server arguments of `setup` at TP `tp`, as the launcher's checks see them."""
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig

    values = default_server_args()
    values.update(
        cuda_graph_config=CudaGraphConfig(
            decode=PhaseConfig(backend="full", bs=list(DEFAULT_DECODE_BS), max_bs=max(DEFAULT_DECODE_BS))
        ),
        _cuda_graph_config_locked=set(),
    )
    values.update(setup.server_args(tp))
    values["tp_size"] = tp
    return types.SimpleNamespace(**values)


def routes(setup: ServingSetup) -> list[Route]:
    """Per ISA of the model's spec, per TP size it lists: what SGLang would route."""
    from sglang.kernels.plugin_kernels.amd.spec import BACKEND, find_spec
    from sglang.srt.kernel_plugins.amd import binding

    hf_config = setup.hf_config()
    model_config = types.SimpleNamespace(hf_config=hf_config, dtype=setup.dtype)
    out: list[Route] = []
    for isa in ("gfx950", "sm_90"):
        spec, why = find_spec(backend=BACKEND, architectures=[setup.architecture], isa=isa)
        if spec is None:
            out.append(Route(isa, 0, reasons=[why]))
            continue
        # an empty tp_sizes accepts any TP size: check the README's
        for tp in spec.devices[isa].tp_sizes or (setup.tp,):
            cfg = server_config(setup, tp)
            _, reasons = binding.monokernel_disable_reasons(cfg=cfg, model_config=model_config, isa=isa)
            if reasons:
                out.append(Route(isa, tp, reasons=list(reasons)))
                continue
            widths = spec.widths(isa)
            decode = cfg.cuda_graph_config.decode
            if decode.backend != "disabled":
                captured = binding.covered_capture_sizes(widths=widths, tokens_per_request=1, sizes=list(decode.bs))
                widths = tuple(w for w in widths if w in captured)
            if setup.widths_by_tp is not None:
                served = setup.widths_by_tp.get(isa, {}).get(tp, ())
                widths = tuple(w for w in widths if w in served)
            out.append(Route(isa, tp, widths=widths, reasons=[] if widths else [
                f"no width of {list(spec.widths(isa))} is both captured and built at TP {tp}"
            ]))
    return out
