"""Why a DeepSeek-V4.1-Flash monokernel cannot run a setup: before load (config) and after load.

Each builder returns a list of reasons, each saying what was wrong and what is needed; the
spec hands SGLang all of them at once. Importing this module is cheap (no torch, no sglang):
`env_reasons` reads SGLang's `envs`, `capture_reasons` its `covered_capture_sizes` and
`model_reasons` torch tensors, each importing them when called.

What the reference (and so a future kernel) covers, and so what is refused otherwise:
- the V4.1 checkpoint: FP8 e4m3 32x32-block linears with power-of-two scales (`scale_fmt`
  ue8m0, fp32 `weight_scale_inv` after load), `wo_a` dequantized to bf16 at load, MXFP4
  routed experts, an unfused TP-sharded FP8 shared expert, bf16 activations;
- `hc_pre_from_prev_sublayer` mHC (the one-sublayer lag) without a per-head q norm;
- per-layer compress ratios 0 / 1 / 2 / 4 / 128 with the full top-k V4.1 indexer (no
  candidate blocks) and every ratio-1/2 layer reading a source that precedes it;
- the V4 KV layout on both ISAs (584-byte rows, 256-token pages, fp8 KV cache), the fp8 C4
  indexer, the offline C128 compressor, the SWA pool addressed through full_to_swa (no
  per-request window, no unified KV pool);
- tensor parallelism 2, 4 or 8 without expert or data parallel attention, steps of one token
  or a DSpark verify block per request;
- no Engram layer: the reference has no n-gram table lookup. SGLang's own V4.1-Flash recipe
  keeps two Engram tables (test/dsv41_flash_common.py), so the served checkpoint HAS Engram
  layers and is refused until they are covered (or handed to SGLang's modules);
- no vision tower: SGLang 0.5.23 routes every MoE of a vision checkpoint, the hash layers
  included, through `vision_topk`, which the reference mirrors only for the biased layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ARCH = "DeepseekV4ForCausalLM"
CHECKPOINT_ARCH = "DeepseekV41ForCausalLM"
PAGE_SIZE = 256
FP8_BLOCK = [32, 32]
KV_CACHE_DTYPES = frozenset({"auto", "fp8_e4m3"})  # "auto" resolves to fp8_e4m3 for this model
ATTENTION_BACKENDS = frozenset({"dsv4"})  # SGLang's override for DeepseekV4ForCausalLM
DSV4_ATTN_BACKENDS = frozenset({"auto", "flashmla"})  # flashmla_mega / trtllm: other layouts
# MoE runners whose expert layout `weights.py` describes: FlashInfer's MXFP4 (the sm_90
# default for FP4 experts) and AITER's (ROCm); "auto" resolves to one of them.
MOE_RUNNERS = frozenset({"auto", "flashinfer_mxfp4", "aiter"})
DECODE_GRAPH_BACKENDS = frozenset({"full", "disabled"})
SPECULATIVE = frozenset({None, "DSPARK"})
COMPRESS_RATIOS = frozenset({0, 1, 2, 4, 128})
TP_SIZES = (2, 4, 8)
# env var -> (required value or set of accepted values, what it selects otherwise)
ENV_REQUIRED: dict[str, tuple[Any, str]] = {
    "SGLANG_DSV4_KV_LAYOUT": ("v4", "a V4.1 KV layout (528/288-byte rows) the reference does not write"),
    "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": (frozenset({"auto", "fp8"}), "a compressed-KV layout other than V4's"),
    "SGLANG_OPT_USE_ONLINE_COMPRESS": (False, "the online C128 compressor (one running state a request)"),
    "SGLANG_OPT_FUSE_WQA_WKV": (True, "separate wq_a / wkv weights instead of the fused wqkv_a"),
    "SGLANG_DSV4_FP4_DEQUANT": (False, "the routed experts requantized to FP8 blocks at load"),
    "SGLANG_DSV4_FP4_EXPERTS": (True, "FP8 routed experts instead of MXFP4"),
    "SGLANG_DSV4_UNIFIED_KV_FP8": (False, "the unified fp8 KV pool"),
    "SGLANG_DSV4_USE_BF16_KV_QUANT_SOURCE": (False, "the KV row rounded to bf16 before its fp8 quantization"),
    "SGLANG_SHARED_EXPERT_TP1": (False, "a replicated (TP1) shared expert"),
    "SGLANG_SIMULATE_UNIFORM_EXPERTS": (False, "SGLang's benchmark routing override instead of the router"),
    "SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS": (False, "SGLang's benchmark routing override instead of the router"),
}
UNIFIED_KV_BACKEND = "unified_kv_triton"  # SGLANG_HACK_FLASHMLA_BACKEND value of the unified pool

SGLANG_READS = (
    "sglang.srt.environ.envs",
    *(f"sglang.srt.environ.Envs.{name}" for name in ENV_REQUIRED),
    "sglang.srt.environ.Envs.SGLANG_HACK_FLASHMLA_BACKEND",
    "sglang.srt.kernel_plugins.amd.binding.covered_capture_sizes",
    "sglang.srt.kernel_plugins.amd.binding.features_in_use",
    *(f"sglang.kernels.plugin_kernels.amd.spec.Feature.{name}" for name in (
        "PIPELINE_PARALLEL", "MULTI_NODE_TP", "DP_ATTENTION", "EXPERT_PARALLEL", "EPLB", "CONTEXT_PARALLEL",
        "RAGGED_VERIFY", "TWO_BATCH_OVERLAP", "LORA", "PD_DISAGGREGATION", "RETURN_ROUTED_EXPERTS",
        "RETURN_INDEXER_TOPK", "KV_OFFLOAD", "MEMORY_RELEASE", "CPU_OFFLOAD", "TORCH_COMPILE",
        "SPECULATIVE_DECODING", "EAGLE3_HIDDEN_STATES")),
    "sglang.srt.model_executor.cuda_graph_config.CudaGraphConfig#decode",
    "sglang.srt.model_executor.cuda_graph_config.PhaseConfig#bs",
    "sglang.srt.model_executor.cuda_graph_config.PhaseConfig#backend",
    "sglang.srt.configs.deepseek_v41.DeepseekV41Config",
    "sglang.srt.configs.deepseek_v41.normalize_deepseek_v41_config",
    "sglang.srt.layers.engram.Engram",
    "sglang.srt.multimodal.dsv41.vl_routing.vision_topk",
    "sglang.srt.arg_groups.model_overrides.deepseek_v4._deepseek_v4_overrides",
    "sglang.srt.arg_groups.overrides._deepseek_v4_kv_cache_dtype",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.select_dsv4_kv_layout",
    "sglang.srt.layers.attention.dsv4.unified_kv_gate.is_unified_kv_triton",
    *(f"sglang.srt.server_args.ServerArgs#{f}" for f in (
        "page_size", "kv_cache_dtype", "moe_runner_backend", "moe_a2a_backend", "ep_size", "enable_dp_attention",
        "attn_cp_size", "enable_prefill_cp", "dcp_size", "enable_hisparse", "enable_two_batch_overlap",
        "enforce_shared_experts_fusion", "speculative_algorithm", "speculative_num_draft_tokens", "disaggregation_mode",
        "enable_encoder_swa_bounded_replay", "dsv4_attn_backend", "enable_deepseek_v4_fp4_indexer",
        "expert_distribution_recorder_mode", "quantization", "pp_size", "tp_size", "cuda_graph_config",
        "flashinfer_mxfp4_moe_precision", "enable_lora")),
    "sglang.srt.models.deepseek_v4.MQALayer",
    "sglang.srt.models.deepseek_v2.DeepseekV2MoE",
)


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _dedupe(reasons: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(reasons))


def _version() -> str:
    from mono_deepseek_v41.__about__ import __version__

    return __version__


def kernel_reasons() -> list[str]:
    """No layer kernel exists: a registered spec must still refuse."""
    return [
        f"mono-deepseek-v41 {_version()} ships no DeepSeek-V4.1 layer kernel yet (the reference, "
        "weight layouts and this spec only): serve without --enable-amd-monokernel"
    ]


# ---- before load ------------------------------------------------------------------------------
def checkpoint_reasons(cfg: Any, hf_config: Any) -> list[str]:
    """The V4.1 checkpoint's quantization: FP8 32x32 ue8m0 blocks, MXFP4 routed experts."""
    reasons = []
    quant = _get(hf_config, "quantization_config") or {}
    method = _get(quant, "quant_method")
    fix = "serve DeepSeek-V4.1-Flash's own checkpoint (FP8 32x32 blocks with ue8m0 scales, MXFP4 routed experts)"
    if method != "fp8":
        reasons.append(f"the checkpoint's quant_method is {method!r}, not 'fp8': {fix}")
    else:
        block = _get(quant, "weight_block_size")
        if block is None or [int(b) for b in block] != FP8_BLOCK:
            reasons.append(f"the checkpoint's FP8 weight_block_size is {block}, not {FP8_BLOCK}: {fix}")
        if _get(quant, "scale_fmt") != "ue8m0":
            reasons.append(
                f"the checkpoint's FP8 scale_fmt is {_get(quant, 'scale_fmt')!r}, not 'ue8m0' (power-of-two "
                f"scales, activations quantized the same way): {fix}")
        routed = _get(quant, "routed_experts_quant_method")
        if routed not in (None, "mxfp4"):
            reasons.append(f"the checkpoint's routed_experts_quant_method is {routed!r}, not 'mxfp4': {fix}")
    quantization = _get(cfg, "quantization")
    if quantization not in (None, "fp8"):
        reasons.append(f"--quantization {quantization}: the reference reads the checkpoint's own FP8/MXFP4 "
                       "weights; start the server without --quantization")
    return reasons


