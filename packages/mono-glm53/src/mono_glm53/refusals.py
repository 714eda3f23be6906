"""Why GLM-5.3's monokernel cannot run a setup: before load (config) and after load (model).

Every builder returns a list of reasons, each saying what was wrong and what is
needed, and the spec hands SGLang all of them at once (SGLang joins them into one
ValueError at startup, or one per install on every rank).

Importing this module is cheap (no torch, no sglang): SGLang imports the spec in
its launcher. `config_reasons` reads SGLang's `envs` and `covered_capture_sizes`,
and `model_reasons` reads torch tensors, each importing them when called.

What the kernel is built for (and so what is refused otherwise):
- the FP8 e4m3 block-128 checkpoint (fp32 `weight_scale_inv`), bf16 activations;
- 64-token pages, a bf16 MLA KV cache (kv_lora 512 + rope 64 a token) and the
  DSA index-K cache of SGLang's `Indexer` (fp8 keys + fp32 scale, 132 B a token);
- SGLang's fused DSA top-k (`SGLANG_DSA_FUSE_TOPK`), a fresh top-k on every
  covered layer;
- the shared expert fused into the routed experts as expert index E;
- a plain (unscaled) RoPE, whose cos/sin table build copies, for the whole
  served context;
- the routed experts in the layout of SGLang's triton/aiter MoE runners;
- a router gate bf16 holds exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ARCH = "GlmMoeDsaForCausalLM"
PAGE_SIZE = 64
BLOCK = 128
# --kv-cache-dtype values that give the bf16 MLA cache on sm_90 and gfx950
# ("auto" resolves to bfloat16 there: arg_groups/overrides.py _dsa_kv_cache_dtype_default).
KV_CACHE_DTYPES = frozenset({"auto", "bf16", "bfloat16"})
# MoE runners whose post-load expert layout the kernel reads: row-major e4m3 with
# fp32 block scales (triton; "auto" is triton on CUDA without an a2a backend) and
# AITER's (16, 16) shuffle on ROCm.
MOE_RUNNERS = frozenset({"auto", "triton", "aiter"})
# The decode attention backend SGLang picks for DSA models ("nsa" is its old name).
ATTENTION_BACKENDS = frozenset({"dsa", "nsa"})
DECODE_GRAPH_BACKENDS = frozenset({"full", "disabled"})
# SGLang's benchmark-only routing overrides (layers/moe/topk.py routing_simulation_enabled).
ROUTING_OVERRIDE_ENVS = ("SGLANG_SIMULATE_UNIFORM_EXPERTS", "SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS")
FUSE_TOPK_ENV = "SGLANG_DSA_FUSE_TOPK"
FIRST_COVERED_LAYER = 3  # layers 0..2 are dense and run SGLang's modules

SGLANG_READS = (
    "sglang.srt.environ.envs",
    "sglang.srt.environ.Envs.SGLANG_DSA_FUSE_TOPK",
    "sglang.srt.environ.Envs.SGLANG_SIMULATE_UNIFORM_EXPERTS",
    "sglang.srt.environ.Envs.SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS",
    "sglang.srt.kernel_plugins.amd.binding.covered_capture_sizes",
    "sglang.srt.kernel_plugins.amd.binding.features_in_use",
    "sglang.srt.arg_groups.resolution_hooks.register_resolution_hook",
    "sglang.srt.configs.model_config.dsa_layer_skips_topk",
    "sglang.srt.model_executor.cuda_graph_config.Phase.DECODE",
    "sglang.srt.server_args.ServerArgs#page_size",
    "sglang.srt.server_args.ServerArgs#kv_cache_dtype",
    "sglang.srt.server_args.ServerArgs#moe_runner_backend",
    "sglang.srt.server_args.ServerArgs#disable_shared_experts_fusion",
    "sglang.srt.server_args.ServerArgs#enable_hisparse",
    "sglang.srt.server_args.ServerArgs#expert_distribution_recorder_mode",
    "sglang.srt.server_args.ServerArgs#quantization",
    "sglang.srt.server_args.ServerArgs#context_length",
    "sglang.srt.server_args.ServerArgs#cuda_graph_config",
    "sglang.srt.server_args.ServerArgs#tp_size",
    "sglang.srt.model_executor.cuda_graph_config.CudaGraphConfig#decode",
    "sglang.srt.model_executor.cuda_graph_config.PhaseConfig#bs",
    "sglang.srt.model_executor.cuda_graph_config.PhaseConfig#backend",
    # the loaded model, read by model_reasons
    "sglang.srt.models.deepseek_v2.DeepseekV2MoE",
    "sglang.srt.models.deepseek_v2.MoEGate",
    "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer",
)


# ---------------------------------------------------------------------------
# helpers


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _rope_type(hf_config: Any) -> str | None:
    """The scaled-RoPE type of an HF config (transformers 5 `rope_parameters` or
    the older `rope_scaling`), or None for a plain RoPE."""
    for key in ("rope_scaling", "rope_parameters"):
        params = _get(hf_config, key)
        if not params:
            continue
        kind = _get(params, "rope_type") or _get(params, "type")
        if kind not in (None, "default"):
            return str(kind)
        # A factor other than 1 scales even without a type name.
        factor = _get(params, "factor")
        if factor not in (None, 1, 1.0):
            return f"factor {factor}"
    return None


def rotary_table_rows(hf_config: Any) -> int:
    """Rows of the cos/sin table build copies: SGLang's own table covers
    max_position_embeddings positions."""
    return max(_as_int(_get(hf_config, "max_position_embeddings", 0) or 0) or 0, 0)


def covered_layers(hf_config: Any) -> range:
    return range(FIRST_COVERED_LAYER, _as_int(_get(hf_config, "num_hidden_layers", 0) or 0) or 0)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _as_int(value: Any) -> int | None:
    """`value` as an int when it is one (or a float/str holding one), else None: a config
    value of the wrong type becomes a refusal, never a TypeError in the launcher."""
    if isinstance(value, bool):
        return None
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        return None
    return int(as_float) if as_float.is_integer() else None


def _block_pair(value: Any) -> list[int] | None:
    """A weight_block_size as [rows, cols], or None when it is not a pair of integers."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        return None
    pair = [_as_int(v) for v in value]
    return None if None in pair else pair


