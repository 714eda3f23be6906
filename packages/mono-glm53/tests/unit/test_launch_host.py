"""The layer kernel's host-side launch paths on the CPU (issue 21), with the Triton kernel
replaced by a fake that records its launches and can write a guard error word as a stopped
launch would: a stopped launch raises before its outputs are used, the next launch refuses
until `recover()`, a server refuses report mode, inputs that disagree with the step are
refused, the cooperative launch is decided by capability and never by a caught exception,
a grid that cannot be co-resident is refused before it launches, and a launch's plan is the
one `tests/compile` builds (`variant_constexprs`)."""

from __future__ import annotations

import contextlib
import dataclasses
import types

import pytest
import torch

from mono_common import errors
from mono_glm53.config import tiny
from mono_glm53.kernels import layer, stages
from mono_glm53.weights import make_caches, make_weights


class FakeKernel:
    """Stands in for `stages.layer_kernel`: records each launch's keyword arguments; with
    `stop` set, the launch writes a timeout word into the guard's error words first."""

    def __init__(self, raise_on_cooperative=None):
        self.calls = []
        self.stop = None
        self.raise_on_cooperative = raise_on_cooperative

    def __getitem__(self, grid):
        def run(*args, **kw):
            if kw.get("launch_cooperative_grid") and self.raise_on_cooperative is not None:
                raise self.raise_on_cooperative
            self.calls.append((grid, kw))
            if self.stop is not None:
                self.stop[errors.CODE] = errors.CODE_TIMEOUT
                self.stop[errors.STAGE] = 12
                self.stop[errors.OBSERVED] = 263
                self.stop[errors.EXPECTED] = 264
                self.stop[errors.STATE] = errors.STATE_COMPLETE
            return types.SimpleNamespace(grid=grid)

        return run

    def warmup(self, *args, grid, **kw):
        return types.SimpleNamespace(n_regs=255, metadata=types.SimpleNamespace(shared=48 * 1024, num_warps=4))


@pytest.fixture
def fake(monkeypatch):
    f = FakeKernel()
    monkeypatch.setattr(stages, "layer_kernel", f)
    return f


def _kernel(monkeypatch, mode="report", width=2, nprog=2):
    monkeypatch.setenv("MONO_GUARD_MODE", mode)
    s = tiny()
    w = make_weights(s, device="cpu", seed=0)
    inputs, caches = make_caches(s, width, 8, device="cpu", seed=1)
    k = layer.GlmLayerKernel(s, w, width, 8, nprog=nprog, device="cpu")
    hidden = torch.zeros(width, s.hidden, dtype=torch.bfloat16)
    return k, inputs, caches, hidden


def test_a_stopped_launch_raises_before_its_outputs_are_returned(monkeypatch, fake):
    k, inputs, caches, hidden = _kernel(monkeypatch)
    k.set_inputs(hidden, hidden, inputs)
    k.launch(caches, "staged")  # a good launch returns its outputs
    fake.stop = k.guard.errors[0]
    with pytest.raises(errors.MonoWaitTimeout, match="stage 12"):
        k.launch(caches, "fused")


def test_after_a_stop_the_kernel_refuses_until_recover(monkeypatch, fake):
    k, inputs, caches, hidden = _kernel(monkeypatch)
    k.set_inputs(hidden, hidden, inputs)
    fake.stop = k.guard.errors[0]
    with pytest.raises(errors.MonoWaitTimeout):
        k.launch(caches, "fused")
    fake.stop = None
    n = len(fake.calls)
    with pytest.raises(errors.MonoDeviceError, match="earlier launch stopped.*call recover"):
        k.launch(caches, "fused")
    assert len(fake.calls) == n, "a refused launch must not reach the device"
    k.cnt.fill_(7)
    k.epoch.fill_(3)
    k.recover()
    assert k.cnt.eq(0).all() and k.epoch.eq(0).all() and k.stop_recorded() is None
    out, _, _ = k.launch(caches, "fused")
    assert out is k.out and len(fake.calls) == n + 1


def test_fault_mode_does_not_sync_after_a_launch(monkeypatch, fake):
    k, inputs, caches, hidden = _kernel(monkeypatch, mode="fault")
    k.set_inputs(hidden, hidden, inputs)
    monkeypatch.setattr(k.guard, "check", lambda *a, **kw: pytest.fail("fault mode checked the guard"))
    k.launch(caches, "fused")


