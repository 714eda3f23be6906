"""The TP sizes and widths GLM-5.3's spec serves, through SGLang 0.5.23's own startup checks.

A TP 4 or TP 8 server with the default launcher (the kernel) passes SGLang's resolution step
for `--enable-amd-monokernel` (`binding.handle_amd_monokernel`, which runs
`monokernel_disable_reasons` with the real spec and aligns the decode capture sizes) on both
ISAs; other TP sizes are refused by SGLang in its own words. The GPU's ISA, the resolving view
and the model config are handed to the hook as SGLang's launcher would resolve them (no GPU
here; see test_refusals.py for the server arguments). `build` serves at each TP size the
spec's widths for it and sends the others to SGLang's forward.
"""

from __future__ import annotations

import importlib.util
import pathlib
import types

import pytest
from sglang.kernels.plugin_kernels.amd import spec as amd_spec
from sglang.kernels.plugin_kernels.amd.spec import BuildContext, Plan, ShapeKey
from sglang.srt.kernel_plugins.amd import binding

from mono_glm53 import ARCHITECTURE
from mono_glm53 import build as build_mod
from mono_glm53.plugin import SPEC_PATH
from mono_glm53.spec import SPEC, WIDTHS_BY_TP


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"glm53_{name}", pathlib.Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


refusals_cases = _load("test_refusals")  # good_cfg / good_hf: a resolved GLM-5.3 server
support = _load("test_forward_support")


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    monkeypatch.setattr(amd_spec, "_REGISTRY", {})
    amd_spec.register(backend="amd", architecture=ARCHITECTURE, path=SPEC_PATH)
    monkeypatch.delenv("MONO_GLM53_LAYER", raising=False)  # the default launcher: the kernel


def resolve(monkeypatch, *, isa: str, tp: int):
    """Run SGLang's `handle_amd_monokernel` resolution step on a resolved GLM-5.3 server at
    `tp`; return the decode capture sizes it declared (None: it declared nothing)."""
    cfg = refusals_cases.good_cfg(tp_size=tp)
    model_config = types.SimpleNamespace(hf_config=refusals_cases.good_hf(), dtype="bfloat16")
    declared = {}
    monkeypatch.setattr(binding, "device_isa", lambda: isa)
    monkeypatch.setattr(binding, "resolving_view", lambda server_args: cfg)
    monkeypatch.setattr(binding, "model_config_of", lambda server_args: model_config)
    monkeypatch.setattr(binding, "declare_resolution", lambda sa, step, **kw: declared.update(kw))
    binding.handle_amd_monokernel(types.SimpleNamespace(_cuda_graph_config_locked=set()))
    graph = declared.get("cuda_graph_config")
    return None if graph is None else list(graph.decode.bs)


@pytest.mark.parametrize("tp", [4, 8])
@pytest.mark.parametrize("isa", ["sm_90", "gfx950"])
def test_a_tp_server_with_the_default_kernel_passes_sglangs_startup_checks(monkeypatch, isa, tp):
    bs = resolve(monkeypatch, isa=isa, tp=tp)
    # SGLang aligned the capture sizes to the spec's widths (2, 4, 8) and kept the larger ones
    assert bs == [2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64], bs
    _, reasons = binding.monokernel_disable_reasons(
        cfg=refusals_cases.good_cfg(tp_size=tp),
        model_config=types.SimpleNamespace(hf_config=refusals_cases.good_hf(), dtype="bfloat16"), isa=isa)
    assert reasons == []


@pytest.mark.parametrize("tp", [1, 2, 16])
@pytest.mark.parametrize("isa", ["sm_90", "gfx950"])
def test_other_tp_sizes_are_refused_at_startup_in_sglangs_words(monkeypatch, isa, tp):
    with pytest.raises(ValueError) as ei:
        resolve(monkeypatch, isa=isa, tp=tp)
    assert f"tp_size {tp} is not one of ['4', '8']" in str(ei.value)


def test_the_spec_lists_4_and_8_on_both_isas_with_a_width_table():
    for isa in ("sm_90", "gfx950"):
        assert SPEC.devices[isa].tp_sizes == (4, 8)
        assert set(WIDTHS_BY_TP[isa]) == {4, 8}
    assert WIDTHS_BY_TP["gfx950"][4] == (2, 4)  # 8-row steps at TP 4 stay on SGLang's path
    assert WIDTHS_BY_TP["gfx950"][8] == WIDTHS_BY_TP["sm_90"][8] == WIDTHS_BY_TP["sm_90"][4] == (2, 4, 8)


def _build_at(monkeypatch, isa: str, tp: int, widths=(2, 4, 8)):
    """`build` of the tiny model as TP rank 0 of `tp` on `isa` (the reference launcher: no GPU)."""
    support.patch_pools(monkeypatch)
    monkeypatch.setenv("MONO_GLM53_LAYER", "reference")
    monkeypatch.setattr(build_mod, "_tp", lambda: (tp, 0))
    model = support.TinyGlm(n_layers=4)
    model.forward = lambda *args, **kwargs: ("sglang's forward", args)
    ctx = BuildContext(isa=isa, widths=widths, deadline_s=60.0, copies={})
    return model, build_mod.build(model, model.config, ctx, shape=model.shape)


