"""GLM-5.3's `MonoSpec`: what SGLang 0.5.23's `--enable-amd-monokernel` binding reads.

SGLang imports this module in its launcher (to resolve the server) and on every TP
rank (at load and install), so importing it is cheap: msgspec and SGLang's spec
module only. The refusals, the build and the forward import torch, the kernels and
SGLang's runtime when SGLang calls them.

Registration: the `sglang.srt.plugins` entry point `mono_glm53 =
mono_glm53.plugin:register` calls `register(backend="amd",
architecture="GlmMoeDsaForCausalLM", path="mono_glm53.spec:SPEC")`.

Where refusals are stated, each once. SGLang checks, in its own words that list the
accepted values: the GPU's ISA (`devices`), the TP size (`DeviceLimits.tp_sizes`), the
dtype and the decode attention backend (`Requirements`), the watchdog and the bitwise
flags. Everything else is checked by `config_disable_reasons` (refusals.config_reasons),
in words that name the flag, variable or config value to change ("page size 16 is not
64: start the server with --page-size 64"): the server arguments (SERVER_ARGS), SGLang's
environment variables (ENV), the HF config's shapes (HF_CONFIG), the refused-by-default
SGLang features (FEATURES), mono's own environment variables, the checkpoint's
quantization config, scaled RoPE, the rotary table length, the DSA indexer kind and the
captured graph sizes. Those are not also given to SGLang, which would refuse them a second
time in its generic words.
"""

from __future__ import annotations

from typing import Any

from sglang.kernels.plugin_kernels.amd.spec import (
    DeviceLimits,
    Feature,
    MonoSpec,
    Numerics,
    NumericsKind,
    Requirements,
)

from mono_common.sglang_compat import MONOKERNEL_API_VERSION
from mono_common.widths import merge_widths_by_tp
from mono_glm53 import ARCHITECTURE
from mono_glm53 import refusals as _r

SGLANG_READS = (
    "sglang.kernels.plugin_kernels.amd.spec.MonoSpec",
    "sglang.kernels.plugin_kernels.amd.spec.DeviceLimits",
    "sglang.kernels.plugin_kernels.amd.spec.Requirements",
    "sglang.kernels.plugin_kernels.amd.spec.Numerics",
    "sglang.kernels.plugin_kernels.amd.spec.NumericsKind.TOLERANCE",
    "sglang.kernels.plugin_kernels.amd.spec.BuildContext",
    "sglang.kernels.plugin_kernels.amd.spec.MONOKERNEL_API_VERSION",
    "sglang.srt.server_args.ServerArgs#tp_size",
    "sglang.kernels.plugin_kernels.amd.spec.Feature",
)

NAME = "mono-glm53"

#: Step rows (batch size x tokens a request) each compiled width runs; a step of r
#: rows is served at width r only (SGLang routes exact graph keys), and SGLang aligns
#: the decode capture sizes to them (binding.covered_capture_sizes), so a batch of 1
#: replays the width-2 graph.
WIDTHS = (2, 4, 8)
#: TP sizes the kernel serves, per ISA, and the widths it serves at each (the spec's
#: DeviceLimits hold one width list per ISA, so `build` sends a routed step of a width
#: missing here to SGLang's own forward). The kernel all-reduces inside the launch through
#: peer buffers over SGLang's TP group (mono_common.peer); its TP 2/4/8 shards ran on the
#: H200 with the ranks side by side in one launch (tests/kernels/test_layer_gpu.py), and
#: tests/kernels/test_tp_processes_gpu.py runs them as separate rank processes.
#: The caps, each with its reason:
#: - gfx950, TP 4: widths 2 and 4. 8-row steps stay on SGLang's path, as the published gfx950
#:   port (sgl-amd-mono's GLM-5.3 kernel) leaves them, because its launch lost to SGLang's
#:   path there. Not measured here (no MI355X runs our kernel).
#: - gfx950, TP 8: every width, as that port serves them. Not measured here.
#: - sm_90, TP 8: every width: the launch beats the unfused path at each (H200, one TP8 rank's
#:   shard, ctx 4096: width 2 306 us, 5.6x faster; width 8 430 us, 16x faster;
#:   bench/results/README.md).
#: - sm_90, TP 4: every width, as at TP 8 (not timed at TP 4). GLM-5.3's FP8 weights (about
#:   750 GB) do not fit 4 H200s (141 GB each), so SGLang's load runs out of memory before the
#:   kernel runs; the size is listed because the kernel does serve its shard, so the limit a
#:   user meets is the true one, memory.
#: TP 1 and 2 are not listed: GLM-5.3's FP8 weights fit on two GPUs of neither type.
WIDTHS_BY_TP = {
    "gfx950": {4: (2, 4), 8: WIDTHS},
    "sm_90": {4: WIDTHS, 8: WIDTHS},
}