def server_arg_reasons(cfg: Any) -> list[str]:
    reasons = []

    def flag(name):
        return "--" + name.replace("_", "-")

    page = _get(cfg, "page_size")
    if page not in (None, PAGE_SIZE):
        reasons.append(f"page size {page} is not {PAGE_SIZE}: the state layouts are SGLang's 256-token pages for "
                       f"this model; start the server without --page-size (or with --page-size {PAGE_SIZE})")
    kv = _get(cfg, "kv_cache_dtype")
    if kv not in KV_CACHE_DTYPES:
        reasons.append(f"--kv-cache-dtype {kv}: the reference writes the fp8 V4 KV rows; start the server with "
                       "--kv-cache-dtype fp8_e4m3 (or leave it unset)")
    backend = _get(cfg, "dsv4_attn_backend")
    if backend not in DSV4_ATTN_BACKENDS:
        reasons.append(f"--dsv4-attn-backend {backend}: its KV pools are not the V4 layout the reference reads; "
                       "start the server with --dsv4-attn-backend flashmla (or leave it unset)")
    runner = _get(cfg, "moe_runner_backend")
    if runner not in MOE_RUNNERS:
        reasons.append(f"--moe-runner-backend {runner}: the MXFP4 expert layout is described for flashinfer_mxfp4 "
                       "(CUDA) and aiter (ROCm); start the server with --moe-runner-backend auto")
    if _get(cfg, "flashinfer_mxfp4_moe_precision", "default") not in (None, "default"):
        reasons.append(f"--flashinfer-mxfp4-moe-precision {_get(cfg, 'flashinfer_mxfp4_moe_precision')}: the "
                       "reference runs the sm_90 experts W4A16 (bf16 activations); leave it at default")
    a2a = _get(cfg, "moe_a2a_backend", "none")
    if a2a not in (None, "none"):
        reasons.append(f"--moe-a2a-backend {a2a}: the reference shards every expert's intermediate dim over TP "
                       "(no all-to-all dispatch); start the server without --moe-a2a-backend")
    for name, why in (
        ("enable_hisparse", "HiSparse moves the C4 cache off the device pools"),
        ("enforce_shared_experts_fusion", "the shared expert fused into the MXFP4 routed experts"),
        ("enable_encoder_swa_bounded_replay", "the per-request SWA window pool"),
        ("enable_deepseek_v4_fp4_indexer", "the FP4 C4 indexer"),
    ):
        if _get(cfg, name) is True:
            reasons.append(f"{flag(name)}: {why} is not covered; start the server without {flag(name)}")
    spec = _get(cfg, "speculative_algorithm")
    if (str(spec).upper() if spec else None) not in SPECULATIVE:
        reasons.append(f"--speculative-algorithm {spec}: the verify steps covered are DSpark's (the target's "
                       "verify block); serve with --speculative-algorithm DSPARK or without speculation")
    recorder = _get(cfg, "expert_distribution_recorder_mode")
    if recorder is not None:
        reasons.append(f"--expert-distribution-recorder-mode {recorder}: routing inside one launch records "
                       "nothing; start the server without it")
    # the TP size is SGLang's to refuse (DeviceLimits.tp_sizes), in words that list the sizes
    return reasons


