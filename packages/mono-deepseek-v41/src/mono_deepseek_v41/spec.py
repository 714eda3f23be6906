"""DeepSeek-V4.1-Flash's `MonoSpec`: what SGLang 0.5.23's `--enable-amd-monokernel` binding reads.

NOT REGISTERED. No layer kernel exists yet, so the package declares no `sglang.srt.plugins`
entry point, nothing calls `register(...)` with this spec, and `HAS_SPEC` stays False. The
spec exists so its refusals can be shown through SGLang's own `monokernel_disable_reasons`
(tests register it in a throwaway registry). Were it registered anyway, its first refusal
says there is no kernel, and `build` raises.

SGLang imports a spec module in its launcher and on every TP rank, so importing this one is
cheap: msgspec and SGLang's spec module only; the refusals import torch and SGLang's runtime
when SGLang calls them.

Launches. A covered layer is two launches, as the published AMD plugin splits it: "attn"
(the attention hyper-connection: combine + norm, q/kv, the SWA write, the layer's compressors
and indexers, sparse attention, wo_a / wo_b, all-reduce #1, the mHC post) and "moe" (its
combine + norm, router, shared + routed experts, all-reduce #2, the post). Both ISAs
(gfx950: MI355X, 256 CUs; sm_90: H200, 132 SMs), TP 2, 4 and 8, steps of up to 48 rows: a
decode batch, or a DSpark verify block (gamma + 1 tokens a request, `tokens_per_request`) per
request.

Where refusals are stated. `Requirements` declares the dtype and the dsv4 decode backend,
which SGLang checks in its own words. Everything else (the V4.1-Flash shape values, server
flags, SGLang's refused-by-default features, environment variables, the checkpoint's config)
is checked by `config_disable_reasons` alone, each reason once, naming its fix.
`model_disable_reasons` checks the loaded layers on every rank.
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
from mono_deepseek_v41 import ARCHITECTURE
from mono_deepseek_v41 import refusals as _r

SGLANG_READS = (
    "sglang.kernels.plugin_kernels.amd.spec.MonoSpec",
    "sglang.kernels.plugin_kernels.amd.spec.DeviceLimits",
    "sglang.kernels.plugin_kernels.amd.spec.Feature",
    "sglang.kernels.plugin_kernels.amd.spec.Requirements",
    "sglang.kernels.plugin_kernels.amd.spec.Numerics",
    "sglang.kernels.plugin_kernels.amd.spec.NumericsKind.TOLERANCE",
    "sglang.kernels.plugin_kernels.amd.spec.MONOKERNEL_API_VERSION",
    "sglang.kernels.plugin_kernels.amd.spec.ShapeKey",
    "sglang.srt.kernel_plugins.amd.binding.install_monokernel_forward",
    "sglang.srt.runtime_context.get_spec",
    "sglang.srt.server_args.ServerArgs#tp_size",
    "sglang.srt.server_args.ServerArgs#speculative_num_draft_tokens",
)

NAME = "mono-deepseek-v41"
SPEC_PATH = "mono_deepseek_v41.spec:SPEC"

#: Decode batch sizes a launch serves (one token a request), and the DSpark verify blocks
#: (gamma + 1 tokens a request; SGLang's V4.1-Flash recipe uses block size 5, so 6) for up
#: to 8 requests. Rows = batch x tokens; SGLang routes exact graph keys and aligns the decode
#: capture sizes to these widths (binding.covered_capture_sizes).
DECODE_BATCHES = (1, 2, 4, 8, 16, 24, 32, 48)
VERIFY_TOKENS = (2, 3, 4, 5, 6)
VERIFY_BATCHES = (1, 2, 4, 8)
MAX_ROWS = 48
WIDTHS = tuple(sorted({*DECODE_BATCHES, *(t * b for t in VERIFY_TOKENS for b in VERIFY_BATCHES if t * b <= MAX_ROWS)}))
#: TP sizes per ISA and the widths each serves. TP 8 leaves one wo_a group (8 heads) a rank.
WIDTHS_BY_TP = {isa: {tp: WIDTHS for tp in _r.TP_SIZES} for isa in ("gfx950", "sm_90")}
#: CUs (MI355X) or SMs (H200) of the persistent grid; SGLang refuses a partitioned GPU with fewer.
RESIDENT_BLOCKS = {"gfx950": 256, "sm_90": 132}

DEVICES = {
    isa: DeviceLimits(widths=WIDTHS, tp_sizes=tuple(sorted(WIDTHS_BY_TP[isa])), resident_blocks=RESIDENT_BLOCKS[isa])
    for isa in ("gfx950", "sm_90")
}


#: HF config values the launches are built for: the values SGLang's code is gated on for
#: V4.1-Flash (config.V41_FLASH_GATES) and V4.1's structural flags. Exact (getattr on the
#: `DeepseekV41Config`). The values SGLang's code does not pin (layer count, experts' sizes,
#: the compress-ratio pattern) are read from the checkpoint and checked by the refusals.
HF_CONFIG = {
    "hidden_size": 5120,
    "q_lora_rank": 1280,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "hc_mult": 4,
    "hc_pre_from_prev_sublayer": True,
    "q_head_norm": False,
    "scoring_func": "sqrtsoftplus",
    "hidden_act": "silu",
    "model_type": "deepseek_v41",
}

#: SGLang checks the dtype and the decode backend itself; the config values above are checked
#: by `config_disable_reasons` (one reason naming the checkpoint to serve), not by
#: `Requirements.hf_config` too, so that each mismatch is reported once.
REQUIREMENTS = Requirements(
    dtypes=frozenset({"bfloat16"}),
    attention_backends=_r.ATTENTION_BACKENDS,
)

#: SGLang's refused-by-default features: all accepted here, so SGLang does not refuse them in
#: its generic words; `config_disable_reasons` refuses each one the reference does not cover
#: (refusals.FEATURES) naming the flag to drop, and accepts speculative decoding (DSpark).
FEATURES = frozenset(Feature[n] for n in (*_r.FEATURES, *_r.ACCEPTED_FEATURES) if n in Feature.__members__)

#: Check-mode bounds `<launch>.<output>.<metric>`. No kernel exists yet: the stream bounds are
#: the GLM-5.3 kernel's measured-and-kept ones carried over (cosine 0.999, rel 0.05); the
#: cache rows a launch writes are quantized (V4 rows: one e4m3 step of a flipped rounding is
#: 1/16 of a tile's scale; the fp4 index keys one e2m1 step, 1/3 of the largest at worst),
#: the compress state rows are fp32 projections whose GEMM order may move a bf16-input
#: product's last bits (rel 2**-10). The first kernel run on the H200 must confirm or tighten them.
NUMERICS = Numerics(
    kind=NumericsKind.TOLERANCE,
    bounds={
        "attn.streams.cosine": 0.999,
        "attn.streams.rel": 0.05,
        "attn.swa_kv.cosine": 0.9999,
        "attn.swa_kv.rel": 0.07,
        "attn.compressed_kv.cosine": 0.9999,
        "attn.compressed_kv.rel": 0.07,
        "attn.index_k.cosine": 0.999,
        "attn.index_k.rel": 0.34,
        "attn.state.rel": 2**-10,
        "moe.streams.cosine": 0.999,
        "moe.streams.rel": 0.05,
    },
)


def config_disable_reasons(cfg: Any, hf_config: Any) -> list[str]:
    """Before load, in the launcher: every reason this server is refused, at once."""
    return _r.config_reasons(cfg, hf_config, widths_by_tp=merge_widths_by_tp(WIDTHS_BY_TP), hf_values=HF_CONFIG)


def model_disable_reasons(model: Any, hf_config: Any, copies: dict) -> list[str]:
    """After load, on every rank: every reason the loaded model is refused, at once."""
    return _r.model_reasons(model, hf_config, copies)


def tokens_per_request(model: Any) -> int:
    """Rows a request brings to a routed step: 1, or DSpark's verify block (gamma + 1)."""
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    if spec.speculative_algorithm is None:
        return 1
    return int(spec.speculative_num_draft_tokens or 1)


def build(model: Any, hf_config: Any, context: Any) -> Any:
    """No kernel yet: SGLang only reaches this if every refusal was bypassed."""
    raise NotImplementedError(
        "mono-deepseek-v41 ships no DeepSeek-V4.1 layer kernel yet: serve without --enable-amd-monokernel"
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
    tokens_per_request=tokens_per_request,
)

__all__ = ["ARCHITECTURE", "FEATURES", "HF_CONFIG", "NUMERICS", "SPEC", "SPEC_PATH", "WIDTHS", "WIDTHS_BY_TP"]