# ---------------------------------------------------------------------------
# before load


def checkpoint_reasons(cfg: Any, hf_config: Any) -> list[str]:
    reasons = []
    quant = _get(hf_config, "quantization_config")
    method = _get(quant, "quant_method") if quant else None
    if not quant or method != "fp8":
        what = "unquantized" if not quant else (
            f"quantized with {method!r}" if method else f"quantized by an unreadable quantization_config {quant!r}"
        )
        reasons.append(
            f"the checkpoint is {what}: the kernel reads "
            "the FP8 e4m3 block-128 checkpoint (quantization_config quant_method 'fp8', "
            "weight_block_size [128, 128]); serve GLM-5.3's FP8 checkpoint"
        )
    else:
        block = _get(quant, "weight_block_size")
        if _block_pair(block) != [BLOCK, BLOCK]:
            reasons.append(
                f"the checkpoint's FP8 weight_block_size is {block!r}, not [128, 128]: the kernel "
                "reads block-128 scales; serve GLM-5.3's FP8 block-128 checkpoint (its "
                "config.json quantization_config holds weight_block_size [128, 128])"
            )
        fmt = _get(quant, "fmt")
        if fmt not in (None, "e4m3"):
            reasons.append(
                f"the checkpoint's FP8 format is {fmt!r}, not 'e4m3': the kernel reads e4m3 "
                "weights; serve GLM-5.3's FP8 e4m3 checkpoint"
            )
        if _get(quant, "activation_scheme") not in (None, "dynamic"):
            reasons.append(
                f"the checkpoint's FP8 activation_scheme is {_get(quant, 'activation_scheme')!r}: "
                "the kernel quantizes activations dynamically; serve the 'dynamic' FP8 checkpoint"
            )
    quantization = _get(cfg, "quantization")
    if quantization not in (None, "fp8"):
        reasons.append(
            f"--quantization {quantization}: the kernel reads the checkpoint's FP8 block-128 "
            "weights; start the server without --quantization (or with --quantization fp8)"
        )
    return reasons


def server_arg_reasons(cfg: Any) -> list[str]:
    reasons = []
    page = _get(cfg, "page_size")
    if page != PAGE_SIZE:
        reasons.append(
            f"page size {page} is not {PAGE_SIZE}: the kernel reads 64-token pages of the MLA "
            f"and index-K caches; start the server with --page-size {PAGE_SIZE}"
        )
    kv = _get(cfg, "kv_cache_dtype")
    if kv not in KV_CACHE_DTYPES:
        reasons.append(
            f"--kv-cache-dtype {kv}: the kernel reads and writes the bf16 MLA KV cache "
            "(512 latent + 64 rope values a token); start the server with "
            "--kv-cache-dtype bfloat16"
        )
    runner = _get(cfg, "moe_runner_backend")
    if runner not in MOE_RUNNERS:
        reasons.append(
            f"--moe-runner-backend {runner}: the kernel reads the routed experts in the "
            "layout SGLang's triton (CUDA) and aiter (ROCm) runners leave them in; start the "
            "server with --moe-runner-backend auto"
        )
    if _get(cfg, "disable_shared_experts_fusion"):
        reasons.append(
            "--disable-shared-experts-fusion leaves the shared expert unfused: the kernel "
            "runs it as routed expert index 256; start the server without "
            "--disable-shared-experts-fusion"
        )
    if _get(cfg, "enable_hisparse"):
        reasons.append(
            "--enable-hisparse moves the sparse KV cache off the device pools the kernel "
            "reads; start the server without --enable-hisparse"
        )
    mode = _get(cfg, "expert_distribution_recorder_mode")
    if mode is not None:
        reasons.append(
            f"--expert-distribution-recorder-mode {mode}: the kernel routes inside one launch "
            "and records no expert distribution; start the server without "
            "--expert-distribution-recorder-mode"
        )
    return reasons


