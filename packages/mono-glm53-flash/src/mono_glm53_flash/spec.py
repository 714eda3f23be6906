"""GLM-5.3-Flash's `MonoSpec`: what SGLang 0.5.23's `--enable-amd-monokernel` binding reads.

NOT REGISTERED. No layer kernel exists yet, so the package declares no `sglang.srt.plugins`
entry point and nothing calls `register(...)` with this spec; `HAS_SPEC` stays False. The
spec exists so its refusals can be shown through SGLang's own `monokernel_disable_reasons`
(tests register it by hand in a throwaway registry). Were it registered anyway, its first
refusal says there is no kernel, and `build` raises.

SGLang imports a spec module in its launcher and on every TP rank, so importing this one is
cheap: msgspec and SGLang's spec module only; the refusals import torch and SGLang's runtime
when SGLang calls them.

Launches. A covered layer (3..43) is one launch of one of two kinds: "kda" (30 layers) or
"mla" (the 11 sparse-attention layers), at TP 2, 4 or 8, for steps of 1, 2, 4 or 8 rows, on
gfx950 (MI355X, 256 CUs) and sm_90 (H200, 132 SMs).

Where refusals are stated, each once. SGLang checks, in its own words that list the accepted
values: the ISA (`devices`), the TP size, the dtype and the decode attention backend
(`Requirements`), the watchdog, the bitwise flags and the refused-by-default features other
than speculative decoding. Everything else is checked by `config_disable_reasons` alone, in
words that name the fix ("page size 64 is not 256: ... start the server with --page-size
256"): the server arguments, SGLang's environment variables, the HF config's shapes, the
checkpoint's quantization, the index cache kind and the captured graph sizes.
`model_disable_reasons` checks the loaded weights after load, on every rank.
"""

from __future__ import annotations

from typing import Any

from sglang.kernels.plugin_kernels.amd.spec import (
    DeviceLimits,
    Feature,
    MonoSpec,
    Numerics,
    NumericsKind,
    Requirements,
)

from mono_common.sglang_compat import MONOKERNEL_API_VERSION
from mono_common.widths import merge_widths_by_tp
from mono_glm53_flash import ARCHITECTURE
from mono_glm53_flash import refusals as _r

SGLANG_READS = (
    "sglang.kernels.plugin_kernels.amd.spec.MonoSpec",
    "sglang.kernels.plugin_kernels.amd.spec.DeviceLimits",
    "sglang.kernels.plugin_kernels.amd.spec.Feature.SPECULATIVE_DECODING",
    "sglang.kernels.plugin_kernels.amd.spec.Feature.RAGGED_VERIFY",
    "sglang.kernels.plugin_kernels.amd.spec.Feature.EAGLE3_HIDDEN_STATES",
    "sglang.kernels.plugin_kernels.amd.spec.Requirements",
    "sglang.kernels.plugin_kernels.amd.spec.Numerics",
    "sglang.kernels.plugin_kernels.amd.spec.NumericsKind.TOLERANCE",
    "sglang.kernels.plugin_kernels.amd.spec.MONOKERNEL_API_VERSION",
    "sglang.srt.kernel_plugins.amd.binding.device_isa",
    "sglang.srt.runtime_context.get_parallel",
    "sglang.srt.server_args.ServerArgs#tp_size",
)

NAME = "mono-glm53-flash"
SPEC_PATH = "mono_glm53_flash.spec:SPEC"

#: Step rows (batch size x tokens a request) a launch serves: the published gfx950 port
#: covers 1 to 8 rows, and SGLang aligns the decode capture sizes to these widths
#: (binding.covered_capture_sizes), so a batch of 3 replays the width-4 graph.
WIDTHS = (1, 2, 4, 8)
#: TP sizes per ISA and the widths each serves. The MXFP4 experts fit TP 2 on either.
WIDTHS_BY_TP = {isa: {2: WIDTHS, 4: WIDTHS, 8: WIDTHS} for isa in ("gfx950", "sm_90")}
#: CUs (MI355X) or SMs (H200) of the persistent grid; SGLang refuses a partitioned GPU with fewer.
RESIDENT_BLOCKS = {"gfx950": 256, "sm_90": 132}

