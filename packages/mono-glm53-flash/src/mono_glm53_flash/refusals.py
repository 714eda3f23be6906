"""Why a GLM-5.3-Flash monokernel cannot run a setup: before load (config) and after load (model).

Each builder returns a list of reasons, each saying what was wrong and what is needed; the
spec hands SGLang all of them at once (SGLang joins them into one ValueError at startup, or
one per install on every rank).

Importing this module is cheap (no torch, no sglang): SGLang imports the spec in its
launcher. `env_reasons` reads SGLang's `envs`, `capture_reasons` its `covered_capture_sizes`,
`model_config_reasons` its `dsa_layer_skips_topk`, and `model_reasons` torch tensors, each
importing them when called.

What the kernel is built for (and so what is refused otherwise):
- the mixed FP8/MXFP4 checkpoint: FP8 e4m3 block-128 linears with fp32 `weight_scale_inv`,
  MXFP4 routed experts (`routed_experts_quant_method` "mxfp4"), bf16 activations;
- 256-token pages (64 x index_kpool, SGLang's own page size for this model), a bf16 MLA KV
  cache (512 values a token, no rope part) and IndexerKPool's pooled index-K cache (one fp8
  key + fp32 scale per 4 tokens, 64 keys a page; AITER's tile order on ROCm) with its
  compress tails, a fresh top-k on every sparse-attention layer;
- the KDA state in SGLang's MambaPool as the packed decode leaves it: a bf16 conv window and
  an fp32 recurrent state, written in place every step (no ReplaySSM ring);
- the routed experts as SGLang's triton (CUDA, row-major packed) or aiter (ROCm, shuffled)
  MoE runners leave them, the shared expert FP8 (or fused into the experts as expert 288);
- the model's own router (no benchmark routing override, no expert recorder), one decode
  token a request (no speculative decoding), hyper-connection streams (`mhc`), MoE on every
  layer from 3 on (`moe_layer_freq` 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ARCH = "Glm5NextForConditionalGeneration"
BLOCK = 128
MX_GROUP = 32
INDEX_KPOOL = 4
PAGE_SIZE = 64 * INDEX_KPOOL
FIRST_COVERED_LAYER = 3  # layers 0..2 are dense and run SGLang's modules
# --kv-cache-dtype values that give the bf16 MLA cache on sm_90 and gfx950 ("auto" resolves
# to bfloat16 for DSA models there).
KV_CACHE_DTYPES = frozenset({"auto", "bf16", "bfloat16"})
# MoE runners whose post-load expert layout the kernel reads: the loaded row-major packed
# MXFP4 with fp32 scales (triton; "auto" on sm_90 without an a2a backend) and AITER's
# shuffled MXFP4 with e8m0 scales (aiter on gfx950).
MOE_RUNNERS = frozenset({"auto", "triton", "aiter"})
ATTENTION_BACKENDS = frozenset({"dsa", "nsa"})  # the DSA decode backend ("nsa": its old name)
DECODE_GRAPH_BACKENDS = frozenset({"full", "disabled"})
SSM_DTYPES = frozenset({None, "float32"})
# SGLang's benchmark-only routing overrides (layers/moe/topk.py routing_simulation_enabled).
ROUTING_OVERRIDE_ENVS = ("SGLANG_SIMULATE_UNIFORM_EXPERTS", "SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS")
CONV_DTYPE_ENV = "SGLANG_MAMBA_CONV_DTYPE"
SSM_DTYPE_ENV = "SGLANG_MAMBA_SSM_DTYPE"
PRESHUFFLE_OFF_ENV = "SGLANG_DSA_HIP_DISABLE_PRESHUFFLE"
#: SGLang `Feature` names the spec accepts because `server_arg_reasons` refuses them itself
#: (they all come with --speculative-algorithm).
FEATURES_REFUSED_HERE = ("SPECULATIVE_DECODING", "RAGGED_VERIFY", "EAGLE3_HIDDEN_STATES")

#: HF config values the kernel is compiled for (exact). SGLang reads the top-level
#: `Glm5NextConfig`, which hands text_config's attributes through. index_n_heads is GLM-5.3's
#: 32: SGLang's code does not fix GLM-5.3-Flash's (see config.py).
HF_CONFIG = {
    "hidden_size": 4096,
    "num_hidden_layers": 45,
    "first_k_dense_replace": 3,
    "num_attention_heads": 64,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 256,
    "qk_rope_head_dim": 0,
    "v_head_dim": 256,
    "n_routed_experts": 288,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "swiglu_limit": 10.0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "linear_num_heads": 64,
    "linear_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
}

SGLANG_READS = (
    "sglang.srt.environ.envs",
    "sglang.srt.environ.Envs.SGLANG_SIMULATE_UNIFORM_EXPERTS",
    "sglang.srt.environ.Envs.SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS",
    "sglang.srt.environ.Envs.SGLANG_MAMBA_CONV_DTYPE",
    "sglang.srt.environ.Envs.SGLANG_MAMBA_SSM_DTYPE",
    "sglang.srt.environ.Envs.SGLANG_DSA_HIP_DISABLE_PRESHUFFLE",
    "sglang.srt.kernel_plugins.amd.binding.covered_capture_sizes",
    "sglang.srt.configs.model_config.dsa_layer_skips_topk",
    "sglang.srt.configs.glm5_next.Glm5NextTextConfig",
    "sglang.srt.server_args.ServerArgs#page_size",
    "sglang.srt.server_args.ServerArgs#kv_cache_dtype",
    "sglang.srt.server_args.ServerArgs#moe_runner_backend",
    "sglang.srt.server_args.ServerArgs#enable_hisparse",
    "sglang.srt.server_args.ServerArgs#expert_distribution_recorder_mode",
    "sglang.srt.server_args.ServerArgs#enable_linear_replayssm",
    "sglang.srt.server_args.ServerArgs#enable_linear_replayssm_spec",
    "sglang.srt.server_args.ServerArgs#mamba_ssm_dtype",
    "sglang.srt.server_args.ServerArgs#speculative_algorithm",
    "sglang.srt.server_args.ServerArgs#quantization",
    "sglang.srt.server_args.ServerArgs#cuda_graph_config",
    "sglang.srt.server_args.ServerArgs#tp_size",
    "sglang.srt.model_executor.cuda_graph_config.CudaGraphConfig#decode",
    "sglang.srt.model_executor.cuda_graph_config.PhaseConfig#bs",
    "sglang.srt.model_executor.cuda_graph_config.PhaseConfig#backend",
    # the loaded model, read by model_reasons
    "sglang.srt.models.glm5_next.Glm5NextForConditionalGeneration",
    "sglang.srt.models.glm5_next.Glm5NextLinearAttention",
    "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA",
    "sglang.srt.models.deepseek_v2.DeepseekV2MoE",
    "sglang.srt.layers.attention.dsa.dsa_indexer_kpool.IndexerKPool",
    "sglang.srt.layers.quantization.fp8.Fp8MoEMethod.create_weights",
)


# ---------------------------------------------------------------------------
# helpers


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _text(hf_config: Any) -> Any:
    return _get(hf_config, "text_config", None) or hf_config


def _dedupe(reasons: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(reasons))


def _version() -> str:
    from mono_glm53_flash.__about__ import __version__

    return __version__


def kernel_reasons() -> list[str]:
    """No GLM-5.3-Flash layer kernel exists yet: a spec registered by hand is refused."""
    import importlib.util

    if importlib.util.find_spec("mono_glm53_flash.kernels") is None:
        return [
            f"mono-glm53-flash {_version()} ships no GLM-5.3-Flash layer kernel yet (only the "
            "reference, the layouts and this spec): serve without --enable-amd-monokernel"
        ]
    return []


# ---------------------------------------------------------------------------
# before load


def checkpoint_reasons(cfg: Any, hf_config: Any) -> list[str]:
    """The mixed FP8/MXFP4 checkpoint: FP8 block-128 linears, MXFP4 routed experts."""
    reasons = []
    quant = _get(hf_config, "quantization_config")
    method = _get(quant, "quant_method") if quant else None
    want = (
        "serve GLM-5.3-Flash's mixed FP8/MXFP4 checkpoint (quantization_config quant_method "
        "'fp8', weight_block_size [128, 128], routed_experts_quant_method 'mxfp4')"
    )
    if not quant or method != "fp8":
        what = "unquantized" if not quant else f"quantized with {method!r}"
        reasons.append(f"the checkpoint is {what}: the kernel reads FP8 block-128 linears and MXFP4 experts; {want}")
    else:
        block = _get(quant, "weight_block_size")
        if block is None or [int(b) for b in block] != [BLOCK, BLOCK]:
            reasons.append(f"the checkpoint's FP8 weight_block_size is {block}, not [128, 128]: {want}")
        if _get(quant, "fmt") not in (None, "e4m3"):
            reasons.append(f"the checkpoint's FP8 format is {_get(quant, 'fmt')!r}, not 'e4m3': {want}")
        if _get(quant, "activation_scheme") not in (None, "dynamic"):
            reasons.append(
                f"the checkpoint's FP8 activation_scheme is {_get(quant, 'activation_scheme')!r}: "
                f"the kernel quantizes activations dynamically; {want}"
            )
        experts = _get(quant, "routed_experts_quant_method")
        if experts != "mxfp4":
            reasons.append(
                f"the routed experts are not MXFP4 (routed_experts_quant_method {experts!r}): the "
                f"kernel reads MXFP4 experts (e2m1, e8m0 scale a 32-group); {want}"
            )
        ignored = [str(x) for x in (_get(quant, "ignored_layers") or _get(quant, "modules_to_not_convert") or [])]
        if any("shared_experts" in x for x in ignored):
            reasons.append(
                "the checkpoint leaves the shared experts unquantized (bf16): the kernel reads an "
                f"FP8 block-128 shared expert; {want}"
            )
    quantization = _get(cfg, "quantization")
    if quantization not in (None, "fp8"):
        reasons.append(
            f"--quantization {quantization}: the kernel reads the checkpoint's FP8/MXFP4 weights as "
            "they load; start the server without --quantization"
        )
    return reasons


def server_arg_reasons(cfg: Any) -> list[str]:
    reasons = []
    page = _get(cfg, "page_size")
    if page != PAGE_SIZE:
        reasons.append(
            f"page size {page} is not {PAGE_SIZE}: the kernel reads 256-token KV pages, each holding "
            f"64 pooled index keys (SGLang's own page size for index_kpool 4); start the server "
            f"with --page-size {PAGE_SIZE} (on ROCm also keep AITER's preshuffled paged-MQA path: "
            f"Triton >= 3.5, {PRESHUFFLE_OFF_ENV} unset)"
        )
    kv = _get(cfg, "kv_cache_dtype")
    if kv not in KV_CACHE_DTYPES:
        reasons.append(
            f"--kv-cache-dtype {kv}: the kernel reads and writes the bf16 MLA KV cache (512 latent "
            "values a token); start the server with --kv-cache-dtype bfloat16"
        )
    runner = _get(cfg, "moe_runner_backend")
    if runner not in MOE_RUNNERS:
        reasons.append(
            f"--moe-runner-backend {runner}: the kernel reads the MXFP4 experts as loaded (triton, "
            "CUDA) or as AITER shuffles them (aiter, ROCm); this runner repacks them; start the "
            "server with --moe-runner-backend auto"
        )
    if _get(cfg, "enable_hisparse"):
        reasons.append(
            "--enable-hisparse moves the sparse KV cache off the device pools the kernel reads; "
            "start the server without --enable-hisparse"
        )
    mode = _get(cfg, "expert_distribution_recorder_mode")
    if mode is not None:
        reasons.append(
            f"--expert-distribution-recorder-mode {mode}: the kernel routes inside one launch and "
            "records no expert distribution; start the server without "
            "--expert-distribution-recorder-mode"
        )
    for flag in ("enable_linear_replayssm", "enable_linear_replayssm_spec"):
        if _get(cfg, flag):
            reasons.append(
                f"--{flag.replace('_', '-')} keeps the KDA state in a ReplaySSM ring flushed every "
                "few steps: the kernel updates the fp32 state in place every step; start the "
                f"server without --{flag.replace('_', '-')}"
            )
    ssm = _get(cfg, "mamba_ssm_dtype")
    if ssm not in SSM_DTYPES:
        reasons.append(
            f"--mamba-ssm-dtype {ssm}: the kernel reads and writes the KDA recurrent state in fp32; "
            "start the server without --mamba-ssm-dtype (or with --mamba-ssm-dtype float32)"
        )
    algo = _get(cfg, "speculative_algorithm")
    if algo is not None:
        reasons.append(
            f"speculative decoding ({algo}): the kernel runs one decode token a request, not "
            "target-verify steps; start the server without --speculative-algorithm"
        )
    return reasons


def env_reasons() -> list[str]:
    from sglang.srt.environ import envs

    reasons = []
    for name in ROUTING_OVERRIDE_ENVS:
        if getattr(envs, name).get():
            reasons.append(
                f"{name} is set: SGLang's benchmark routing override replaces the router, and the "
                f"kernel routes by the model's own gate; unset {name}"
            )
    conv = getattr(envs, CONV_DTYPE_ENV).get()
    if conv != "bfloat16":
        reasons.append(
            f"{CONV_DTYPE_ENV}={conv}: the kernel reads the KDA conv window in bf16; unset {CONV_DTYPE_ENV}"
        )
    ssm = getattr(envs, SSM_DTYPE_ENV).get()
    if ssm not in SSM_DTYPES:
        reasons.append(
            f"{SSM_DTYPE_ENV}={ssm}: the kernel reads and writes the KDA recurrent state in fp32; "
            f"unset {SSM_DTYPE_ENV}"
        )
    return reasons


def hf_shape_reasons(hf_config: Any) -> list[str]:
    """The exact HF config values (HF_CONFIG) the kernel is compiled for."""
    reasons = []
    for key, want in HF_CONFIG.items():
        got = _get(hf_config, key, None)
        if got != want:
            reasons.append(
                f"config.{key} is {got!r}, not {want!r}: the kernel is compiled for GLM-5.3-Flash's "
                "shapes; serve GLM-5.3-Flash with its own config.json"
            )
    return reasons


def model_config_reasons(hf_config: Any) -> list[str]:
    """HF config values beyond the exact shapes of HF_CONFIG."""
    c = _text(hf_config)
    reasons = []
    freq = _get(c, "moe_layer_freq", 1)
    if freq != 1:
        reasons.append(
            f"config.moe_layer_freq {freq}: the kernel runs the MoE FFN on every covered layer; "
            "serve GLM-5.3-Flash's config (moe_layer_freq 1)"
        )
    if not _get(c, "mhc", False):
        reasons.append(
            "config.mhc is off: the kernel reads and writes the 4 hyper-connection streams; serve "
            "GLM-5.3-Flash's config (mhc true)"
        )
    kpool = _get(c, "index_kpool", 1) or 1
    compress = bool(_get(c, "index_kpool_compress", False))
    tail = bool(_get(c, "index_kpool_always_select_tail", False))
    if int(kpool) != INDEX_KPOOL or not compress or not tail:
        reasons.append(
            f"the index cache is not IndexerKPool's 4-token pooled cache (index_kpool {kpool}, "
            f"index_kpool_compress {compress}, index_kpool_always_select_tail {tail}): the kernel "
            "reads one compressed fp8 key per 4 tokens and the request's compress tails; serve "
            "GLM-5.3-Flash's config (index_kpool 4, compress and always_select_tail true)"
        )
    try:
        from sglang.srt.configs.model_config import dsa_layer_skips_topk

        n = int(_get(c, "num_hidden_layers", 0) or 0)
        shared = [i for i in range(FIRST_COVERED_LAYER, n - 1) if dsa_layer_skips_topk(c, i)]
    except Exception as exc:  # noqa: BLE001 - a config SGLang cannot read is a refusal, not a crash
        shared = []
        reasons.append(f"cannot read the DSA top-k layer pattern ({exc}); serve GLM-5.3-Flash's config")
    if shared:
        reasons.append(
            f"layers {shared} reuse the previous layer's top-k and keep no index cache "
            "(index_topk_freq / index_topk_pattern): the kernel runs a fresh top-k on every "
            "sparse-attention layer; serve a config without shared top-k layers"
        )
    return reasons


def capture_reasons(cfg: Any, *, widths_by_tp: Mapping[int, Sequence[int]], tokens_per_request: int = 1) -> list[str]:
    """Refuse a server whose captured decode graphs none of the served widths runs."""
    graph = _get(cfg, "cuda_graph_config")
    decode = _get(graph, "decode") if graph is not None else None
    if decode is None:
        return []
    backend = _get(decode, "backend")
    if backend not in DECODE_GRAPH_BACKENDS:
        return [
            f"decode CUDA graphs are {backend!r}: the kernel's forward is captured as one whole "
            "graph; use the 'full' decode graph backend (the default), or disable decode graphs"
        ]
    if backend == "disabled":
        return []
    tp = int(_get(cfg, "tp_size", 1) or 1)
    widths = tuple(widths_by_tp.get(tp, ()))
    sizes = sorted(set(_get(decode, "bs") or []))
    if not widths or not sizes:
        return []  # the binding refuses the TP size itself
    # SGLang aligns the sizes to the widths unless decode bs was set explicitly
    # (binding.handle_amd_monokernel); check what will actually be captured.
    locked = _get(cfg, "_cuda_graph_config_locked", None) or set()
    captured = sizes
    if ("decode", "bs") not in locked:
        from sglang.srt.kernel_plugins.amd.binding import covered_capture_sizes

        captured = covered_capture_sizes(widths=widths, tokens_per_request=tokens_per_request, sizes=sizes)
    served = {w // tokens_per_request for w in widths if w % tokens_per_request == 0}
    if not served.intersection(captured):
        return [
            f"none of the captured decode graphs (batch sizes {sorted(captured)}) runs the kernel: "
            f"at TP {tp} it serves batch sizes {sorted(served)}; capture at least one of them "
            f"(e.g. --cuda-graph-bs-decode {' '.join(map(str, sorted(served)))} plus any larger "
            "sizes, or leave --cuda-graph-bs-decode unset)"
        ]
    return []


def config_reasons(cfg: Any, hf_config: Any, *, widths_by_tp: Mapping[int, Sequence[int]]) -> list[str]:
    """Every reason GLM-5.3-Flash's kernel refuses this server before load, all at once."""
    return _dedupe(
        [
            *kernel_reasons(),
            *checkpoint_reasons(cfg, hf_config),
            *server_arg_reasons(cfg),
            *env_reasons(),
            *hf_shape_reasons(hf_config),
            *model_config_reasons(hf_config),
            *capture_reasons(cfg, widths_by_tp=widths_by_tp),
        ]
    )