#: SGLang's refused-by-default features (`Feature` names), each with the server arguments
#: that switch it on and the fix. The spec lists them all in `features`, so SGLang does not
#: refuse them in its generic words, and `feature_reasons` refuses each here, once, naming the
#: flag to drop. Speculative decoding is covered for DSpark (`server_arg_reasons` refuses
#: the other algorithms, and so EAGLE3's hidden states); its ragged verify modes are not.
FEATURES: dict[str, tuple[tuple[str, ...], str]] = {
    "PIPELINE_PARALLEL": (("--pp-size",), "start the server with --pp-size 1 (the default)"),
    "MULTI_NODE_TP": (("--nnodes",), "serve on one node (--nnodes 1, the default)"),
    "DP_ATTENTION": (("--enable-dp-attention", "--attn-dp-size"), "start the server without DP attention"),
    "EXPERT_PARALLEL": (("--ep-size",), "start the server with --ep-size 1 (the default): the reference shards "
                        "every expert's intermediate dim over TP"),
    "EPLB": (("--enable-eplb",), "start the server without --enable-eplb"),
    "CONTEXT_PARALLEL": (("--attn-cp-size", "--dcp-size", "--enable-prefill-cp"),
                         "start the server without context parallelism"),
    "RAGGED_VERIFY": (("SGLANG_RAGGED_VERIFY_MODE",), "set SGLANG_RAGGED_VERIFY_MODE=static (the default): a launch "
                      "serves the same number of tokens for every request"),
    "TWO_BATCH_OVERLAP": (("--enable-two-batch-overlap", "--enable-single-batch-overlap"),
                          "start the server without batch overlap: a launch runs the whole step"),
    "LORA": (("--enable-lora", "--lora-paths"), "start the server without LoRA"),
    "PD_DISAGGREGATION": (("--disaggregation-mode",), "start the server without --disaggregation-mode"),
    "RETURN_ROUTED_EXPERTS": (("--enable-return-routed-experts",),
                              "start the server without --enable-return-routed-experts"),
    "RETURN_INDEXER_TOPK": (("--enable-return-indexer-topk",), "start the server without --enable-return-indexer-topk"),
    "KV_OFFLOAD": (("--enable-hierarchical-cache", "--enable-lmcache", "--enable-flexkv"),
                   "start the server without KV offload: the launches read the device pools only"),
    "MEMORY_RELEASE": (("--enable-memory-saver", "--enable-weights-cpu-backup"),
                       "start the server without memory release"),
    "CPU_OFFLOAD": (("--cpu-offload-gb", "--offload-group-size"), "start the server without CPU offload"),
    "TORCH_COMPILE": (("--enable-torch-compile",), "start the server without --enable-torch-compile"),
}
#: Accepted: speculative decoding (DSpark verify steps); the EAGLE3 hidden states only occur
#: with EAGLE3, which `server_arg_reasons` refuses.
ACCEPTED_FEATURES = ("SPECULATIVE_DECODING", "EAGLE3_HIDDEN_STATES")


