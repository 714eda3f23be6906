"""After-load refusals: GLM-5.3-Flash's spec reading a loaded model's weights.

SGLang calls `SPEC.model_disable_reasons(model, hf_config, copies)` on every rank after load.
No GLM-5.3-Flash model can be built on this CPU (its layers need CUDA kernels), so the model
here is a stand-in with the module and parameter names SGLang's `Glm5NextForConditionalGeneration`
has, holding the weights `mono_glm53_flash.weights` builds in SGLang's post-load layouts, at a
tiny config of the same structure (7 layers: 3 dense, sparse-attention 3, KDA 4 and 5, last 6).
"""

from __future__ import annotations

import types

import pytest
import torch
from sglang.srt.configs.glm5_next import Glm5NextConfig

from mono_glm53_flash import ARCHITECTURE
from mono_glm53_flash import refusals as _r
from mono_glm53_flash import weights as Wt
from mono_glm53_flash.config import tiny
from mono_glm53_flash.spec import SPEC

S = tiny()
TEXT = dict(
    hidden_size=S.hidden, num_hidden_layers=7, first_k_dense_replace=3, num_attention_heads=S.heads,
    q_lora_rank=S.q_lora, kv_lora_rank=S.kv_lora, qk_nope_head_dim=S.qk_nope, qk_rope_head_dim=0,
    v_head_dim=S.v_head, n_routed_experts=S.n_experts, num_experts_per_tok=S.top_k,
    moe_intermediate_size=S.moe_inter, linear_num_heads=S.kda_heads, linear_head_dim=S.kda_head_dim,
    index_n_heads=S.index_heads, index_head_dim=S.index_head_dim, index_topk=S.index_topk, index_kpool=4,
    mhc=True, swiglu_limit=10.0,
)

# the tiny config's FP8 block (the real checkpoint's is 128)
QUANT = {"quant_method": "fp8", "weight_block_size": [S.block, S.block], "routed_experts_quant_method": "mxfp4"}


def _module(name: str, **attrs):
    return type(name, (types.SimpleNamespace,), {})(**attrs)


def _linear(w: dict, key: str):
    return _module("Linear", weight=w[f"{key}.weight"], weight_scale_inv=w.get(f"{key}.weight_scale_inv"))


def _moe(w: dict, fused_shared: bool = False):
    experts = _module(
        "FusedMoE",
        w13_weight=w["mlp.experts.w13_weight"],
        w13_weight_scale_inv=w["mlp.experts.w13_weight_scale_inv"],
        w2_weight=w["mlp.experts.w2_weight"],
        w2_weight_scale_inv=w["mlp.experts.w2_weight_scale_inv"],
    )
    shared = _module(
        "DeepseekV2MLP",
        gate_up_proj=_linear(w, "mlp.shared_experts.gate_up_proj"),
        down_proj=_linear(w, "mlp.shared_experts.down_proj"),
    )
    gate = _module("MoEGate", weight=w["mlp.gate.weight"], e_score_correction_bias=w["mlp.gate.e_score_correction_bias"])
    return _module("DeepseekV2MoE", experts=experts, shared_experts=None if fused_shared else shared, gate=gate,
                   num_fused_shared_experts=1 if fused_shared else 0)


def _kda(w: dict):
    a = "self_attn"
    conv = _module("MergedColumnParallelLinear", weight=w[f"{a}.qkv_conv1d.weight"])
    return _module(
        "Glm5NextLinearAttention", do_fuse_qkvbfg=False, qkv_proj=_linear(w, f"{a}.qkv_proj"),
        o_proj=_linear(w, f"{a}.o_proj"), dt_bias=w[f"{a}.dt_bias"], A_log=w[f"{a}.A_log"], qkv_conv1d=conv,
    )


def _mla(w: dict):
    a = "self_attn"
    ix = f"{a}.indexer"
    indexer = _module(
        "IndexerKPool", wq_b=_linear(w, f"{ix}.wq_b"), wk=_linear(w, f"{ix}.wk"),
        weights_proj=_module("ReplicatedLinear", weight=w[f"{ix}.weights_proj.weight"]),
        k_norm=_module("LayerNorm", weight=w[f"{ix}.k_norm.weight"], bias=w[f"{ix}.k_norm.bias"]),
        index_kpool_compress_ape=w[f"{ix}.index_kpool_compress_ape"],
        index_kpool_compress_gate=w[f"{ix}.index_kpool_compress_gate"],
    )
    return _module(
        "DeepseekV2AttentionMLA", fused_qkv_a_proj_with_mqa=_linear(w, f"{a}.fused_qkv_a_proj_with_mqa"),
        q_b_proj=_linear(w, f"{a}.q_b_proj"), o_proj=_linear(w, f"{a}.o_proj"), w_kc=w[f"{a}.w_kc"],
        w_vc=w[f"{a}.w_vc"], indexer=indexer,
    )


@pytest.fixture(scope="module")
def layer_weights():
    return {kind: Wt.make_weights(S, kind, seed=i) for i, kind in enumerate(("kda", "mla"))}


def model_of(layer_weights, rocm=False, edit=None):
    layers = []
    for i in range(7):
        kind = "mla" if i == 3 else "kda"
        w = dict(layer_weights[kind])
        if rocm:
            w = Wt.rocm_layout(w)
            for k in Wt.MXFP4_WEIGHTS:
                w[k].is_shuffled = True  # what SGLang's AITER post-load marks
        if edit is not None:
            w = edit(i, w)
        attn = _mla(w) if kind == "mla" else _kda(w)
        layers.append(_module("Glm5NextDecoderLayer", self_attn=attn, mlp=_moe(w)))
    return _module("Glm5NextForConditionalGeneration", model=_module("Glm5NextModel", layers=layers))


