"""A tiny GLM-5.3-shaped model with SGLang's module tree, for the install/forward/check tests.

Not SGLang's model (SGLang's DeepseekV2 layers cannot be built or run on a CPU,
reference/models.md section 4): it holds what mono reads of one, under SGLang's names:
`model.model.embed_tokens/layers/norm`, `model.lm_head`, `model.logits_processor`; each
covered layer's `self_attn` (FP8 `fused_qkv_a_proj_with_mqa`, `q_b_proj`, `o_proj` with
`weight_scale_inv`, bf16 `w_kc`/`w_vc`, `rotary_emb.cos_sin_cache`, an `Indexer`) and `mlp`
(`gate`, `experts.w13/w2_weight(+_scale_inv)` with the shared expert fused as expert E,
`num_fused_shared_experts` 1). Weights come from `mono_glm53.weights.make_weights`
(random, never zero). The dense layers 0..2 follow SGLang's residual-stream protocol
(`stream.input` / `write` / `record(PLAIN_ADD)`), so the forward exports them with
SGLang's own `residual_batch.to_pp`. A covered layer's `forward` (used by the check
mode as "SGLang's layer") is the torch reference on the same protocol.

`reference_forward` computes the whole step without mono: the same dense math, then
`mono_glm53.reference.decoder_layer` per covered layer on its own copy of the caches.
It imports as a test module (no tests in it); other test files load it by path.
"""

from __future__ import annotations

import types

import torch
from sglang.srt.layers.layer_boundary.residual import batch as residual_batch
from sglang.srt.layers.layer_boundary.residual.add_norm import PLAIN_ADD
from torch import nn

from mono_common.ref.fp8 import FP8_DTYPE
from mono_common.ref.rope import rope_cos_sin
from mono_glm53 import reference as ref
from mono_glm53.config import tiny
from mono_glm53.weights import make_caches, make_weights

BF16 = torch.bfloat16
N_LAYERS = 5  # dense 0..2, covered 3..4
VOCAB = 64
CONTEXT = 100


def tiny_shape():
    return tiny(page=64)  # SGLang's DSA page (build uses 64, as the kernel does)


def tiny_hf_config(s=None, n_layers=N_LAYERS):
    s = s or tiny_shape()
    return types.SimpleNamespace(
        architectures=["GlmMoeDsaForCausalLM"],
        num_hidden_layers=n_layers,
        first_k_dense_replace=3,
        hidden_size=s.hidden,
        num_attention_heads=s.heads,
        q_lora_rank=s.q_lora,
        kv_lora_rank=s.kv_lora,
        qk_nope_head_dim=s.qk_nope,
        qk_rope_head_dim=s.qk_rope,
        v_head_dim=s.v_head,
        n_routed_experts=s.n_experts,
        n_shared_experts=s.n_shared,
        num_experts_per_tok=s.top_k,
        moe_intermediate_size=s.moe_inter,
        index_n_heads=s.index_heads,
        index_head_dim=s.index_head_dim,
        index_topk=s.index_topk,
        routed_scaling_factor=s.routed_scaling,
        rms_norm_eps=s.rms_eps,
        max_position_embeddings=s.max_position,
        quantization_config={"quant_method": "fp8", "weight_block_size": [s.block, s.block]},
    )


class Box(nn.Module):
    """A container module holding parameters/tensors under SGLang's attribute names."""


class Indexer(Box):  # the class name model_disable_reasons checks
    pass


class RotaryEmbedding:
    def __init__(self, s):
        pos = torch.arange(s.max_position)
        cos, sin = rope_cos_sin(pos, s.qk_rope, s.rope_theta)
        self.cos_sin_cache = torch.cat((cos, sin), -1).float()


def _put(root: nn.Module, dotted: str, tensor: torch.Tensor, factory=Box):
    *path, leaf = dotted.split(".")
    mod = root
    for name in path:
        if not hasattr(mod, name) or getattr(mod, name) is None:
            mod.add_module(name, (Indexer if name == "indexer" else factory)())
        mod = getattr(mod, name)
    if tensor.is_floating_point() or tensor.dtype == FP8_DTYPE:
        mod.register_parameter(leaf, nn.Parameter(tensor, requires_grad=False))
    else:
        setattr(mod, leaf, tensor)


class RMSNorm(nn.Module):
    def __init__(self, weight, eps):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x, residual=None):
        return ref.rms_norm(x, self.weight, self.eps, residual)