def env_reasons() -> list[str]:
    from sglang.srt.environ import envs

    reasons = []
    if not getattr(envs, FUSE_TOPK_ENV).get():
        reasons.append(
            f"{FUSE_TOPK_ENV}=0 selects the unfused DSA top-k, whose indices the kernel's "
            f"check mode and the prefill path disagree with; unset {FUSE_TOPK_ENV} "
            "(or set it to 1)"
        )
    for name in ROUTING_OVERRIDE_ENVS:
        if getattr(envs, name).get():
            reasons.append(
                f"{name} is set: SGLang's benchmark routing override replaces the router, "
                f"and the kernel routes by the model's own gate; unset {name}"
            )
    return reasons


def model_config_reasons(cfg: Any, hf_config: Any) -> list[str]:
    """HF config values beyond the exact ones in Requirements.hf_config."""
    reasons = []
    kpool = _get(hf_config, "index_kpool", 1) or 1
    if _as_int(kpool) != 1:
        reasons.append(
            f"config.index_kpool {kpool} selects IndexerKPool's pooled index cache: the kernel "
            "reads the plain DSA Indexer's index-K cache (fp8 keys + fp32 scale, one key a "
            "token); serve a checkpoint with index_kpool 1 (GLM-5.3)"
        )
    norm = _get(hf_config, "index_k_norm_type", "layer") or "layer"
    if norm != "layer":
        reasons.append(
            f"config.index_k_norm_type {norm!r}: the kernel normalizes index keys with the "
            "Indexer's LayerNorm (weight and bias); serve GLM-5.3's config ('layer')"
        )
    for key in ("index_init_tokens", "index_local_tokens"):
        value = _get(hf_config, key, 0) or 0
        if _as_int(value) != 0:
            reasons.append(
                f"config.{key} {value}: the kernel's top-k has no forced initial/local "
                f"tokens; serve GLM-5.3's config ({key} 0)"
            )
    try:
        from sglang.srt.configs.model_config import dsa_layer_skips_topk

        shared = [i for i in covered_layers(hf_config) if dsa_layer_skips_topk(hf_config, i)]
    except Exception as exc:  # noqa: BLE001 - a config SGLang cannot read is a refusal, not a crash
        shared = []
        reasons.append(f"cannot read the DSA top-k layer pattern ({exc}); serve GLM-5.3's config")
    if shared:
        reasons.append(
            f"layers {shared} reuse the previous layer's top-k (indexer_types 'shared' or an "
            "index_topk pattern): the kernel runs a fresh top-k on every covered layer; serve "
            "a config whose covered layers all have indexer_types 'full'"
        )
    rope = _rope_type(hf_config)
    if rope is not None:
        reasons.append(
            f"the RoPE is scaled ({rope}): the kernel applies a plain RoPE (no YaRN mscale "
            "or scaled frequencies); serve a config without rope_scaling (rope_type 'default')"
        )
    rows = rotary_table_rows(hf_config)
    served = _get(cfg, "context_length") or rows
    if rows <= 0:
        reasons.append(
            f"config.max_position_embeddings is {_get(hf_config, 'max_position_embeddings')!r}: "
            "the kernel copies SGLang's rotary table, which has max_position_embeddings rows; "
            "serve GLM-5.3's config (max_position_embeddings 202752)"
        )
    elif _as_int(served) is None or _as_int(served) > rows:
        reasons.append(
            f"the served context is {served} tokens, longer than the {rows}-row rotary table "
            f"the kernel copies (config.max_position_embeddings): start the server with "
            f"--context-length {rows} or less"
        )
    return reasons