def feature_reasons(cfg: Any) -> list[str]:
    """SGLang's refused-by-default features this server uses (SGLang's own probe,
    `binding.features_in_use`), each with the fix."""
    from sglang.srt.kernel_plugins.amd.binding import features_in_use

    in_use = {f.name for f in features_in_use(cfg)}
    return [f"{' / '.join(flags)}: {name.lower().replace('_', ' ')} is not covered; {fix}"
            for name, (flags, fix) in FEATURES.items() if name in in_use]


def hf_shape_reasons(hf_config: Any, hf_values: Mapping[str, Any]) -> list[str]:
    """The V4.1-Flash config values the launches are built for (compared as SGLang compares
    `Requirements.hf_config`), in one reason listing every mismatch."""
    wrong = [f"{key} {_get(hf_config, key)!r}, not {want!r}" for key, want in hf_values.items()
             if _get(hf_config, key) != want]
    if not wrong:
        return []
    return [f"the model config is not DeepSeek-V4.1-Flash's ({'; '.join(wrong)}): the reference and its layouts "
            "are built for V4.1-Flash's shapes; serve the DeepSeek-V4.1-Flash checkpoint with its config.json"]


def env_reasons() -> list[str]:
    from sglang.srt.environ import envs

    reasons = []
    for name, (want, why) in ENV_REQUIRED.items():
        have = getattr(envs, name).get()
        if isinstance(want, frozenset):
            ok = str(have).lower() in want
        elif isinstance(want, str):
            ok = str(have).lower() == want
        else:
            ok = bool(have) == want
        if not ok:
            reasons.append(f"{name}={have} selects {why}, which the reference does not cover; unset {name}")
    backend = envs.SGLANG_HACK_FLASHMLA_BACKEND.get()
    if backend == UNIFIED_KV_BACKEND:
        reasons.append(f"SGLANG_HACK_FLASHMLA_BACKEND={backend} selects the unified KV pool, not the V4 pages the "
                       "reference reads; unset SGLANG_HACK_FLASHMLA_BACKEND")
    return reasons