class DenseLayer(nn.Module):
    """A dense layer on SGLang's residual-stream protocol: y = W2 silu(W1 norm(x))."""

    def __init__(self, s, g):
        super().__init__()
        h = s.hidden
        self.norm = RMSNorm((1 + 0.1 * torch.randn(h, generator=g)).to(BF16), s.rms_eps)
        self.w1 = (torch.randn(2 * h, h, generator=g) * h**-0.5).to(BF16)
        self.w2 = (torch.randn(h, h, generator=g) * h**-0.5).to(BF16)

    def math(self, x):
        y = self.norm(x)
        return ref.silu_and_mul(y @ self.w1.T) @ self.w2.T

    def forward(self, positions, hidden, forward_batch, *args, prev_topk_indices=None, **kw):
        stream = residual_batch.stream_of(forward_batch)
        value, residual = stream.input(hidden)
        x = value if residual is None else (value.float() + residual.float()).to(BF16)
        stream.write(x)
        return stream.record(self.math(x), PLAIN_ADD), None


def fuse_shared(w, s):
    """SGLang's shared-experts fusion: the shared expert becomes routed expert index E."""
    fused = dict(w)
    for name, shared in (("w13_weight", "gate_up_proj"), ("w2_weight", "down_proj")):
        fused[f"mlp.experts.{name}"] = torch.cat(
            (w[f"mlp.experts.{name}"], w[f"mlp.shared_experts.{shared}.weight"][None]), 0
        )
        fused[f"mlp.experts.{name}_scale_inv"] = torch.cat(
            (w[f"mlp.experts.{name}_scale_inv"], w[f"mlp.shared_experts.{shared}.weight_scale_inv"][None]), 0
        )
    return {k: v for k, v in fused.items() if not k.startswith("mlp.shared_experts.")}


class CoveredLayer(nn.Module):
    """A covered layer: SGLang's parameter names; forward = the reference on SGLang's protocol
    (what the check mode calls "SGLang's layer" here)."""

    def __init__(self, s, w, layer_id):
        super().__init__()
        self.shape, self.layer_id, self.w = s, layer_id, w
        fused = fuse_shared(w, s)
        for key, t in fused.items():
            if key in ("self_attn.w_kc", "self_attn.w_vc"):
                continue
            _put(self, key, t)
        self.self_attn.w_kc = w["self_attn.w_kc"]
        self.self_attn.w_vc = w["self_attn.w_vc"]
        self.self_attn.num_local_heads = s.heads_per_rank
        self.self_attn.rotary_emb = RotaryEmbedding(s)
        self.mlp.num_fused_shared_experts = s.n_shared
        self.mlp.shared_experts = None

    def forward(self, positions, hidden, forward_batch, *args, prev_topk_indices=None, **kw):
        stream = residual_batch.stream_of(forward_batch)
        value, residual = stream.input(hidden)
        inputs = decode_inputs(positions, forward_batch)
        pool = forward_batch.token_to_kv_pool
        caches = ref.LayerCaches(
            kv=pool.get_key_buffer(self.layer_id),
            index_k=pool.get_index_k_with_scale_buffer(self.layer_id),
        )
        out = ref.decoder_layer(value, residual, inputs, caches, self.w, self.shape, prev_topk=prev_topk_indices)
        stream.write(out.residual)
        return stream.record(out.hidden, PLAIN_ADD), out.topk


class Pool:
    """`DSATokenToKVPool`'s two accessors the forward reads, over per-layer tensors."""

    def __init__(self, kv, index_k):
        self.kv, self.index_k = kv, index_k

    def get_key_buffer(self, layer_id):
        return self.kv[layer_id]

    def get_index_k_with_scale_buffer(self, layer_id):
        return self.index_k[layer_id]

    def clone(self):
        return Pool({k: v.clone() for k, v in self.kv.items()}, {k: v.clone() for k, v in self.index_k.items()})


