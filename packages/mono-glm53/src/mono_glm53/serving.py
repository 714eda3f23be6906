"""The GLM-5.3 server the READMEs show, as `mono doctor` checks it (`mono.serving` entry point).

`LAUNCH_ARGS` is the command line of the root README and this package's README after
`--model-path` (tests/unit/test_serving_example.py checks both READMEs hold it, and runs
SGLang's whole startup resolution on it). `server_args(tp)` is what that resolution gives
for the fields the startup checks read; `hf_config()` is the FP8 checkpoint's config as
transformers reads it. Importing this module is cheap; `hf_config()` imports transformers.
"""

from __future__ import annotations

from typing import Any

from mono_common.serving import ServingSetup
from mono_glm53 import ARCHITECTURE

MODEL_PATH = "zai-org/GLM-5.3"
#: The flags: TP 8 (the FP8 checkpoint fills 8 H200s), the 64-token pages and the bf16 MLA
#: cache the kernel reads (SGLang picks both for GLM-5.3 on its own; they are spelled out so
#: the command states what the kernel needs), and the switch.
LAUNCH_ARGS = ("--tp", "8", "--page-size", "64", "--kv-cache-dtype", "bfloat16", "--enable-amd-monokernel")
#: The checkpoint's quantization_config (config.json of the FP8 release).
FP8_QUANTIZATION = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


def server_args(tp: int) -> dict[str, Any]:
    """What SGLang 0.5.23's startup resolution gives LAUNCH_ARGS (at TP `tp`) for the fields
    the startup checks read; every other field keeps its default."""
    return {
        "model_path": MODEL_PATH,
        "enable_amd_monokernel": True,
        "tp_size": tp,
        "attention_backend": "dsa",  # SGLang's choice for DSA models
        "page_size": 64,
        "kv_cache_dtype": "bfloat16",
        "moe_runner_backend": "auto",
    }


def hf_config() -> Any:
    """GLM-5.3's config as the FP8 checkpoint's config.json gives it (transformers'
    GlmMoeDsaConfig defaults are GLM-5.3's shapes)."""
    from transformers import GlmMoeDsaConfig

    # dtype: the checkpoint's config.json says bfloat16; without it SGLang resolves float16,
    # which the spec refuses
    config = GlmMoeDsaConfig(
        architectures=[ARCHITECTURE], quantization_config=dict(FP8_QUANTIZATION), torch_dtype="bfloat16"
    )
    config.indexer_rope_interleave = True  # as the GLM-5.x checkpoints set it
    return config


def setup() -> ServingSetup:
    """The `mono.serving` entry point: the README's server, for `mono doctor`."""
    from mono_glm53.spec import WIDTHS_BY_TP

    return ServingSetup(
        model="glm53",
        architecture=ARCHITECTURE,
        model_path=MODEL_PATH,
        launch_args=LAUNCH_ARGS,
        server_args=server_args,
        hf_config=hf_config,
        widths_by_tp=WIDTHS_BY_TP,
    )