def model_config_reasons(hf_config: Any) -> list[str]:
    """Config structure the reference covers, beyond Requirements.hf_config's exact values."""
    reasons = []
    archs = list(_get(hf_config, "architectures", None) or [])
    if ARCH not in archs:
        reasons.append(f"the model is {archs}, not {ARCH} ({CHECKPOINT_ARCH}): mono-deepseek-v41 serves "
                       "DeepSeek-V4.1 only")
    if _get(hf_config, "model_type") != "deepseek_v41":
        reasons.append(f"config model_type {_get(hf_config, 'model_type')!r} is not 'deepseek_v41': the reference is "
                       "V4.1's (mHC lag, low-ratio compressors); serve a DeepSeek-V4.1 checkpoint")
    if not _get(hf_config, "hc_pre_from_prev_sublayer", False):
        reasons.append("config.hc_pre_from_prev_sublayer is off: the reference mirrors V4.1's lagged mHC "
                       "(pre from the previous sublayer); serve a DeepSeek-V4.1 checkpoint")
    if _get(hf_config, "q_head_norm", False):
        reasons.append("config.q_head_norm is on: the reference has no per-head q norm (V4.1 has none); serve a "
                       "DeepSeek-V4.1 checkpoint")
    ratios = list(_get(hf_config, "compress_ratios", None) or [])
    n = int(_get(hf_config, "num_hidden_layers", 0) or 0)
    if len(ratios) != n:
        reasons.append(f"config.compress_ratios has {len(ratios)} entries for {n} layers: the reference needs "
                       "one ratio a layer")
    bad = sorted(set(ratios) - COMPRESS_RATIOS)
    if bad:
        reasons.append(f"compress ratios {bad} are not among {sorted(COMPRESS_RATIOS)}")
    kv_src = set(_get(hf_config, "kv_source_layer_ids", None) or ())
    idx_src = set(_get(hf_config, "index_source_layer_ids", None) or ())
    for r in (1, 2):
        layers = [i for i, x in enumerate(ratios) if x == r]
        if not layers:
            continue
        if layers[0] not in kv_src or layers[0] not in idx_src:
            reasons.append(f"layer {layers[0]}, the first of ratio {r}, is not both a kv and an index source: its "
                           "attention would read latents or a top-k nothing wrote in this step")
        for i in idx_src & set(layers):
            src = max((s for s in kv_src if s <= i and ratios[s] == r), default=None)
            if src is not None and src not in idx_src:
                reasons.append(f"index source layer {i} reads layer {src}'s index keys, which layer {src} (not an "
                               "index source) never writes")
    if int(_get(hf_config, "candidate_source_layer_id", -1)) >= 0:
        reasons.append(f"config.candidate_source_layer_id {_get(hf_config, 'candidate_source_layer_id')}: the V4.1 "
                       "candidate-block indexer is not mirrored (the reference scores every visible block); "
                       "serve without --enable-amd-monokernel")
    engram = list(_get(hf_config, "engram_layer_ids", None) or ())
    if engram:
        reasons.append(f"config.engram_layer_ids {engram}: Engram layers (hashed n-gram table lookup, "
                       "layers/engram.py) are not covered by mono-deepseek-v41 yet, and DeepSeek-V4.1-Flash uses "
                       "them; serve without --enable-amd-monokernel")
    if int(_get(hf_config, "vision_n_layers", 0) or 0) > 0 and not _get(hf_config, "language_model_only", False):
        reasons.append("the checkpoint has a vision tower: SGLang 0.5.23 routes its MoE, hash layers included, "
                       "through vision_topk, which the reference does not mirror for hash layers; serve the "
                       "language model only (--json-model-override-args '{\"language_model_only\": true}')")
    if int(_get(hf_config, "num_hash_layers", 0) or 0) <= 0:
        reasons.append("config.num_hash_layers is missing or 0 (SGLang reads num_hash_layers, not "
                       "n_hash_layers): the reference would route every layer by score; serve the V4.1 "
                       "checkpoint's config")
    return reasons


