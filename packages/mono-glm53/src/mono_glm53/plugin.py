"""The `sglang.srt.plugins` entry point of mono-glm53: registers the GLM-5.3 spec, lazily.

SGLang calls `register()` in every process (launcher, schedulers,
detokenizer) and only logs its exceptions, so it must be cheap, idempotent
and import no kernel: it checks the SGLang version and hands SGLang the
spec's import path; SGLang imports `mono_glm53.spec` only when it resolves a
GlmMoeDsaForCausalLM server with --enable-amd-monokernel.
"""

from __future__ import annotations

from mono_glm53 import ARCHITECTURE

SPEC_PATH = "mono_glm53.spec:SPEC"
SGLANG_READS = ("sglang.kernels.plugin_kernels.amd.spec.register",)


def register() -> None:
    """Register GLM-5.3's MonoSpec with SGLang's AMD monokernel registry (a no-op when repeated)."""
    from mono_common.sglang_compat import require_supported_sglang

    require_supported_sglang()
    from sglang.kernels.plugin_kernels.amd.spec import register as sglang_register

    sglang_register(backend="amd", architecture=ARCHITECTURE, path=SPEC_PATH)
    # an unsupported GPU's refusal names the supported ones (SGLang's own words do not)
    from mono_glm53.refusals import register_isa_hint

    register_isa_hint()