def capture_reasons(
    cfg: Any, *, widths_by_tp: Mapping[int, Sequence[int]], tokens_per_request: int = 1
) -> list[str]:
    """Refuse a server whose captured decode graphs none of the served widths runs."""
    graph = _get(cfg, "cuda_graph_config")
    decode = _get(graph, "decode") if graph is not None else None
    if decode is None:
        return []
    backend = _get(decode, "backend")
    if backend not in DECODE_GRAPH_BACKENDS:
        return [
            f"decode CUDA graphs are {backend!r}: the kernel's forward is captured as one whole "
            "graph; start the server with --cuda-graph-backend-decode full (the default) or "
            "--disable-decode-cuda-graph"
        ]
    if backend == "disabled":
        return []
    tp = int(_get(cfg, "tp_size", 1) or 1)
    widths = tuple(widths_by_tp.get(tp, ()))
    if not widths:
        return []  # the binding refuses the TP size itself
    sizes = sorted(set(_get(decode, "bs") or []))
    if not sizes:
        return []
    # SGLang aligns the sizes to the widths unless decode bs was set explicitly
    # (binding.handle_amd_monokernel); check what will actually be captured.
    locked = _get(cfg, "_cuda_graph_config_locked", None) or set()
    explicit = ("decode", "bs") in locked
    captured = sizes
    if not explicit:
        from sglang.srt.kernel_plugins.amd.binding import covered_capture_sizes

        captured = covered_capture_sizes(
            widths=widths, tokens_per_request=tokens_per_request, sizes=sizes
        )
    served = {w // tokens_per_request for w in widths if w % tokens_per_request == 0}
    if not served.intersection(captured):
        return [
            f"none of the captured decode graphs (batch sizes {sorted(captured)}) runs the "
            f"kernel: at TP {tp} it serves batch sizes {sorted(served)}; capture at least one "
            f"of them (e.g. --cuda-graph-bs-decode {' '.join(map(str, sorted(served)))} plus any "
            "larger sizes, or leave --cuda-graph-bs-decode unset)"
        ]
    return []


def check_mode_reasons(cfg: Any) -> list[str]:
    """SGLANG_AMD_MONO_CHECK=1 runs SGLang's layer beside every launch: eager only."""
    import os

    if os.environ.get("SGLANG_AMD_MONO_CHECK", "0").strip().lower() not in ("1", "true", "yes", "on"):
        return []
    graph = _get(cfg, "cuda_graph_config")
    decode = _get(graph, "decode") if graph is not None else None
    if decode is not None and _get(decode, "backend") != "disabled":
        return [
            "SGLANG_AMD_MONO_CHECK=1 runs SGLang's own layer beside every launch, which a "
            "captured graph cannot do: start the server with --disable-cuda-graph (or unset "
            "SGLANG_AMD_MONO_CHECK)"
        ]
    return []


def launcher_reasons() -> list[str]:
    """The covered-layer launcher must exist on this rank (build.py picks it)."""
    import os

    kind = os.environ.get("MONO_GLM53_LAYER", "kernel").strip().lower() or "kernel"
    if kind == "reference":
        return []
    if kind != "kernel":
        return [f"MONO_GLM53_LAYER={kind!r}: set it to 'kernel' (the default) or 'reference'"]
    try:
        from mono_glm53.kernels import layer as kernel_layer
    except Exception as exc:  # noqa: BLE001 - any import failure is the same refusal
        return [
            f"the GLM-5.3 layer kernel (mono_glm53.kernels.layer) does not import "
            f"({type(exc).__name__}: {exc}): install a mono-glm53 that ships it"
        ]
    if not hasattr(kernel_layer, "GlmLayerKernel"):
        return [
            "mono_glm53.kernels.layer has no GlmLayerKernel: install a mono-glm53 whose "
            "kernel and build agree"
        ]
    return []


def _flags_set(cfg: Any, flags: Mapping[str, str]) -> str:
    """The flags of `flags` (field -> flag) the server sets, as typed ("--ep-size 8")."""
    shown = []
    for field, flag in flags.items():
        value = _get(cfg, field)
        if value in (None, False, 0, "", "null") or value == []:
            continue
        shown.append(flag if value is True else f"{flag} {value}")
    return ", ".join(shown) or "/".join(flags.values())


#: SGLang's refused-by-default features (`Feature` names), each with what GLM-5.3's kernel
#: does instead and the server arguments that switch it on (field -> flag). The spec lists
#: them in `features`, so SGLang does not refuse them in its generic words ("X is in use and
#: the spec does not accept it"), and `feature_reasons` refuses each here, naming the flag to
#: drop. RAGGED_VERIFY and EAGLE3_HIDDEN_STATES occur only with speculative decoding, whose
#: reason covers them (each reason once).
FEATURES = {
    "PIPELINE_PARALLEL": (
        {"pp_size": "--pp-size"},
        "the kernel covers layers 3..77 of the whole model on every rank (no pipeline stages)",
        "start the server with --pp-size 1 (the default)",
    ),
    "MULTI_NODE_TP": (
        {"nnodes": "--nnodes"},
        "the kernel's in-launch all-reduce reaches the GPUs of one node only",
        "serve on one node (--nnodes 1, the default)",
    ),
    "DP_ATTENTION": (
        {"enable_dp_attention": "--enable-dp-attention", "attn_dp_size": "--attn-dp-size"},
        "the kernel runs attention tensor-parallel over every TP rank",
        "start the server without --enable-dp-attention",
    ),
    "EXPERT_PARALLEL": (
        {"ep_size": "--ep-size"},
        "the kernel runs every routed expert's TP shard on every rank (no expert parallelism)",
        "start the server with --ep-size 1 (the default)",
    ),
    "EPLB": (
        {"enable_eplb": "--enable-eplb"},
        "the kernel reads the experts where the checkpoint places them",
        "start the server without --enable-eplb",
    ),
    "CONTEXT_PARALLEL": (
        {"attn_cp_size": "--attn-cp-size", "dcp_size": "--dcp-size", "enable_prefill_cp": "--enable-prefill-cp"},
        "the kernel attends over the whole context on every rank",
        "start the server without context parallelism (--attn-cp-size 1, --dcp-size 1, no --enable-prefill-cp)",
    ),
    "SPECULATIVE_DECODING": (
        {"speculative_algorithm": "--speculative-algorithm"},
        "the kernel runs decode steps of one token a request, not speculative verify steps",
        "start the server without --speculative-algorithm",
    ),
    "TWO_BATCH_OVERLAP": (
        {"enable_two_batch_overlap": "--enable-two-batch-overlap",
         "enable_single_batch_overlap": "--enable-single-batch-overlap"},
        "the kernel runs a whole covered layer of the step in one launch, which splits no batch",
        "start the server without --enable-two-batch-overlap and --enable-single-batch-overlap",
    ),
    "LORA": (
        {"enable_lora": "--enable-lora", "lora_paths": "--lora-paths"},
        "the kernel applies no LoRA adapter",
        "start the server without --enable-lora and --lora-paths",
    ),
    "PD_DISAGGREGATION": (
        {"disaggregation_mode": "--disaggregation-mode"},
        "the kernel has not been checked on prefill/decode-disaggregated servers",
        "start the server without --disaggregation-mode",
    ),
    "RETURN_ROUTED_EXPERTS": (
        {"enable_return_routed_experts": "--enable-return-routed-experts"},
        "the kernel routes inside the launch and returns no expert ids",
        "start the server without --enable-return-routed-experts",
    ),
    "RETURN_INDEXER_TOPK": (
        {"enable_return_indexer_topk": "--enable-return-indexer-topk"},
        "the kernel's DSA top-k stays inside the launch",
        "start the server without --enable-return-indexer-topk",
    ),
    "KV_OFFLOAD": (
        {"enable_hierarchical_cache": "--enable-hierarchical-cache",
         "disaggregation_decode_enable_offload_kvcache": "--disaggregation-decode-enable-offload-kvcache",
         "enable_lmcache": "--enable-lmcache", "enable_flexkv": "--enable-flexkv"},
        "the kernel reads and writes the KV and index-K caches in the device pools only",
        "start the server without KV offload",
    ),
    "MEMORY_RELEASE": (
        {"enable_memory_saver": "--enable-memory-saver", "enable_weights_cpu_backup": "--enable-weights-cpu-backup"},
        "the kernel keeps pointers to the weights and caches that a memory release frees or moves",
        "start the server without --enable-memory-saver and --enable-weights-cpu-backup",
    ),
    "CPU_OFFLOAD": (
        {"cpu_offload_gb": "--cpu-offload-gb", "offload_group_size": "--offload-group-size"},
        "the kernel reads every covered layer's weights from GPU memory",
        "start the server without --cpu-offload-gb and --offload-group-size",
    ),
    "TORCH_COMPILE": (
        {"enable_torch_compile": "--enable-torch-compile"},
        "the spec's forward replaces the model's decode forward, which torch.compile would trace",
        "start the server without --enable-torch-compile",
    ),
}
#: Features that only occur together with another one, whose reason says what to change.
FEATURES_COVERED_BY = {"RAGGED_VERIFY": "SPECULATIVE_DECODING", "EAGLE3_HIDDEN_STATES": "SPECULATIVE_DECODING"}


def feature_reasons(cfg: Any) -> list[str]:
    """SGLang's refused-by-default features this server uses, each with the flag to drop.

    Which features are in use is SGLang's own probe (`binding.features_in_use`), so the
    refusal fires exactly when SGLang's generic one would have."""
    from sglang.srt.kernel_plugins.amd.binding import features_in_use

    in_use = {f.name for f in features_in_use(cfg)}
    reasons = []
    for name, (flags, why, fix) in FEATURES.items():
        if name in in_use:
            reasons.append(f"{_flags_set(cfg, flags)}: {why}; {fix}")
    for name, covering in FEATURES_COVERED_BY.items():
        if name in in_use and covering not in in_use:  # cannot happen in SGLang 0.5.23
            reasons.append(f"{name.lower().replace('_', ' ')} is in use: {FEATURES[covering][2]}")
    return reasons


def hf_shape_reasons(hf_config: Any, hf_values: Mapping[str, Any]) -> list[str]:
    """The HF config values the kernel is compiled for (exact, compared as SGLang compares
    `Requirements.hf_config`), in one reason that lists every mismatch."""
    wrong = [
        f"{key} {_get(hf_config, key)!r}, not {want!r}"
        for key, want in hf_values.items()
        if _get(hf_config, key) != want
    ]
    if not wrong:
        return []
    return [
        f"the model config is not GLM-5.3's ({'; '.join(wrong)}): the kernel is compiled for "
        "GLM-5.3's shapes; serve the GLM-5.3 FP8 checkpoint with its config.json unchanged"
    ]


#: mono-glm53's own environment variables -> (the values each takes, "" = unset; the
#: values a refusal suggests).
CHECK_ON = ("1", "true", "yes", "on")
CHECK_OFF = ("", "0", "false", "no", "off")
MONO_ENV = {
    "MONO_GLM53_LAYER": (("", "kernel", "reference"), ("kernel (the default)", "reference")),
    "MONO_GLM53_KERNEL_MODE": (("", "fused", "staged"), ("fused (the default)", "staged")),
    "SGLANG_AMD_MONO_CHECK": (CHECK_OFF + CHECK_ON, ("1 (check mode)", "0 (the default)")),
}


def mono_env_reasons() -> list[str]:
    """Unknown values of mono's environment variables, refused before the weights load
    (build and check mode read them only at install, after the load)."""
    import os

    reasons = []
    for name, (allowed, shown) in MONO_ENV.items():
        value = os.environ.get(name, "").strip().lower()
        if value not in allowed:
            reasons.append(
                f"{name}={os.environ[name]!r} is not a value mono-glm53 knows: set "
                f"{' or '.join(f'{name}={v}' for v in shown)}, or unset it"
            )
    fault = os.environ.get("MONO_GLM53_FAULT", "").strip()
    if fault:
        from mono_glm53.kernels.layer import fault_stage

        try:
            fault_stage(0, fault)
        except ValueError as exc:
            reasons.append(f"{exc}; or unset MONO_GLM53_FAULT (it injects a wait fault, for tests only)")
    from mono_common.guard_host import DEFAULT_MODE, MODE_ENV, MODES

    mode = os.environ.get(MODE_ENV, "")
    if mode and mode not in MODES:
        reasons.append(
            f"{MODE_ENV}={mode!r} is not a guard mode: set {MODE_ENV}="
            f"{' or '.join(MODES)} (default {DEFAULT_MODE}), or unset it"
        )
    return reasons


def config_reasons(
    cfg: Any,
    hf_config: Any,
    *,
    widths_by_tp: Mapping[int, Sequence[int]],
    hf_values: Mapping[str, Any] | None = None,
) -> list[str]:
    """Every reason GLM-5.3's kernel refuses this server before load, all at once, each once.

    A check that fails on a value of an unexpected type (a hand-edited config.json) becomes
    a reason naming what it checked, never a traceback in the launcher."""
    checks = (
        ("the server's features", lambda: feature_reasons(cfg)),
        ("the checkpoint's quantization", lambda: checkpoint_reasons(cfg, hf_config)),
        ("the model config's shapes", lambda: hf_shape_reasons(hf_config, hf_values or {})),
        ("the server arguments", lambda: server_arg_reasons(cfg)),
        ("SGLang's environment variables", env_reasons),
        ("mono-glm53's environment variables", mono_env_reasons),
        ("the model config", lambda: model_config_reasons(cfg, hf_config)),
        ("the decode CUDA graph sizes", lambda: capture_reasons(cfg, widths_by_tp=widths_by_tp)),
        ("check mode", lambda: check_mode_reasons(cfg)),
    )
    reasons: list[str] = []
    for what, check in checks:
        try:
            reasons += check()
        except Exception as exc:  # noqa: BLE001 - a malformed value is a refusal, not a crash
            reasons.append(
                f"{what} could not be checked ({type(exc).__name__}: {exc}): a value has an "
                "unexpected type or form; serve GLM-5.3's config.json unchanged with the flags "
                "mono-glm53's README shows"
            )
    return _dedupe(reasons)


# ---------------------------------------------------------------------------
# a GPU the kernel is not built for


#: The GPUs of each ISA the spec lists, for the unsupported-ISA refusal.
ISA_GPUS = {"gfx950": "MI355X", "sm_90": "H200/H100"}
_ISA_HINT_REGISTERED = False


def explain_unsupported_isa(server_args: Any, previous: Any) -> None:
    """SGLang's resolution step `handle_amd_monokernel`, wrapped (resolution_hooks).

    On a GPU whose ISA the spec does not list, SGLang's `find_spec` refuses with "monokernel
    backend 'amd' has no spec for ['GlmMoeDsaForCausalLM'] on sm_100", which names neither
    the supported GPUs nor a fix; that reason gets both appended, in place (so it is still
    said once). Every other outcome of the step passes through unchanged."""
    import re

    try:
        previous(server_args)
    except ValueError as exc:
        text = str(exc)
        found = re.search(rf"has no spec for \[[^\]]*'{ARCH}'[^\]]*\] on (\S+)", text)
        if found is None:
            raise
        from mono_glm53.spec import DEVICES

        built = ", ".join(f"{isa} ({ISA_GPUS.get(isa, isa)})" for isa in sorted(DEVICES))
        hint = (f": mono-glm53's kernel is built for {built} only; serve GLM-5.3 on one of "
                "those GPUs, or start the server without --enable-amd-monokernel")
        raise ValueError(text[: found.end()] + hint + text[found.end():]) from None


def register_isa_hint() -> None:
    """Wrap SGLang's `handle_amd_monokernel` with `explain_unsupported_isa`, once a process
    (the plugin's entry point runs before the launcher resolves the server)."""
    global _ISA_HINT_REGISTERED
    if _ISA_HINT_REGISTERED:
        return
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    register_resolution_hook("handle_amd_monokernel")(explain_unsupported_isa)
    _ISA_HINT_REGISTERED = True


# ---------------------------------------------------------------------------
# after load


def _block(hf_config: Any) -> int:
    """The checkpoint's FP8 block (128 for GLM-5.3; config_reasons refuses any other)."""
    quant = _get(hf_config, "quantization_config") or {}
    size = _get(quant, "weight_block_size") or [BLOCK]
    return int(size[0])


def _fp8_linear_reasons(
    where: str, module: Any, n: int | None, k: int | None, block: int = BLOCK
) -> list[str]:
    """Reasons an FP8 block linear is outside the layout the kernel reads:
    weight e4m3fn [N, K], weight_scale_inv fp32 [ceil(N/128), ceil(K/128)]."""
    import torch

    weight = getattr(module, "weight", None)
    scale = getattr(module, "weight_scale_inv", None)
    fix = (
        "the kernel reads e4m3fn weights with fp32 block-128 scales as the FP8 checkpoint "
        "loads them (no UE8M0 requantization, no fnuz); serve the FP8 checkpoint on sm_90 "
        "or gfx950 with the default --fp8-gemm-backend"
    )
    if weight is None or scale is None:
        return [f"{where} has no FP8 weight and weight_scale_inv: {fix}"]
    reasons = []
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        reasons.append(f"{where}.weight is {weight.dtype} {tuple(weight.shape)}: {fix}")
    if scale.dtype != torch.float32 or getattr(scale, "format_ue8m0", False):
        reasons.append(f"{where}.weight_scale_inv is {scale.dtype} (UE8M0 or not fp32): {fix}")
    if weight.dim() == 2:
        rows, cols = weight.shape
        if (n is not None and rows != n) or (k is not None and cols != k):
            reasons.append(f"{where}.weight is {tuple(weight.shape)}, not ({n}, {k}): {fix}")
        want = (-(-rows // block), -(-cols // block))
        if scale.dim() != 2 or tuple(scale.shape) != want:
            reasons.append(f"{where}.weight_scale_inv is {tuple(scale.shape)}, not {want}: {fix}")
    return reasons


def _moe_reasons(where: str, mlp: Any, hf_config: Any) -> list[str]:
    import torch

    reasons = []
    n_shared = int(_get(hf_config, "n_shared_experts", 1) or 0)
    fused = int(getattr(mlp, "num_fused_shared_experts", 0) or 0)
    if fused != n_shared or getattr(mlp, "shared_experts", None) is not None:
        reasons.append(
            f"{where}: the shared expert is not fused into the routed experts "
            f"(num_fused_shared_experts {fused}): the kernel runs it as routed expert index "
            f"{_get(hf_config, 'n_routed_experts')}; start the server without "
            "--disable-shared-experts-fusion, with --tp-size 4 or 8 and no expert parallelism"
        )
    block = _block(hf_config)
    experts = getattr(mlp, "experts", None)
    e = int(_get(hf_config, "n_routed_experts", 0)) + n_shared
    fix = (
        "the kernel reads e4m3fn expert weights with fp32 block-128 scales as SGLang's "
        "triton/aiter MoE runners leave them; start with --moe-runner-backend auto"
    )
    for name in ("w13_weight", "w2_weight"):
        w = getattr(experts, name, None)
        s = getattr(experts, name + "_scale_inv", None)
        if w is None or s is None:
            reasons.append(f"{where}.experts has no {name} and {name}_scale_inv: {fix}")
            continue
        if w.dtype != torch.float8_e4m3fn or w.dim() != 3 or w.shape[0] != e:
            reasons.append(f"{where}.experts.{name} is {w.dtype} {tuple(w.shape)}: {fix}")
        if s.dtype != torch.float32 or getattr(s, "format_ue8m0", False) or s.dim() != 3:
            reasons.append(f"{where}.experts.{name}_scale_inv is {s.dtype} {tuple(s.shape)}: {fix}")
        elif w.dim() == 3 and tuple(s.shape[1:]) != (-(-w.shape[1] // block), -(-w.shape[2] // block)):
            reasons.append(f"{where}.experts.{name}_scale_inv is {tuple(s.shape)}: {fix}")
    gate = getattr(mlp, "gate", None)
    weight = getattr(gate, "weight", None)
    if weight is None:
        reasons.append(f"{where} has no router gate weight: the kernel reads gate.weight")
    elif weight.dtype == torch.float32:
        if not torch.equal(weight.to(torch.bfloat16).to(torch.float32), weight):
            reasons.append(
                f"{where}.gate.weight is float32 with values bf16 cannot hold exactly: the "
                "kernel's router reads a bf16 copy of the gate; serve a checkpoint whose gate "
                "is bf16 (router_fp32 unset)"
            )
    elif weight.dtype != torch.bfloat16:
        reasons.append(f"{where}.gate.weight is {weight.dtype}: the kernel reads a bf16 router gate")
    bias = getattr(gate, "e_score_correction_bias", None)
    if bias is None or bias.dtype != torch.float32:
        reasons.append(
            f"{where}.gate.e_score_correction_bias is "
            f"{'missing' if bias is None else bias.dtype}: the kernel reads the fp32 "
            "noaux_tc correction bias"
        )
    return reasons


def _attention_reasons(where: str, attn: Any, hf_config: Any) -> list[str]:
    import torch

    reasons = []
    # this rank's heads (attention TP shards them)
    heads = int(getattr(attn, "num_local_heads", _get(hf_config, "num_attention_heads", 0)))
    q_lora = int(_get(hf_config, "q_lora_rank", 0))
    kv_lora = int(_get(hf_config, "kv_lora_rank", 0))
    nope = int(_get(hf_config, "qk_nope_head_dim", 0))
    rope = int(_get(hf_config, "qk_rope_head_dim", 0))
    v = int(_get(hf_config, "v_head_dim", 0))
    hidden = int(_get(hf_config, "hidden_size", 0))
    block = _block(hf_config)
    reasons += _fp8_linear_reasons(
        f"{where}.fused_qkv_a_proj_with_mqa",
        getattr(attn, "fused_qkv_a_proj_with_mqa", None),
        q_lora + kv_lora + rope,
        hidden,
        block,
    )
    reasons += _fp8_linear_reasons(
        f"{where}.q_b_proj", getattr(attn, "q_b_proj", None), heads * (nope + rope), q_lora, block
    )
    reasons += _fp8_linear_reasons(f"{where}.o_proj", getattr(attn, "o_proj", None), hidden, heads * v, block)
    for name, shape in (("w_kc", (heads, nope, kv_lora)), ("w_vc", (heads, kv_lora, v))):
        t = getattr(attn, name, None)
        if t is None or t.dtype != torch.bfloat16 or tuple(t.shape) != shape:
            got = "missing" if t is None else f"{t.dtype} {tuple(t.shape)}"
            reasons.append(
                f"{where}.{name} is {got}, not bf16 {shape}: the kernel packs W_UK/W_UV from "
                "the bf16 w_kc/w_vc SGLang derives from kv_b_proj at load"
            )
    rotary = getattr(attn, "rotary_emb", None)
    kind = type(rotary).__name__
    if rotary is None or "Yarn" in kind or "Scaling" in kind:
        reasons.append(
            f"{where}.rotary_emb is {kind}: the kernel applies a plain RoPE; serve a config "
            "without rope_scaling"
        )
    indexer = getattr(attn, "indexer", None)
    if indexer is None or type(indexer).__name__ != "Indexer":
        reasons.append(
            f"{where}.indexer is {type(indexer).__name__}: the kernel reads the plain DSA "
            "Indexer's index-K cache (fp8 keys + fp32 scale, one key a token); serve "
            "GLM-5.3's config (index_kpool 1)"
        )
    else:
        reasons += _fp8_linear_reasons(
            f"{where}.indexer.wq_b",
            getattr(indexer, "wq_b", None),
            int(_get(hf_config, "index_n_heads", 0)) * int(_get(hf_config, "index_head_dim", 0)),
            q_lora,
            block,
        )
        if getattr(indexer, "wk_weights_proj", None) is None and (
            getattr(indexer, "wk", None) is None or getattr(indexer, "weights_proj", None) is None
        ):
            reasons.append(
                f"{where}.indexer has neither wk_weights_proj nor wk + weights_proj: the "
                "kernel reads one of the two"
            )
    return reasons


def _layers(model: Any) -> Sequence[Any] | None:
    inner = getattr(model, "model", None)
    return getattr(inner, "layers", None)


def model_reasons(model: Any, hf_config: Any, copies: Mapping) -> list[str]:
    """Every reason the loaded model is outside what the kernel reads, all at once."""
    reasons: list[str] = launcher_reasons()
    archs = list(_get(hf_config, "architectures", None) or [])
    if ARCH not in archs:
        return reasons + [f"the model is {archs}, not {ARCH}: mono-glm53 serves GLM-5.3 only"]
    layers = _layers(model)
    if layers is None:
        return reasons + [f"{type(model).__name__} has no model.layers: mono-glm53 needs SGLang's {ARCH}"]
    n = int(_get(hf_config, "num_hidden_layers", 0))
    if len(layers) != n:
        return reasons + [
            f"the model holds {len(layers)} layers, not {n}: mono-glm53 covers layers "
            f"{FIRST_COVERED_LAYER}..{n - 1} of the whole model (no pipeline parallelism)"
        ]
    for i in covered_layers(hf_config):
        layer = layers[i]
        where = f"layer {i}"
        reasons += _attention_reasons(f"{where}.self_attn", getattr(layer, "self_attn", None), hf_config)
        reasons += _moe_reasons(f"{where}.mlp", getattr(layer, "mlp", None), hf_config)
        if len(reasons) > 24:  # one broken layout repeats on every layer: keep the message readable
            reasons.append(f"... (stopped after layer {i}; later layers were not checked)")
            break
    return _dedupe(reasons)


def _dedupe(reasons: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for r in reasons:
        seen.setdefault(r, None)
    return list(seen)