def capture_reasons(cfg: Any, *, widths_by_tp: Mapping[int, Sequence[int]], tokens_per_request: int = 1) -> list[str]:
    """Refuse a server whose captured decode graphs none of the served widths runs."""
    graph = _get(cfg, "cuda_graph_config")
    decode = _get(graph, "decode") if graph is not None else None
    if decode is None:
        return []
    backend = _get(decode, "backend")
    if backend not in DECODE_GRAPH_BACKENDS:
        return [f"decode CUDA graphs are {backend!r}: a launch is captured as one whole graph; use the 'full' "
                "decode graph backend (the default), or disable decode graphs"]
    if backend == "disabled":
        return []
    tp = int(_get(cfg, "tp_size", 1) or 1)
    widths = tuple(widths_by_tp.get(tp, ()))
    sizes = sorted(set(_get(decode, "bs") or []))
    if not widths or not sizes:
        return []
    locked = _get(cfg, "_cuda_graph_config_locked", None) or set()
    captured = sizes
    if ("decode", "bs") not in locked:
        from sglang.srt.kernel_plugins.amd.binding import covered_capture_sizes

        captured = covered_capture_sizes(widths=widths, tokens_per_request=tokens_per_request, sizes=sizes)
    served = {w // tokens_per_request for w in widths if w % tokens_per_request == 0}
    if not served.intersection(captured):
        return [f"none of the captured decode graphs (batch sizes {sorted(captured)}) runs a launch: at TP {tp} "
                f"with {tokens_per_request} token(s) a request the launches serve batch sizes {sorted(served)}; "
                "capture at least one of them (or leave --cuda-graph-bs-decode unset)"]
    return []


def tokens_per_request_of(cfg: Any) -> int:
    """Rows a request brings to a step: 1, or the DSpark verify block (gamma + 1)."""
    if _get(cfg, "speculative_algorithm"):
        return int(_get(cfg, "speculative_num_draft_tokens", 1) or 1)
    return 1


def config_reasons(cfg: Any, hf_config: Any, *, widths_by_tp: Mapping[int, Sequence[int]],
                   hf_values: Mapping[str, Any] | None = None) -> list[str]:
    """Every reason this server is refused before load, all at once, each once. A check that
    fails on a malformed value becomes a reason naming what it checked, not a traceback."""
    checks = (
        ("the server's features", lambda: feature_reasons(cfg)),
        ("the checkpoint's quantization", lambda: checkpoint_reasons(cfg, hf_config)),
        ("the model config's shapes", lambda: hf_shape_reasons(hf_config, hf_values or {})),
        ("the server arguments", lambda: server_arg_reasons(cfg)),
        ("SGLang's environment variables", env_reasons),
        ("the model config", lambda: model_config_reasons(hf_config)),
        ("the decode CUDA graph sizes", lambda: capture_reasons(
            cfg, widths_by_tp=widths_by_tp, tokens_per_request=tokens_per_request_of(cfg))),
    )
    reasons = kernel_reasons()
    for what, check in checks:
        try:
            reasons += check()
        except Exception as exc:  # noqa: BLE001 - a malformed value is a refusal, not a crash
            reasons.append(f"cannot check {what} ({type(exc).__name__}: {exc}); serve the DeepSeek-V4.1-Flash "
                           "checkpoint with its own config")
    return _dedupe(reasons)


# ---- after load ---------------------------------------------------------------------------------
def _layer_reasons(i: int, layer: Any, hf_config: Any) -> list[str]:
    import torch

    reasons = []
    where = f"layer {i}"
    attn = getattr(layer, "self_attn", None)
    ratios = list(_get(hf_config, "compress_ratios", None) or [])
    if attn is None or type(attn).__name__ != "MQALayer":
        return [f"{where}.self_attn is {type(attn).__name__}, not MQALayer: serve SGLang's DeepseekV4ForCausalLM"]
    if i < len(ratios) and getattr(attn, "compress_ratio", None) != ratios[i]:
        reasons.append(f"{where} runs compress ratio {getattr(attn, 'compress_ratio', None)}, the config says "
                       f"{ratios[i]}")
    if getattr(attn, "wqkv_a", None) is None:
        reasons.append(f"{where} has no fused wqkv_a: unset SGLANG_OPT_FUSE_WQA_WKV")
    wo_a = getattr(getattr(attn, "wo_a", None), "weight", None)
    if wo_a is None or wo_a.dtype != torch.bfloat16:
        reasons.append(f"{where}.wo_a is {None if wo_a is None else wo_a.dtype}, not the bf16 weight SGLang "
                       "dequantizes V4.1's 32x32 blocks to")
    for name in ("wqkv_a", "wq_b", "wo_b"):
        lin = getattr(attn, name, None)
        w, s = getattr(lin, "weight", None), getattr(lin, "weight_scale_inv", None)
        if w is None or s is None or w.dtype != torch.float8_e4m3fn or s.dtype != torch.float32:
            reasons.append(f"{where}.{name} is not e4m3 with fp32 block scales (the sm_90 load of the V4.1 "
                           "checkpoint)")
    if getattr(layer, "engram", None) is not None:
        reasons.append(f"{where} carries an Engram module: not covered")
    mlp = getattr(layer, "mlp", None)
    if getattr(mlp, "shared_experts", None) is None or int(getattr(mlp, "num_fused_shared_experts", 0) or 0):
        reasons.append(f"{where}.mlp has no unfused shared expert: start the server without "
                       "--enforce-shared-experts-fusion")
    experts = getattr(mlp, "experts", None)
    w13 = getattr(experts, "w13_weight", None)
    if w13 is None or w13.dtype not in (torch.int8, torch.uint8, getattr(torch, "float4_e2m1fn_x2", torch.int8)):
        reasons.append(f"{where}.mlp.experts.w13_weight is {None if w13 is None else w13.dtype}, not packed MXFP4")
    return reasons


def model_reasons(model: Any, hf_config: Any, copies: Mapping) -> list[str]:
    """Every reason the loaded model is outside what the reference covers, all at once."""
    reasons = kernel_reasons() + model_config_reasons(hf_config)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return _dedupe(reasons + [f"{type(model).__name__} has no model.layers: serve SGLang's {ARCH}"])
    for i, layer in enumerate(layers):
        reasons += _layer_reasons(i, layer, hf_config)
        if len(reasons) > 24:  # one broken layout repeats on every layer: keep the message readable
            reasons.append(f"... (stopped after layer {i}; later layers were not checked)")
            break
    return _dedupe(reasons)