# ---------------------------------------------------------------------------
# after load


def _block(hf_config: Any) -> int:
    """The checkpoint's FP8 block (128 for GLM-5.3-Flash; config_reasons refuses any other)."""
    quant = _get(hf_config, "quantization_config") or {}
    return int((_get(quant, "weight_block_size") or [BLOCK])[0])


def _fp8_linear_reasons(where: str, module: Any, n: int | None, k: int | None, block: int) -> list[str]:
    """An FP8 block linear outside the layout the kernel reads: e4m3fn [N, K] with fp32
    weight_scale_inv [ceil(N/128), ceil(K/128)] (row-major on CUDA, AITER-shuffled on ROCm)."""
    import torch

    weight = getattr(module, "weight", None)
    scale = getattr(module, "weight_scale_inv", None)
    fix = (
        "the kernel reads e4m3fn weights with fp32 block-128 scales as SGLang loads the FP8 "
        "checkpoint (no UE8M0 requantization, no fnuz); serve the FP8/MXFP4 checkpoint with "
        "the default --fp8-gemm-backend"
    )
    if weight is None or scale is None:
        got = "missing" if weight is None else f"{weight.dtype} without weight_scale_inv"
        return [f"{where}.weight is {got}: {fix}"]
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


def _tensor_reason(where: str, t: Any, dtype: Any, shape: tuple[int, ...] | None, fix: str) -> list[str]:
    if t is None:
        return [f"{where} is missing: {fix}"]
    if t.dtype != dtype or (shape is not None and tuple(t.shape) != shape):
        return [f"{where} is {t.dtype} {tuple(t.shape)}, not {dtype} {shape}: {fix}"]
    return []


