"""The library stages on a GPU at GLM-5.3's shapes, against their references (correctness only:
timing is `mono bench stages`)."""

import pytest

torch = pytest.importorskip("torch")

SHAPES = [(2624, 6144), (6144, 2048), (4096, 2048), (2048, 2048)]
PLANS = [dict(bn=128, span=True, dot=2), dict(bn=256, span=True, dot=2, num_warps=8), dict(bn=64, span=False)]
# relative error bound vs the fp64 reference: fp32 accumulation of exact products is ~1e-7; the
# e4m3 MMA (dot=2) accumulates inside each 128-wide block with fewer bits than fp32 on sm_90
# (DeepGEMM promotes to fp32 per block for this reason), so its bound is looser
BOUND = {0: 1e-6, 1: 1e-6, 2: 1e-3}


def _nprog():
    return 2 * torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("rows", [1, 2, 8])
@pytest.mark.parametrize("kw", PLANS, ids=["s128f", "s256f", "k64"])
def test_fp8_gemv_on_gpu(shape, rows, kw):
    from mono_common.ref.gemv import block_fp8_gemv
    from mono_common.stages.gemv_host import GemvPlan, run_gemv

    n, k = shape
    g = torch.Generator(device="cuda").manual_seed(rows)
    w = (torch.randn(2, n, k, generator=g, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(2, -(-n // 128), k // 128, generator=g, device="cuda") * 1e-3 + 1e-4
    x = torch.randn(rows, k, generator=g, device="cuda").to(torch.bfloat16)
    plan = GemvPlan.make(n, k, rows, _nprog(), **kw)
    got = run_gemv(plan, x, w.view(torch.uint8), s)
    for li in range(2):
        ref = block_fp8_gemv(x.cpu(), w[li].cpu(), s[li].cpu()).double()
        rel = ((got[li].double().cpu() - ref).norm() / ref.norm()).item()
        print(f"rel_err {n}x{k} rows {rows} {kw}: {rel:.3e}")
        assert rel < BOUND[kw.get("dot", 0)], (li, rel)


def _same_partials_as_plain(n, k, rows, sets, seed, x_scale=None, **change):
    """Whether a 128-column span plan with `change` writes the plain plan's partials bit for bit
    over `sets` random weight sets (x times x_scale [k] where given)."""
    import dataclasses

    from mono_common.stages.gemv_host import GemvPlan, alloc_out, launch_gemv

    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(sets, n, k, generator=g, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(sets, -(-n // 128), k // 128, generator=g, device="cuda") * 1e-3 + 1e-4
    x = torch.randn(rows, k, generator=g, device="cuda")
    x = (x if x_scale is None else x * x_scale).to(torch.bfloat16)
    plan = GemvPlan.make(n, k, rows, _nprog(), bn=128, span=True, dot=2)
    outs = []
    for p in (plan, dataclasses.replace(plan, **change)):
        out = alloc_out(p, sets, "cuda")
        launch_gemv(p, x, w.view(torch.uint8), s, out, barrier=True)
        outs.append(out)
    return torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("ahead", [1, 2], ids=["lines", "bulk"])
@pytest.mark.parametrize("rows", [1, 8])
def test_next_set_requested_ahead_gives_the_plain_launch_bits(rows, ahead):
    """A plan with l2_ahead (each weight set's successor requested into the L2 before the set
    runs, a line a lane or as bulk prefetches: bench variants s128fqn / s128fqb) writes the
    plain launch's partials bit for bit over 3 sets."""
    assert _same_partials_as_plain(2624, 6144, rows, 3, rows, l2_ahead=ahead)


@pytest.mark.parametrize("rows", [1, 2, 8])
def test_x_quantised_on_the_conversion_unit_gives_the_integer_forms_bits(rows):
    """A plan with hwx (x quantised in the loop, its e4m3 rounding on sm_90's conversion unit:
    bench variant s128fh, a layer's o_proj form) writes the integer form's partials bit for bit,
    at o_proj's shape, over x spanning six decades (each 128-column block its own scale)."""
    scale = torch.logspace(-3, 3, 2048, device="cuda")
    assert _same_partials_as_plain(6144, 2048, rows, 2, 100 + rows, scale, hwx=True)


@pytest.mark.parametrize("shape", [(2624, 6144), (6144, 2048)], ids=["2624x6144", "6144x2048"])
@pytest.mark.parametrize("rows", [1, 8])
def test_span_fixup_on_gpu_gives_the_slot_order_sum(shape, rows):
    """`gemv.span_fixup` with every program resident and racing: slot 0 holds the bits of the
    host's slot-order sum of a plain launch's partials, over 20 launches on one fixup buffer."""
    from mono_common.stages.gemv_host import GemvPlan, alloc_out, fixup_words, launch_gemv

    n, k = shape
    g = torch.Generator(device="cuda").manual_seed(rows)
    w = (torch.randn(2, n, k, generator=g, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(2, -(-n // 128), k // 128, generator=g, device="cuda") * 1e-3 + 1e-4
    x = torch.randn(rows, k, generator=g, device="cuda").to(torch.bfloat16)
    plan = GemvPlan.make(n, k, rows, _nprog(), bn=128, span=True, dot=2)
    assert plan.slots > 1
    plain = alloc_out(plan, 2, "cuda")
    launch_gemv(plan, x, w.view(torch.uint8), s, plain)
    want = plain[:, 0].clone()
    for j in range(1, plan.slots):
        want += plain[:, j]
    fix = torch.zeros(fixup_words(plan, 2), dtype=torch.int32, device="cuda")
    for _ in range(20):
        fixed = alloc_out(plan, 2, "cuda")
        launch_gemv(plan, x, w.view(torch.uint8), s, fixed, fixup=fix)
        torch.cuda.synchronize()
        assert torch.equal(fixed[:, 0], want)