@pytest.fixture
def hf():
    return Glm5NextConfig(text_config=TEXT, architectures=[ARCHITECTURE], quantization_config=QUANT)


@pytest.fixture(autouse=True)
def no_kernel_reason(monkeypatch):
    monkeypatch.setattr(_r, "kernel_reasons", lambda: [])


def test_the_layouts_weights_builds_are_accepted_on_both_isas(layer_weights, hf):
    assert SPEC.model_disable_reasons(model_of(layer_weights), hf, {}) == []  # outside a server: CUDA, TP1
    assert _r.model_reasons(model_of(layer_weights), hf, {}, isa="sm_90") == []
    assert _r.model_reasons(model_of(layer_weights, rocm=True), hf, {}, isa="gfx950") == []


def test_each_isa_refuses_the_other_isas_expert_layout(layer_weights, hf):
    cuda_on_rocm = _r.model_reasons(model_of(layer_weights), hf, {}, isa="gfx950")
    assert any("experts.w13_weight is torch.int8" in r and "--moe-runner-backend aiter" in r for r in cuda_on_rocm)
    rocm_on_cuda = _r.model_reasons(model_of(layer_weights, rocm=True), hf, {}, isa="sm_90")
    assert any("experts.w13_weight_scale_inv is torch.float8_e8m0fnu" in r for r in rocm_on_cuda)


def _with(key, value):
    def edit(i, w):
        w = dict(w)
        if key in w:
            w[key] = value(w[key]) if callable(value) else value
        return w

    return edit


def test_a_bf16_shared_expert_is_refused_with_the_fix(layer_weights, hf):
    model = model_of(layer_weights, edit=_with("mlp.shared_experts.gate_up_proj.weight", lambda t: t.float().bfloat16()))
    reasons = _r.model_reasons(model, hf, {})
    hit = [r for r in reasons if "shared_experts is bf16" in r]
    assert hit and "FP8 block-128 shared expert" in hit[0] and "serve the FP8/MXFP4 checkpoint" in hit[0]


def test_deepgemm_ue8m0_expert_scales_are_refused(layer_weights, hf):
    def edit(i, w):
        s = w["mlp.experts.w2_weight_scale_inv"].clone()
        s.format_ue8m0 = True
        return {**w, "mlp.experts.w2_weight_scale_inv": s}

    reasons = _r.model_reasons(model_of(layer_weights, edit=edit), hf, {})
    assert any("w2_weight_scale_inv was transformed for DeepGEMM" in r for r in reasons)


def test_unshuffled_rocm_experts_are_refused(layer_weights, hf):
    def edit(i, w):
        return {**w, "mlp.experts.w13_weight": w["mlp.experts.w13_weight"].clone()}  # a clone loses is_shuffled

    reasons = _r.model_reasons(model_of(layer_weights, rocm=True, edit=edit), hf, {}, isa="gfx950")
    assert any("experts.w13_weight is not AITER-shuffled" in r for r in reasons)


def test_a_fused_shared_expert_is_read_as_expert_288(layer_weights, hf):
    model = model_of(layer_weights)
    for layer in model.model.layers:
        layer.mlp.num_fused_shared_experts, layer.mlp.shared_experts = 1, None
    reasons = _r.model_reasons(model, hf, {})
    # with one fused expert the routed tensors must hold E + 1 experts
    assert any(f"not torch.int8 ({S.n_experts + 1}," in r for r in reasons)


def test_wrong_indexer_and_unquantized_kda_projections_are_refused(layer_weights, hf):
    model = model_of(layer_weights)
    model.model.layers[3].self_attn.indexer = _module("Indexer")
    model.model.layers[4].self_attn.do_fuse_qkvbfg = True
    reasons = _r.model_reasons(model, hf, {})
    assert any("layer 3.self_attn.indexer is Indexer" in r and "index_kpool 4" in r for r in reasons)
    assert any("layer 4.self_attn holds unquantized q/k/v projections" in r for r in reasons)


def test_another_architecture_and_a_pipeline_stage_are_refused(layer_weights, hf):
    other = Glm5NextConfig(text_config=TEXT, architectures=["GlmMoeDsaForCausalLM"], quantization_config=QUANT)
    assert "serves GLM-5.3-Flash only" in _r.model_reasons(model_of(layer_weights), other, {})[-1]
    model = model_of(layer_weights)
    model.model.layers = model.model.layers[:4]
    assert "no pipeline parallelism" in _r.model_reasons(model, hf, {})[-1]


def test_the_no_kernel_reason_comes_after_load_too(layer_weights, hf, monkeypatch):
    monkeypatch.undo()
    reasons = SPEC.model_disable_reasons(model_of(layer_weights), hf, {})
    assert len(reasons) == 1 and "ships no GLM-5.3-Flash layer kernel yet" in reasons[0]
    with pytest.raises(NotImplementedError, match="no GLM-5.3-Flash layer kernel"):
        SPEC.build(None, hf, None)


def test_fp8_weights_dtype_fix_is_named(layer_weights, hf):
    model = model_of(layer_weights, edit=_with("self_attn.o_proj.weight", lambda t: t.float().to(torch.float8_e5m2)))
    reasons = _r.model_reasons(model, hf, {})
    assert any("self_attn.o_proj.weight is torch.float8_e5m2" in r and "--fp8-gemm-backend" in r for r in reasons)
