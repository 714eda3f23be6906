"""mono-deepseek-v41: the DeepSeek-V4.1-Flash (DeepseekV4ForCausalLM) plugin, kernel not yet built.

What it holds so far: the layer shapes (`config`), the plain-torch decode / verify step of
every layer kind (`reference`, with `quant` for the number formats), SGLang's weight and
state layouts (`layouts`, `weights`) and the `MonoSpec` with its refusals (`spec`,
`refusals`). The spec is NOT registered: with no kernel there is no `sglang.srt.plugins`
entry point, so SGLang runs DeepSeek-V4.1-Flash on its own path. Importing this package
imports neither torch, triton nor sglang; the submodules import them themselves.
"""

from mono_deepseek_v41.__about__ import __version__

ARCHITECTURE = "DeepseekV4ForCausalLM"
HAS_SPEC = False  # True only once a kernel serves the spec and an entry point registers it
# Modules whose SGLANG_READS the contract test (and `mono doctor`) resolve.
CONTRACT_MODULES: tuple[str, ...] = (
    "mono_deepseek_v41.config",
    "mono_deepseek_v41.quant",
    "mono_deepseek_v41.layouts",
    "mono_deepseek_v41.reference",
    "mono_deepseek_v41.weights",
    "mono_deepseek_v41.refusals",
    "mono_deepseek_v41.spec",
)

__all__ = ["ARCHITECTURE", "CONTRACT_MODULES", "HAS_SPEC", "__version__"]