def _param(module: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def _kda_reasons(where: str, attn: Any, c: Any, tp: int, b: int) -> list[str]:
    import torch

    if type(attn).__name__ != "Glm5NextLinearAttention":
        return [f"{where} is {type(attn).__name__}: the kernel covers Glm5NextLinearAttention (KDA) layers"]
    h = int(_get(c, "hidden_size"))
    heads, d = int(_get(c, "linear_num_heads")) // tp, int(_get(c, "linear_head_dim"))
    p = heads * d
    fix = "serve GLM-5.3-Flash's FP8/MXFP4 checkpoint (the kernel reads the KDA layouts it loads into)"
    reasons = []
    if getattr(attn, "do_fuse_qkvbfg", False):
        reasons.append(
            f"{where} holds unquantized q/k/v projections (fused_qkvbfg_a_proj, bf16): the kernel reads "
            "the FP8 block-128 qkv_proj; serve GLM-5.3-Flash's FP8/MXFP4 checkpoint"
        )
    else:
        reasons += _fp8_linear_reasons(f"{where}.qkv_proj", getattr(attn, "qkv_proj", None), 3 * p, h, b)
    reasons += _fp8_linear_reasons(f"{where}.o_proj", getattr(attn, "o_proj", None), h, p, b)
    for name, shape in (
        ("dt_bias", (p,)),
        ("A_log", (1, 1, heads, 1)),
        ("qkv_conv1d.weight", (3 * p, 1, int(_get(c, "linear_conv_kernel_dim")))),
    ):
        reasons += _tensor_reason(f"{where}.{name}", _param(attn, name), torch.float32, shape, fix)
    return reasons


def _mla_reasons(where: str, attn: Any, c: Any, tp: int, b: int) -> list[str]:
    import torch

    heads = int(_get(c, "num_attention_heads")) // tp
    q_lora, kv_lora = int(_get(c, "q_lora_rank")), int(_get(c, "kv_lora_rank"))
    nope, v, h = int(_get(c, "qk_nope_head_dim")), int(_get(c, "v_head_dim")), int(_get(c, "hidden_size"))
    reasons = []
    reasons += _fp8_linear_reasons(
        f"{where}.fused_qkv_a_proj_with_mqa", getattr(attn, "fused_qkv_a_proj_with_mqa", None), q_lora + kv_lora, h, b)
    reasons += _fp8_linear_reasons(f"{where}.q_b_proj", getattr(attn, "q_b_proj", None), heads * nope, q_lora, b)
    reasons += _fp8_linear_reasons(f"{where}.o_proj", getattr(attn, "o_proj", None), h, heads * v, b)
    fix = "the kernel packs W_UK/W_UV from the bf16 w_kc/w_vc SGLang derives from kv_b_proj at load"
    reasons += _tensor_reason(f"{where}.w_kc", getattr(attn, "w_kc", None), torch.bfloat16, (heads, nope, kv_lora), fix)
    reasons += _tensor_reason(f"{where}.w_vc", getattr(attn, "w_vc", None), torch.bfloat16, (heads, kv_lora, v), fix)
    indexer = getattr(attn, "indexer", None)
    if type(indexer).__name__ != "IndexerKPool":
        reasons.append(
            f"{where}.indexer is {type(indexer).__name__}: the kernel reads IndexerKPool's pooled "
            "index cache; serve GLM-5.3-Flash's config (index_kpool 4)"
        )
        return reasons
    ih, d = int(_get(c, "index_n_heads")), int(_get(c, "index_head_dim"))
    reasons += _fp8_linear_reasons(f"{where}.indexer.wq_b", getattr(indexer, "wq_b", None), ih * d, q_lora, b)
    reasons += _fp8_linear_reasons(f"{where}.indexer.wk", getattr(indexer, "wk", None), d, h, b)
    fix = "serve GLM-5.3-Flash's checkpoint (the kernel reads the indexer as IndexerKPool builds it)"
    for name, dtype, shape in (
        ("weights_proj.weight", torch.float32, (ih, h)),
        ("k_norm.weight", torch.float32, (d,)),
        ("k_norm.bias", torch.float32, (d,)),
        ("index_kpool_compress_ape", torch.float32, (INDEX_KPOOL, d)),
        ("index_kpool_compress_gate", torch.bfloat16, (d, h)),
    ):
        reasons += _tensor_reason(f"{where}.indexer.{name}", _param(indexer, name), dtype, shape, fix)
    return reasons


def _moe_reasons(where: str, mlp: Any, c: Any, tp: int, isa: str | None, b: int) -> list[str]:
    import torch

    reasons = []
    h, inter = int(_get(c, "hidden_size")), int(_get(c, "moe_intermediate_size")) // tp
    n_routed = int(_get(c, "n_routed_experts"))
    fused = int(getattr(mlp, "num_fused_shared_experts", 0) or 0)
    e = n_routed + fused
    rocm = isa is not None and isa.startswith("gfx")
    fmt = (
        "float4_e2m1fn_x2 in AITER's shuffle with float8_e8m0fnu scales (--moe-runner-backend aiter)"
        if rocm
        else "int8-packed e2m1 pairs with fp32 power-of-two scales, row-major (--moe-runner-backend auto)"
    )
    fix = f"the kernel reads MXFP4 experts as {fmt}; serve the FP8/MXFP4 checkpoint with that runner"
    experts = getattr(mlp, "experts", None)
    want_w = getattr(torch, "float4_e2m1fn_x2", torch.uint8) if rocm else torch.int8
    want_s = torch.float8_e8m0fnu if rocm else torch.float32
    for name, rows, k in (("w13_weight", 2 * inter, h), ("w2_weight", h, inter)):
        w = getattr(experts, name, None)
        s = getattr(experts, name + "_scale_inv", None)
        reasons += _tensor_reason(f"{where}.experts.{name}", w, want_w, (e, rows, k // 2), fix)
        reasons += _tensor_reason(f"{where}.experts.{name}_scale_inv", s, want_s, (e, rows, k // MX_GROUP), fix)
        if s is not None and getattr(s, "format_ue8m0", False):
            reasons.append(f"{where}.experts.{name}_scale_inv was transformed for DeepGEMM (UE8M0 layout): {fix}")
        if rocm and w is not None and not getattr(w, "is_shuffled", False):
            reasons.append(f"{where}.experts.{name} is not AITER-shuffled: {fix}")
    if rocm and int(getattr(experts, "intermediate_pad", 0) or 0):
        reasons.append(f"{where}.experts pads the intermediate size: {fix}")
    shared = getattr(mlp, "shared_experts", None)
    if fused == 0:
        up = getattr(shared, "gate_up_proj", None)
        weight = getattr(up, "weight", None)
        if weight is not None and weight.dtype == torch.bfloat16:
            reasons.append(
                f"{where}.shared_experts is bf16: the kernel reads an FP8 block-128 shared expert (or one "
                "fused into the MXFP4 experts); serve the FP8/MXFP4 checkpoint, whose shared expert is FP8"
            )
        else:
            si = int(_get(c, "moe_intermediate_size")) * int(_get(c, "n_shared_experts") or 1) // tp
            reasons += _fp8_linear_reasons(f"{where}.shared_experts.gate_up_proj", up, 2 * si, h, b)
            reasons += _fp8_linear_reasons(
                f"{where}.shared_experts.down_proj", getattr(shared, "down_proj", None), h, si, b)
    gate = getattr(mlp, "gate", None)
    weight = getattr(gate, "weight", None)
    reasons += _tensor_reason(
        f"{where}.gate.weight", weight, torch.bfloat16, (n_routed, h), "the kernel's router reads a bf16 gate"
    )
    reasons += _tensor_reason(
        f"{where}.gate.e_score_correction_bias",
        getattr(gate, "e_score_correction_bias", None),
        torch.float32,
        (n_routed,),
        "the kernel reads the fp32 noaux_tc correction bias",
    )
    return reasons


def model_reasons(model: Any, hf_config: Any, copies: Mapping, *, tp_size: int = 1, isa: str | None = None) -> list[str]:
    """Every reason the loaded model is outside what the kernel reads, all at once."""
    reasons: list[str] = kernel_reasons()
    archs = list(_get(hf_config, "architectures", None) or [])
    if ARCH not in archs:
        return reasons + [f"the model is {archs}, not {ARCH}: mono-glm53-flash serves GLM-5.3-Flash only"]
    layers = getattr(getattr(model, "model", None), "layers", None)
    c = _text(hf_config)
    if layers is None:
        return reasons + [f"{type(model).__name__} has no model.layers: mono-glm53-flash needs SGLang's {ARCH}"]
    n = int(_get(c, "num_hidden_layers", 0))
    if len(layers) != n:
        return reasons + [
            f"the model holds {len(layers)} layers, not {n}: mono-glm53-flash covers layers "
            f"{FIRST_COVERED_LAYER}..{n - 2} of the whole model (no pipeline parallelism)"
        ]
    kda_layers = set((_get(c, "linear_attn_config", None) or {}).get("kda_layers", []))
    b = _block(hf_config)
    for i in range(FIRST_COVERED_LAYER, n - 1):
        layer = layers[i]
        attn = getattr(layer, "self_attn", None)
        if i in kda_layers:
            reasons += _kda_reasons(f"layer {i}.self_attn", attn, c, tp_size, b)
        else:
            reasons += _mla_reasons(f"layer {i}.self_attn", attn, c, tp_size, b)
        reasons += _moe_reasons(f"layer {i}.mlp", getattr(layer, "mlp", None), c, tp_size, isa, b)
        if len(reasons) > 24:  # one broken layout repeats on every layer: keep the message readable
            reasons.append(f"... (stopped after layer {i}; later layers were not checked)")
            break
    return _dedupe(reasons)