def test_a_width_outside_the_tp_sizes_table_runs_sglangs_forward(monkeypatch):
    model, built = _build_at(monkeypatch, "gfx950", 4)
    assert built.widths == (2, 4, 8) and built.served == (2, 4)
    ids, pos, fb = support.forward_batch(model, pool=model.pool.clone())
    plan8 = Plan(key=ShapeKey(forward_mode="decode", batch_size=8, tokens_per_request=1))
    out = built.forward(plan8, ids, pos, fb)
    assert out[0] == "sglang's forward" and out[1][0] is ids
    # a served width goes to the mono forward (which checks the step's rows against the key)
    plan4 = Plan(key=ShapeKey(forward_mode="decode", batch_size=4, tokens_per_request=1))
    with pytest.raises(RuntimeError, match="routed as"):
        built.forward(plan4, ids, pos, fb)


def test_every_width_is_served_at_tp8(monkeypatch):
    for isa in ("gfx950", "sm_90"):
        _, built = _build_at(monkeypatch, isa, 8)
        assert built.served == (2, 4, 8)


def test_sglang_tp_group_is_read_through_its_parallel_state(monkeypatch):
    from sglang.srt.distributed import parallel_state

    group = types.SimpleNamespace(cpu_group="gloo group", rank_in_group=3, world_size=8)
    monkeypatch.setattr(parallel_state, "get_tp_group", lambda: group)
    assert build_mod.tp_group() == ("gloo group", 3, 8)


class _HostRuntime:
    """mono_common.ipc's calls on host memory, for ranks that are threads of this process."""

    def __init__(self):
        import ctypes

        self.ctypes, self.buffers = ctypes, {}

    def set_device(self, index):
        pass

    def malloc(self, nbytes, uncached=False):
        buf = (self.ctypes.c_uint8 * nbytes)()
        self.buffers[self.ctypes.addressof(buf)] = buf
        return self.ctypes.addressof(buf)

    def memset(self, addr, value, nbytes):
        self.ctypes.memset(addr, value, nbytes)

    def synchronize(self):
        pass

    def export(self, addr):
        return addr.to_bytes(8, "little") + bytes(56)

    def open(self, handle):
        return int.from_bytes(handle[:8], "little")

    def close(self, addr):
        pass

    def free(self, addr):
        pass

    def view(self, addr, nbytes, device):
        import torch

        return torch.frombuffer((self.ctypes.c_uint8 * nbytes).from_address(addr), dtype=torch.uint8)


def test_layer_peers_serve_every_width_and_one_guard_on_the_peer_abort_flag(monkeypatch):
    """build's TP path below SGLang: `layer_peers` over a 2-rank group (threads, host memory)
    and `KernelLayer` building each width's kernel on them, as build does at TP > 1."""
    import threading

    import torch

    from mono_common import ipc, peer
    from mono_glm53.config import tiny
    from mono_glm53.kernels.layer import peer_requests
    from mono_glm53.weights import make_weights

    monkeypatch.setattr(ipc, "runtime", lambda: _HostRuntime())
    world, widths = 2, (2, 4)
    objs, bar = [None] * world, threading.Barrier(world, timeout=60)

    def gather_for(rank):
        def gather(obj):
            objs[rank] = obj
            bar.wait()
            out = list(objs)
            bar.wait()
            return out
        return gather

    got = [None] * world

    def rank_body(rank):
        try:
            s = tiny(tp_size=world, tp_rank=rank, page=64)
            lp = build_mod.layer_peers(s, widths, comm=peer.Comm(rank, world, gather_for(rank)), device="cpu",
                                       deadline_s=1.0, mode="report")
            launcher = build_mod.KernelLayer(s, {3: make_weights(s, device="cpu", seed=rank)},
                                             types.SimpleNamespace(widths=widths, deadline_s=1.0), "staged", lp)
            got[rank] = (lp, [launcher.kernel(3, w, 128) for w in widths])
        except Exception as e:  # noqa: BLE001 - checked below
            got[rank] = e

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(isinstance(g, tuple) for g in got), got
    names = {n for n, _, _ in peer_requests(tiny(tp_size=world, page=64), 2, world)}
    for rank, (lp, kernels) in enumerate(got):
        assert set(lp.by_width) == set(widths)
        for w, k in zip(widths, kernels):
            assert set(lp.by_width[w].table) == names
            assert (k.world, k.rank, k.width) == (world, rank, w)
            assert k.guard is lp.guard, "every width's kernel shares the rank's guard"
            assert k.ar_tabs[0] is lp.by_width[w].table["glm53.ar1.mbox"]
        assert kernels[0].ar_tabs[0].tolist() != kernels[1].ar_tabs[0].tolist(), "each width its own regions"
        abort, tab, _ = lp.guard.args(rank)
        assert abort.data_ptr() == lp.buffers.local["mono.guard.abort"].data_ptr()
        assert tab.tolist() == [g[0].buffers.local["mono.guard.abort"].data_ptr() for g in got]
        assert lp.guard.mode == "report" and isinstance(abort, torch.Tensor)
