"""mono-glm53-flash: the GLM-5.3-Flash (Glm5NextForConditionalGeneration) plugin, kernel not yet built.

What it holds so far: the layer shapes (`config`), the plain-torch decode step of a KDA and a
sparse-attention layer (`reference`, `quant`), SGLang's weight and state layouts (`weights`)
and the `MonoSpec` with its refusals (`spec`, `refusals`). The spec is NOT registered: with
no kernel there is no `sglang.srt.plugins` entry point, so SGLang runs GLM-5.3-Flash on its
own path. Importing this package imports neither torch, triton nor sglang; the submodules
import them themselves.
"""

from mono_glm53_flash.__about__ import __version__

ARCHITECTURE = "Glm5NextForConditionalGeneration"
HAS_SPEC = False  # True only once a kernel serves the spec and an entry point registers it
# Modules whose SGLANG_READS the contract test (and `mono doctor`) resolve.
CONTRACT_MODULES: tuple[str, ...] = (
    "mono_glm53_flash.config",
    "mono_glm53_flash.quant",
    "mono_glm53_flash.reference",
    "mono_glm53_flash.weights",
    "mono_glm53_flash.refusals",
    "mono_glm53_flash.spec",
)

__all__ = ["ARCHITECTURE", "CONTRACT_MODULES", "HAS_SPEC", "__version__"]