DEVICES = {
    isa: DeviceLimits(widths=WIDTHS, tp_sizes=tuple(sorted(WIDTHS_BY_TP[isa])), resident_blocks=RESIDENT_BLOCKS[isa])
    for isa in ("gfx950", "sm_90")
}


#: HF config values the kernel is compiled for (refusals.HF_CONFIG), checked by
#: `config_disable_reasons` in words naming the fix, not also by SGLang's Requirements.
HF_CONFIG = _r.HF_CONFIG

REQUIREMENTS = Requirements(
    dtypes=frozenset({"bfloat16"}),
    attention_backends=_r.ATTENTION_BACKENDS,
)

#: SGLang's refused-by-default features that `config_disable_reasons` refuses itself, naming
#: the flag to drop (speculative decoding, and the two features that only come with it);
#: SGLang still refuses every other feature in its own words.
FEATURES = frozenset(Feature[name] for name in _r.FEATURES_REFUSED_HERE)

#: Check-mode bounds, `<launch>.<output>.<metric>`, for the two launch kinds. Outputs: the mHC
#: streams a launch hands the next layer ([T, 16384] bf16); a KDA launch's state rows (the
#: fp32 recurrent state [64/tp, 128, 128] and the bf16 conv window of the step's slots); an
#: MLA launch's cache rows (the 512-value KV row of the new token, the pooled index key it
#: closes, dequantised, and the compress-tail row it writes). No kernel exists yet: the
#: values are the GLM-5.3 kernel's measured-and-kept bounds carried over (streams cosine
#: 0.999 and rel 0.05, a KV row cosine 0.9999, an index key cosine 0.999 and rel 0.07 = one
#: e4m3 step of a flipped rounding); the state bounds allow the kernel's fp32 sums in another
#: order (a relative 1e-3 of the state's largest element, cosine 0.99999), the conv and tail
#: rows are copies of a bf16 projection output whose GEMM order may move one bf16 ulp (rel
#: 2 ** -7). The first kernel run on the H200 must confirm or tighten them.
NUMERICS = Numerics(
    kind=NumericsKind.TOLERANCE,
    bounds={
        "kda.streams.cosine": 0.999,
        "kda.streams.rel": 0.05,
        "kda.state.cosine": 0.99999,
        "kda.state.rel": 1e-3,
        "kda.conv.rel": 2**-7,
        "mla.streams.cosine": 0.999,
        "mla.streams.rel": 0.05,
        "mla.kv.cosine": 0.9999,
        "mla.kv.rel": 0.02,
        "mla.index_k.cosine": 0.999,
        "mla.index_k.rel": 0.07,
        "mla.tail.rel": 2**-7,
    },
)


def config_disable_reasons(cfg: Any, hf_config: Any) -> list[str]:
    """Before load, in the launcher: every reason this server is refused, at once."""
    return _r.config_reasons(cfg, hf_config, widths_by_tp=merge_widths_by_tp(WIDTHS_BY_TP))


def _rank_facts() -> tuple[int, str | None]:
    """This rank's TP size and ISA (1 and None outside a running server)."""
    try:
        from sglang.srt.kernel_plugins.amd.binding import device_isa
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().tp_size), device_isa()
    except Exception:  # noqa: BLE001 - no runtime context: check the whole-model shapes
        return 1, None


def model_disable_reasons(model: Any, hf_config: Any, copies: dict) -> list[str]:
    """After load, on every rank: every reason the loaded model is refused, at once."""
    tp, isa = _rank_facts()
    return _r.model_reasons(model, hf_config, copies, tp_size=tp, isa=isa)


def build(model: Any, hf_config: Any, context: Any) -> Any:
    """No kernel yet: SGLang only reaches this if every refusal was bypassed."""
    raise NotImplementedError(
        "mono-glm53-flash ships no GLM-5.3-Flash layer kernel yet: serve without --enable-amd-monokernel"
    )


SPEC = MonoSpec(
    name=NAME,
    devices=DEVICES,
    features=FEATURES,
    requires=REQUIREMENTS,
    numerics=NUMERICS,
    model_disable_reasons=model_disable_reasons,
    build=build,
    api_version=MONOKERNEL_API_VERSION,
    config_disable_reasons=config_disable_reasons,
)

__all__ = ["ARCHITECTURE", "HF_CONFIG", "NUMERICS", "SPEC", "SPEC_PATH", "WIDTHS", "WIDTHS_BY_TP"]
