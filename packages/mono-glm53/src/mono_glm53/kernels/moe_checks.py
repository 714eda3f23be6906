"""The layer kernel's MoE checked one stage at a time, each given the kernel's OWN input to it.

`moe_stages(k, w, s, n) -> (metrics, out)` reads the kernel's MoE scratch after a launch (the
layouts of `mono_common.stages.moe`: quantised h2 `h2q`/`h2s` [W, H], gate_up partials `gu`
[NSLOT, KSG, W, 2I], the quantised SiLU output `inter`/`inters` [NSLOT, W, I], the slot tables
`slot_e`/`slot_w`/`nslot`) and recomputes on the CPU, for the first n rows and every slot in use:
  * moe_gateup_given_h2.rel_l2_max: the kernel's gate_up (its partials summed in slot order, to
    bf16) against the exact FP8 GEMM of its own quantised h2, the worst (slot, row);
  * moe_inter_given_gateup.codes_equal_min / scales_equal_min: SiLU-and-mul and the per-128
    requantisation of the kernel's own gate_up, against its `inter` codes and `inters` scales;
  * `out` [n, H] bf16 on k's device: this rank's MoE partial from the kernel's own `inter`
    (exact down GEMM per slot, bf16; bf16(y * weight) summed over the routed slots in slot order,
    x routed_scaling, + the shared slot), which the caller compares with the kernel's output
    (moe_down_given_inter.rel_l2_max; after the all-reduce where R > 1).
Why per stage: a rounding flip of one bf16 gate_up value can move the per-128 scale of its
group (when it is the group's absmax), which requantises the whole group; that one group of one
slot moved the MoE output of a row by 0.004 relative at TP1 width 8 (H200, session 12), as much
as a 1 % weight-scale error does end to end. Given their own inputs the stages carry only fp32
summation-order noise, so a 1 % error in any weight scale stands out several times over.
"""

from __future__ import annotations

import torch

from mono_common.ref.fp8 import fp8_block_linear, fp8_gemm_backend, per_token_group_quant
from mono_common.ref.moe import silu_and_mul
from mono_glm53.config import GlmLayerShape

__all__ = ["moe_stages"]

BF16 = torch.bfloat16
_E4M3 = torch.float8_e4m3fn


def _rel_l2_rows(a: torch.Tensor, b: torch.Tensor) -> float:
    """The worst row's ||a - b|| / ||b|| over the leading dimension."""
    a, b = a.double().flatten(1), b.double().flatten(1)
    return float(((a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)).max())


def _slot_weights(w: dict, cpu: dict, e: int):
    """(w13, s13, w2, s2) of slot expert e (-1: the shared expert), on the CPU."""
    if e < 0:
        p = "mlp.shared_experts."
        return (cpu[p + "gate_up_proj.weight"], cpu[p + "gate_up_proj.weight_scale_inv"],
                cpu[p + "down_proj.weight"], cpu[p + "down_proj.weight_scale_inv"])
    p = "mlp.experts."
    return (cpu[p + "w13_weight"][e], cpu[p + "w13_weight_scale_inv"][e],
            cpu[p + "w2_weight"][e], cpu[p + "w2_weight_scale_inv"][e])


def _e4m3(t: torch.Tensor) -> torch.Tensor:
    return t.view(_E4M3) if t.dtype == torch.uint8 else t.to(_E4M3)


def moe_stages(k, w: dict, s: GlmLayerShape, n: int, cpu_weights: dict) -> tuple[dict[str, float], torch.Tensor]:
    """The per-stage MoE metrics of kernel `k` over its first n rows and this rank's MoE
    partial recomputed from the kernel's own `inter` (module docstring). `cpu_weights`: the
    `mlp.*` weights of `w` on the CPU (the caller's cached copy)."""
    blk = s.block
    ns = int(k.nslot.item())
    slot_e = k.slot_e[:ns].cpu().tolist()
    slot_w = k.slot_w[:n, :ns].float().cpu()
    # Plan.MF16 (the knob moe_f16): the quantised inputs are f16 bits in the bf16 buffers
    h2q_t, inter_t = (k.h2q.view(torch.float16), k.inter.view(torch.float16)) if k.plan.MF16 else (k.h2q, k.inter)
    h2q, h2s = _e4m3(h2q_t[:n].cpu()), k.h2s[:n].float().cpu()
    gu = k.gu[:ns, :, :n].float().cpu()
    inter, inters = inter_t[:ns, :n].to(torch.bfloat16).cpu(), k.inters[:ns, :n].float().cpu()
    gate_rel, codes_eq, scales_eq = 0.0, [], []
    shared = torch.zeros(n, s.hidden, dtype=torch.float32)
    routed = torch.zeros(n, s.hidden, dtype=torch.float32)
    with fp8_gemm_backend("exact"):
        for u in range(ns):
            w13, s13, w2, s2 = _slot_weights(w, cpu_weights, -1 if u == 0 else int(slot_e[u]))
            # gate_up: the kernel's split-K partials summed in its order, one rounding
            acc = torch.zeros_like(gu[u, 0])
            for ks in range(gu.shape[1]):
                acc = acc + gu[u, ks]
            g_k = acc.to(BF16)
            g_r = fp8_block_linear(h2q.to(BF16), _e4m3(w13), s13, blk, pre_quant=(h2q, h2s))
            gate_rel = max(gate_rel, _rel_l2_rows(g_k, g_r))
            # SiLU-and-mul and the requantisation, given the kernel's own gate_up
            q, qs = per_token_group_quant(silu_and_mul(g_k), blk)
            codes_eq.append(float((q.float() == inter[u].float()).float().mean()))
            scales_eq.append(float((qs == inters[u]).float().mean()))
            # down, given the kernel's own quantised SiLU output
            y = fp8_block_linear(inter[u], _e4m3(w2), s2, blk, pre_quant=(_e4m3(inter[u]), inters[u]))
            if u == 0:
                shared = y.float()
            else:
                wr = slot_w[:, u]
                routed = routed + torch.where((wr != 0)[:, None], (y.float() * wr[:, None]).to(BF16).float(), 0.0)
    out = ((routed * s.routed_scaling).to(BF16).float() + shared).to(BF16)
    m = {
        "glm53_layer.moe_gateup_given_h2.rel_l2_max": gate_rel,
        "glm53_layer.moe_inter_given_gateup.codes_equal_min": min(codes_eq),
        "glm53_layer.moe_inter_given_gateup.scales_equal_min": min(scales_eq),
    }
    return m, out.to(k.out.device)