def test_a_server_refuses_report_mode_outside_check_mode(monkeypatch):
    from mono_glm53.forward import GlmMonoForward, report_mode_refusal

    monkeypatch.setenv("MONO_GUARD_MODE", "report")
    reason = report_mode_refusal(check_mode=False)
    assert "MONO_GUARD_MODE=report" in reason and "stale outputs" in reason
    assert report_mode_refusal(check_mode=True) is None
    with pytest.raises(ValueError, match="stale outputs"):
        GlmMonoForward(object(), object(), [3])
    GlmMonoForward(object(), object(), [3], layer_hook=lambda *a: a)  # check mode checks every launch
    monkeypatch.setenv("MONO_GUARD_MODE", "fault")
    assert report_mode_refusal(check_mode=False) is None
    GlmMonoForward(object(), object(), [3])


def test_inputs_that_disagree_with_the_step_are_refused(monkeypatch):
    k, inputs, caches, hidden = _kernel(monkeypatch)
    one = torch.ones(1, dtype=torch.int32)
    bad = dataclasses.replace(inputs, seq_lens=one, positions=inputs.positions.float())
    with pytest.raises(ValueError) as ei:
        k.set_inputs(hidden, hidden, bad)
    msg = str(ei.value)
    # a one-element per-row tensor used to be broadcast into every row
    assert "seq_lens is (1,), the step has 2 rows (one value per row)" in msg
    assert "positions is torch.float32, not an int32/int64 tensor" in msg
    with pytest.raises(ValueError, match="hidden is torch.float32, the kernel reads bfloat16"):
        k.set_inputs(hidden.float(), hidden, inputs)
    with pytest.raises(ValueError, match=rf"residual is \(1, {k.s.hidden}\), the step needs \[2 rows, {k.s.hidden}\]"):
        k.set_inputs(hidden, hidden[:1], inputs)
    with pytest.raises(ValueError, match="3 rows: this kernel takes 1 to 2"):
        h3 = torch.zeros(3, k.s.hidden, dtype=torch.bfloat16)
        k.set_inputs(h3, h3, inputs)
    with pytest.raises(ValueError, match=f"max_seq_len 4096 is larger than the {k.max_seq_len} built for"):
        k.set_inputs(hidden, hidden, dataclasses.replace(inputs, max_seq_len=4096))
    k.set_inputs(hidden, hidden, inputs)  # the step's own inputs pass


def test_cooperative_launch_is_decided_by_capability(monkeypatch):
    import triton.backends.nvidia.compiler as nv

    assert layer.cooperative_launch_supported("cpu") is False
    assert layer.cooperative_launch_supported("cuda") is True  # this Triton's CUDAOptions has the option

    @dataclasses.dataclass
    class OldOptions:
        num_warps: int = 4

    monkeypatch.setattr(nv, "CUDAOptions", OldOptions)
    assert layer.cooperative_launch_supported("cuda") is False


def test_a_failing_cooperative_launch_propagates(monkeypatch):
    # It used to be caught (TypeError/KeyError, compile errors included) and the launch retried
    # plainly, for the rest of the process.
    f = FakeKernel(raise_on_cooperative=TypeError("bad constexpr in the kernel"))
    monkeypatch.setattr(stages, "layer_kernel", f)
    k, inputs, caches, hidden = _kernel(monkeypatch, mode="fault")
    k.set_inputs(hidden, hidden, inputs)
    k.device, k.cooperative = torch.device("cuda"), True  # as on a GPU whose Triton has the option
    monkeypatch.setattr(k, "_args", lambda *a, **kw: ())
    with pytest.raises(TypeError, match="bad constexpr"):
        k.launch(caches, "fused")
    assert f.calls == [], "no plain launch after a failed cooperative one"


H200 = types.SimpleNamespace(name="NVIDIA H200", warp_size=32, max_threads_per_multi_processor=2048,
                             regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
                             multi_processor_count=132)


def test_resident_programs_per_sm():
    # the layer kernel on the H200: 255 registers, 48 KiB shared, 4 warps: two a SM
    assert layer.resident_per_sm(255, 48 * 1024, 4, H200) == 2
    assert layer.resident_per_sm(128, 0, 4, H200) == 4
    assert layer.resident_per_sm(32, 120 * 1024, 4, H200) == 1


