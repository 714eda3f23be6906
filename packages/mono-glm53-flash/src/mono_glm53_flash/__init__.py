"""mono-glm53-flash: the GLM-5.3-Flash (Glm5NextForConditionalGeneration) plugin, not yet built.

It ships no spec yet, so it declares no SGLang entry point and SGLang runs
GLM-5.3-Flash on its own path. Importing it imports neither torch, triton
nor sglang.
"""

from mono_glm53_flash.__about__ import __version__

ARCHITECTURE = "Glm5NextForConditionalGeneration"
HAS_SPEC = False
CONTRACT_MODULES: tuple[str, ...] = ()

__all__ = ["ARCHITECTURE", "CONTRACT_MODULES", "HAS_SPEC", "__version__"]