class TinyGlm(nn.Module):
    def __init__(self, s=None, n_layers=N_LAYERS, batch=2, seed=0):
        super().__init__()
        s = s or tiny_shape()
        self.shape = s
        self.config = tiny_hf_config(s, n_layers)
        g = torch.Generator().manual_seed(seed)
        inputs, _ = make_caches(s, batch, CONTEXT, seed=seed)
        self.inputs = inputs
        kv, ik = {}, {}
        for i in range(3, n_layers):
            _, c = make_caches(s, batch, CONTEXT, seed=seed + 100 + i)
            kv[i], ik[i] = c.kv, c.index_k
        self.pool = Pool(kv, ik)
        inner = Box()
        inner.embed_tokens = nn.Embedding(VOCAB, s.hidden).to(BF16)
        with torch.no_grad():
            inner.embed_tokens.weight.copy_(torch.randn(VOCAB, s.hidden, generator=g).to(BF16))
        layers = [DenseLayer(s, g) for _ in range(3)]
        self.layer_weights = {}
        for i in range(3, n_layers):
            w = make_weights(s, seed=seed + i)
            self.layer_weights[i] = w
            layers.append(CoveredLayer(s, w, i))
        inner.layers = nn.ModuleList(layers)
        inner.next_full_attention_layer_id = {i: i + 1 for i in range(n_layers - 1)}
        inner.norm = RMSNorm((1 + 0.1 * torch.randn(s.hidden, generator=g)).to(BF16), s.rms_eps)
        self.model = inner
        self.lm_head = Box()
        self.lm_head.weight = nn.Parameter(torch.randn(VOCAB, s.hidden, generator=g).to(BF16), requires_grad=False)

    def logits_processor(self, input_ids, hidden, lm_head, forward_batch, aux=None):
        return hidden.float() @ lm_head.weight.float().T

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None):
        return "the model's own forward"


class Mode:
    def __init__(self, name):
        self.name = name

    def is_decode(self):
        return self.name == "decode"

    def is_target_verify(self):
        return self.name == "target_verify"

    def is_idle(self):
        return False


def forward_batch(model: TinyGlm, rows=None, mode="decode", pool=None):
    inp = model.inputs
    rows = rows or inp.positions.shape[0]
    input_ids = (torch.arange(rows) * 7 + 3) % VOCAB
    fb = types.SimpleNamespace(
        forward_mode=Mode(mode),
        batch_size=rows,
        input_ids=input_ids,
        out_cache_loc=inp.out_cache_loc[:rows],
        seq_lens=inp.seq_lens[:rows],
        req_pool_indices=inp.req_pool_indices[:rows],
        req_to_token_pool=types.SimpleNamespace(req_to_token=inp.req_to_token),
        token_to_kv_pool=pool or model.pool,
        residual_stream=None,
    )
    return input_ids, inp.positions[:rows], fb


def patch_pools(monkeypatch):
    """SGLang's forward context (get_token_to_kv_pool / get_req_to_token_pool) is set by the
    model runner; here the fake forward batch carries the pools, and the two accessors of
    mono_glm53.forward read them from it."""
    from mono_glm53 import forward as fwd

    monkeypatch.setattr(fwd, "token_to_kv_pool", lambda fb: fb.token_to_kv_pool)
    monkeypatch.setattr(fwd, "page_table", lambda fb: fb.req_to_token_pool.req_to_token)


def decode_inputs(positions, fb):
    rtt = fb.req_to_token_pool.req_to_token
    return ref.DecodeInputs(
        positions=positions,
        seq_lens=fb.seq_lens,
        req_pool_indices=fb.req_pool_indices,
        out_cache_loc=fb.out_cache_loc,
        req_to_token=rtt,
        max_seq_len=int(rtt.shape[1]),
    )


def reference_forward(model: TinyGlm, input_ids, positions, fb, pool: Pool, layer_fn=None):
    """The step without mono's forward: dense math, `layer_fn` (default
    reference.decoder_layer) per covered layer on `pool`, norm, logits."""
    inner = model.model
    x = inner.embed_tokens(input_ids)
    y = None
    for i in range(3):
        if y is not None:
            x = (y.float() + x.float()).to(BF16)
        y = inner.layers[i].math(x)
    hidden, residual, topk = y, x, None
    inputs = decode_inputs(positions, fb)
    for i in range(3, len(inner.layers)):
        caches = ref.LayerCaches(kv=pool.kv[i], index_k=pool.index_k[i])
        if layer_fn is None:
            out = ref.decoder_layer(hidden, residual, inputs, caches, model.layer_weights[i], model.shape, prev_topk=topk)
            hidden, residual, topk = out.hidden, out.residual, out.topk
        else:
            hidden, residual, topk = layer_fn(i, hidden, residual, inputs, caches, topk)
    normed, _ = inner.norm(hidden, residual)
    return model.logits_processor(input_ids, normed, model.lm_head, fb)