def test_a_plain_launch_of_a_grid_that_cannot_be_co_resident_is_refused(monkeypatch, fake):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: H200)
    compiled = fake.warmup(grid=(1,))
    layer.check_co_resident(compiled, 264, "cuda")
    with pytest.raises(RuntimeError, match="265 programs cannot be co-resident on NVIDIA H200: 2 fit an SM"):
        layer.check_co_resident(compiled, 265, "cuda")
    k, inputs, caches, hidden = _kernel(monkeypatch, mode="fault", nprog=265)
    k.set_inputs(hidden, hidden, inputs)
    k.device, k.cooperative = torch.device("cuda"), False
    monkeypatch.setattr(k, "_args", lambda *a, **kw: ())
    with pytest.raises(RuntimeError, match="cannot be co-resident"):
        k.launch(caches, "fused")
    assert fake.calls == [], "refused before it launched"


def test_a_launch_passes_the_plan_the_compile_checks_build(monkeypatch, fake):
    # tests/compile checks `variant_constexprs` (the plan with `isa_options`); a launch must run
    # that plan. Session 21: HWQ was set in isa_options but not read by the kernel object, so
    # the H200 ran a plan the compile checks never built.
    k, inputs, caches, hidden = _kernel(monkeypatch)
    k.set_inputs(hidden, hidden, inputs)
    k.launch(caches, "fused")
    _, kw = fake.calls[-1]
    want = layer.variant_constexprs(tiny(), 2, True, 2, "sm_90")
    fields = [f.name for f in dataclasses.fields(layer.Plan)]
    assert {n: kw[n] for n in fields} == {n: want[n] for n in fields}
    assert kw["HWQ"] and kw["XQP"]


def test_l2_window_is_refused_off_cuda(monkeypatch):
    s = tiny()
    w = make_weights(s, device="cpu", seed=0)
    with pytest.raises(ValueError, match="l2_window sets a CUDA access policy window"):
        layer.GlmLayerKernel(s, w, 2, 8, nprog=2, device="cpu", l2_window=True)


def test_l2_window_wraps_the_fused_launch_alone_in_its_weights_window(monkeypatch, fake):
    """The window (mono_common.l2_window, faked here: no CUDA device) is set around each fused
    launch, over the weights of that launch (the object's, or the `weights` a rotation passes),
    the routed-expert stacks left out; a staged launch runs without it."""
    from mono_common import l2_window

    k, inputs, caches, hidden = _kernel(monkeypatch)
    k.set_inputs(hidden, hidden, inputs)
    k.l2_window = True  # as a CUDA device's build sets it
    seen = []

    @contextlib.contextmanager
    def streaming(stream, base, nbytes):
        seen.append((base, nbytes, len(fake.calls)))
        yield

    monkeypatch.setattr(l2_window, "streaming", streaming)
    monkeypatch.setattr(l2_window, "max_window_bytes", lambda device: 1 << 40)
    monkeypatch.setattr(layer.torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=7))
    # the tiny layer's routed-expert stacks (the largest tensors) stand for a real rank's
    stacks = ("mlp.experts.w13_weight", "mlp.experts.w2_weight")
    skip = min(k.w[n].numel() * k.w[n].element_size() for n in stacks)
    assert all(t.numel() * t.element_size() < skip for n, t in k.w.items() if n not in stacks)
    monkeypatch.setattr(l2_window, "SKIP_BYTES", skip)
    k.launch(caches, "staged")
    assert seen == []
    k.launch(caches, "fused")
    other = make_weights(tiny(), device="cpu", seed=3)
    k.launch(caches, "fused", weights=other)

    def want(w):
        spans = [(t.data_ptr(), t.numel() * t.element_size()) for t in w.values()]
        small = [(a, n) for a, n in spans if n < skip]
        assert len(small) == len(spans) - 2
        return min(a for a, _ in small), max(a + n for a, n in small) - min(a for a, _ in small)

    n_staged = len(stages.STAGE_NAMES)
    assert seen == [(*want(k.w), n_staged), (*want(other), n_staged + 1)]
    assert want(k.w) != want(other)
