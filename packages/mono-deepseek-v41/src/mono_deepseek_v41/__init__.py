"""mono-deepseek-v41: the DeepSeek-V4.1-Flash (DeepseekV4ForCausalLM) plugin, not yet built.

It ships no spec yet, so it declares no SGLang entry point and SGLang runs
DeepSeek-V4.1-Flash on its own path. Importing it imports neither torch,
triton nor sglang.
"""

from mono_deepseek_v41.__about__ import __version__

ARCHITECTURE = "DeepseekV4ForCausalLM"
HAS_SPEC = False
CONTRACT_MODULES: tuple[str, ...] = ()

__all__ = ["ARCHITECTURE", "CONTRACT_MODULES", "HAS_SPEC", "__version__"]