def kernel_forward_check():
    """Run the forward with `build.KernelLayer` (staged) on a 4-layer tiny model, and the same
    step with `GlmLayerKernel` launched directly per covered layer (no mono forward); return
    (bitwise equal logits and caches, the NUMERICS violations of the kernel step against the
    torch reference step: the covered layer's output and residual as the stream, its KV rows and
    index keys). Call with TRITON_INTERPRET=1 set before Triton kernels exist."""
    import os

    from sglang.kernels.plugin_kernels.amd.spec import BuildContext, Plan, ShapeKey

    from mono_common.check import compare
    from mono_glm53 import build as build_mod
    from mono_glm53 import forward as fwd
    from mono_glm53.check import dequant_index_keys
    from mono_glm53.kernels.layer import GlmLayerKernel
    from mono_glm53.spec import NUMERICS

    os.environ["MONO_GLM53_LAYER"] = "kernel"
    os.environ["MONO_GLM53_KERNEL_MODE"] = "staged"
    fwd.token_to_kv_pool = lambda fb: fb.token_to_kv_pool
    fwd.page_table = lambda fb: fb.req_to_token_pool.req_to_token
    # 8 index heads: with tiny()'s 2, index scores tie at exactly 0 and the top-k boundary
    # is a tie that the kernel and torch.topk break differently (see tests/interp)
    # two covered layers (3, 4): the forward's one kernel object per width serves both
    model = TinyGlm(s=tiny(page=64, index_heads=8), n_layers=5)
    ctx = BuildContext(isa="sm_90", widths=(2,), deadline_s=60.0, copies={})
    built = build_mod.build(model, model.config, ctx, shape=model.shape)
    assert isinstance(built._forward.launcher, build_mod.KernelLayer)
    pool_k, pool_d, pool_r = model.pool.clone(), model.pool.clone(), model.pool.clone()
    ids, pos, fb = forward_batch(model, pool=pool_k)
    plan = Plan(key=ShapeKey(forward_mode="decode", batch_size=2, tokens_per_request=1))
    logits = built.forward(plan, ids, pos, fb)

    seen_k, seen_r = {}, {}

    def direct(i, hidden, residual, inputs, caches, topk):
        k = GlmLayerKernel(model.shape, model.layer_weights[i], width=2, max_seq_len=inputs.max_seq_len)
        k.set_inputs(hidden, residual, inputs)
        out = k.launch(caches, mode="staged")
        seen_k[i] = (out[0].clone(), out[1].clone())
        return out

    def reference(i, hidden, residual, inputs, caches, topk):
        out = ref.decoder_layer(hidden, residual, inputs, caches, model.layer_weights[i], model.shape, prev_topk=topk)
        seen_r[i] = (out.hidden, out.residual)
        return out.hidden, out.residual, out.topk

    _, _, fb_d = forward_batch(model, pool=pool_d)
    direct_logits = reference_forward(model, ids, pos, fb_d, pool_d, layer_fn=direct)
    same = torch.equal(logits, direct_logits) and all(
        torch.equal(pool_k.kv[i], pool_d.kv[i]) and torch.equal(pool_k.index_k[i], pool_d.index_k[i]) for i in (3, 4)
    )
    _, _, fb_r = forward_batch(model, pool=pool_r)
    reference_forward(model, ids, pos, fb_r, pool_r, layer_fn=reference)
    loc = fb.out_cache_loc
    d = model.shape.index_head_dim
    # the covered layer's output stream (the forward's equals the direct launch's: same logits)
    # layer 3 runs on the same input as the reference's; layer 4's input already carries
    # layer 3's difference, so layer 4 is held to the direct launches (bitwise, above) only
    found = compare("layer", "stream", seen_k[3][0].float(), seen_r[3][0].float(), NUMERICS.bounds)
    found += compare("layer", "stream", seen_k[3][1].float(), seen_r[3][1].float(), NUMERICS.bounds)
    found += compare("layer", "kv", pool_k.kv[3][loc].float(), pool_r.kv[3][loc].float(), NUMERICS.bounds)
    found += compare(
        "layer", "index_k", dequant_index_keys(pool_k.index_k[3], loc, d),
        dequant_index_keys(pool_r.index_k[3], loc, d), NUMERICS.bounds,
    )
    return same, [v.describe() for v in found]
