"""mono-glm53: the GLM-5.3 (GlmMoeDsaForCausalLM) monokernel plugin for SGLang.

Importing this package imports neither torch, triton nor sglang: SGLang runs
the entry point (`mono_glm53.plugin:register`) in every process. The spec,
kernels and reference live in submodules that import their heavy
dependencies themselves.
"""

from mono_glm53.__about__ import __version__

ARCHITECTURE = "GlmMoeDsaForCausalLM"
HAS_SPEC = True
# Modules whose SGLANG_READS the contract test and `mono doctor` resolve.
CONTRACT_MODULES = (
    "mono_glm53.plugin",
    "mono_glm53.spec",
    "mono_glm53.refusals",
    "mono_glm53.build",
    "mono_glm53.forward",
    "mono_glm53.check",
    "mono_glm53.reference",
)

__all__ = ["ARCHITECTURE", "CONTRACT_MODULES", "HAS_SPEC", "__version__"]