#: The CUs (MI355X) or SMs (H200) the persistent grid needs: SGLang refuses a partitioned GPU
#: with fewer. The grid is `kernels.layer.PROGRAMS_PER_SM` programs on each (1 a CU, 2 an SM).
RESIDENT_BLOCKS = {"gfx950": 256, "sm_90": 132}

DEVICES = {
    isa: DeviceLimits(
        widths=WIDTHS,
        tp_sizes=tuple(sorted(WIDTHS_BY_TP[isa])),
        resident_blocks=RESIDENT_BLOCKS[isa],
    )
    for isa in ("gfx950", "sm_90")
}


#: HF config values the kernel is compiled for (exact; SGLang reads them with getattr).
HF_CONFIG = {
    "hidden_size": 6144,
    "num_hidden_layers": 78,
    "first_k_dense_replace": 3,
    "num_attention_heads": 64,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 2048,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
}

#: Server arguments -> the values the kernel accepts (as SGLang resolved them).
SERVER_ARGS = {
    "page_size": frozenset({_r.PAGE_SIZE}),
    "kv_cache_dtype": _r.KV_CACHE_DTYPES,
    "moe_runner_backend": _r.MOE_RUNNERS,
    "disable_shared_experts_fusion": frozenset({False}),
    "enable_hisparse": frozenset({False}),
    "expert_distribution_recorder_mode": frozenset({None}),
}

#: SGLang environment variables (`sglang.srt.environ.envs`) -> required value.
ENV = {
    _r.FUSE_TOPK_ENV: True,
    **{name: False for name in _r.ROUTING_OVERRIDE_ENVS},
}

#: SGLang checks dtypes and the decode attention backend in its own words, which list the
#: accepted values (and checks the backend again on the first routed step). SERVER_ARGS, ENV
#: and HF_CONFIG are checked by `config_disable_reasons` alone, in words that name the flag,
#: variable or config to change: given to SGLang as well, each would be refused twice.
REQUIREMENTS = Requirements(
    dtypes=frozenset({"bfloat16"}),
    attention_backends=_r.ATTENTION_BACKENDS,
)

#: SGLang's refused-by-default features that `config_disable_reasons` refuses itself, in
#: words naming the flag to drop (refusals.FEATURES); SGLang still refuses any other.
FEATURES = frozenset(
    Feature[name] for name in (*_r.FEATURES, *_r.FEATURES_COVERED_BY) if name in Feature.__members__
)

#: Check-mode bounds, `<launch>.<output>.<metric>`: launch "layer" is one covered
#: decoder layer; outputs are the residual stream it hands the next layer, the MLA
#: KV row it writes (576 bf16 values a token) and the index key it writes
#: (dequantized fp8, 128 values a token). The kernel quantizes activations like
#: SGLang (per-token groups of 128) but accumulates in another order, so the
#: stream may differ by a few bf16 ULPs and a flipped fp8 rounding; an index key
#: may differ by one e4m3 step (1/16 of its scale) where the rounding flips.
#: The cosines are the kernel's own test bounds (mono_glm53.kernels.numerics: hidden
#: 0.999, MLA row 0.9999, index key 0.999), so check mode flags what the kernel tests
#: would: the stream's cosine against the reference was 0.9993..0.9996 on the H200 at real
#: shapes, so the former 0.9995 would have flagged correct layers. stream.rel is the largest
#: element error over the largest element: one e4m3 step of an expert input moves an output
#: element by a few % of the row's maximum (3.04 % on the tiny model), hence 0.05.
NUMERICS = Numerics(
    kind=NumericsKind.TOLERANCE,
    bounds={
        "layer.stream.cosine": 0.999,
        "layer.stream.rel": 0.05,
        "layer.kv.cosine": 0.9999,
        "layer.kv.rel": 0.02,
        "layer.index_k.cosine": 0.999,
        "layer.index_k.rel": 0.07,
    },
)


def config_disable_reasons(cfg: Any, hf_config: Any) -> list[str]:
    """Before load, in the launcher: every reason this server is refused, at once."""
    return _r.config_reasons(cfg, hf_config, widths_by_tp=merge_widths_by_tp(WIDTHS_BY_TP), hf_values=HF_CONFIG)


def model_disable_reasons(model: Any, hf_config: Any, copies: dict) -> list[str]:
    """After load, on every rank: every reason the loaded model is refused, at once."""
    return _r.model_reasons(model, hf_config, copies)


def build(model: Any, hf_config: Any, context: Any) -> Any:
    """Once per rank at install: allocate, copy the few weights, compile `context.widths`."""
    from mono_glm53.build import build as _build

    return _build(model, hf_config, context)


SPEC = MonoSpec(
    name=NAME,
    devices=DEVICES,
    features=FEATURES,
    requires=REQUIREMENTS,
    numerics=NUMERICS,
    model_disable_reasons=model_disable_reasons,
    build=build,
    api_version=MONOKERNEL_API_VERSION,
    config_disable_reasons=config_disable_reasons,
)

__all__ = ["ARCHITECTURE", "NUMERICS", "SPEC", "WIDTHS", "WIDTHS_BY_TP"]
