"""The layer kernel's pointer table (kernels/ptable.py, layer.device_table) on the CPU.

The kernel reads every tensor address and scalar from one int64 row: these tests check that
the row holds what the kernel casts each slot to, that the host refuses a tensor of the wrong
dtype or alignment (naming every bad slot at once), that a launch's table is built once per
distinct set of addresses and scalars, and that a side-by-side launch gets one row per rank.
"""

from __future__ import annotations

import pathlib
import re
import struct

import pytest
import torch

from mono_glm53.kernels import layer, ptable

STAGES = pathlib.Path(layer.__file__).with_name("stages.py")
_TRITON = {"bf16": "bfloat16", "fp32": "float32", "i32": "int32", "i64": "int64", "u8": "uint8"}
_ALIASES = {"bf16": "bfloat16", "f32": "float32", "i32": "int32", "i64": "int64", "u8": "uint8",
            # the MoE's quantised inputs: bf16 slots that hold f16 bits under Plan.MF16 (the same
            # 2-byte elements; the host never reads them as values but through moe_checks' view)
            "xmoe": "bfloat16"}


def _kernel():
    from mono_glm53.config import tiny
    from mono_glm53.weights import make_caches, make_weights

    s = tiny()
    w = make_weights(s, device="cpu", seed=0)
    inputs, caches = make_caches(s, 1, 8, device="cpu", seed=1)
    k = layer.GlmLayerKernel(s, w, 2, 8, nprog=2, device="cpu")
    k.set_inputs(torch.zeros(1, s.hidden, dtype=torch.bfloat16), torch.zeros(1, s.hidden, dtype=torch.bfloat16),
                 inputs)
    return k, caches


def test_slot_constants_follow_the_row_layout():
    names = [n for n, _ in ptable.SLOTS + ptable.SCALARS]
    assert len(set(names)) == len(names)
    assert [getattr(ptable, n.upper()).value for n in names] == list(range(len(names)))
    assert ptable.NSLOTS.value == len(names)
    assert ptable.UNALIGNED <= set(ptable.DTYPES)


def test_every_pointer_the_kernel_reads_is_cast_to_its_slot_dtype():
    """Every `_p`/`_pu(row, P.NAME, dtype)` in stages.py names a slot and casts it to the dtype
    that slot declares; every scalar read (`_sf`/`_si`/`_sl`) matches the scalar's type."""
    src = STAGES.read_text()
    reads = re.findall(r"\b(_pu?)\(row, P\.(\w+), (?:tl\.)?(\w+)\)", src)
    assert len(reads) > 60
    for fn, name, dt in reads:
        slot = name.lower()
        assert slot in ptable.DTYPES, name
        assert _ALIASES.get(dt, dt) == _TRITON[ptable.DTYPES[slot]], (name, dt)
        assert (fn == "_pu") == (slot in ptable.UNALIGNED), name
    scalars = dict(ptable.SCALARS)
    for fn, name in re.findall(r"\b(_s[fil])\(row, P\.(\w+)\)", src):
        want = {"_sf": "fp32", "_si": "i32", "_sl": "i64"}[fn]
        assert scalars[name.lower()] == want, (fn, name)
    used = {n.lower() for _, n, _ in reads} | {n.lower() for _, n in re.findall(r"\b(_s[fil])\(row, P\.(\w+)\)", src)}
    unused = {n for n, _ in ptable.SLOTS + ptable.SCALARS} - used
    # the pointer-table row itself holds slots no stage reads: none
    assert not unused, unused


def test_row_holds_addresses_then_scalar_bits():
    k, caches = _kernel()
    ts = k._tensors(caches, k.rtt)
    sc = k._scalars(k.rtt)
    dev, host = layer.device_table([(ts, sc)], "cpu")
    assert host is dev and dev.dtype == torch.int64 and dev.shape == (1, ptable.NSLOTS.value)
    row = dev[0].tolist()
    assert row[: len(ts)] == [t.data_ptr() for t in ts]
    n = len(ptable.SLOTS)
    for j, ((name, dt), v) in enumerate(zip(ptable.SCALARS, sc)):
        got = row[n + j]
        if dt == "fp32":
            assert struct.unpack("<f", struct.pack("<I", got))[0] == pytest.approx(v, rel=1e-7), name
        else:
            assert got == v, name
    assert row[ptable.RANK.value] == 0 and row[ptable.STALL.value] == k.stall
    assert row[ptable.STRIDE_RTT.value] == k.rtt.stride(0)


def test_next_layer_addresses_are_in_the_row_only_with_the_knob():
    """next_layer_prefetch (Plan.NXS) with next_weights set: the row's next_* words hold the next
    layer's q_a/kv_a, index wk and weights_proj addresses; without the knob, or without a next
    layer, zeros (no launch requests anything, and the table cache keys do not change)."""
    import dataclasses

    from mono_glm53.weights import make_weights

    k, caches = _kernel()
    nxt = make_weights(k.s, device="cpu", seed=5)
    words = (ptable.NEXT_WQKV.value, ptable.NEXT_WK.value, ptable.NEXT_WWP.value)

    def row():
        return layer.device_table([(k._tensors(caches, k.rtt), k._scalars(k.rtt))], "cpu")[0][0]

    k.next_weights = nxt
    assert [row()[j].item() for j in words] == [0, 0, 0]  # the knob is off
    k.plan = dataclasses.replace(k.plan, NXS=20)
    wwp = "self_attn.indexer.wk_weights_proj.weight" if k.s.indexer_fused else "self_attn.indexer.weights_proj.weight"
    want = [nxt["self_attn.fused_qkv_a_proj_with_mqa.weight"].data_ptr(),
            nxt.get("self_attn.indexer.wk.weight", torch.empty(0)).data_ptr() if not k.s.indexer_fused else 0,
            nxt[wwp].data_ptr()]
    assert [row()[j].item() for j in words] == want and all(want[::2])
    k.next_weights = None
    assert [row()[j].item() for j in words] == [0, 0, 0]


def test_table_is_built_once_per_address_set():
    k, caches = _kernel()
    ts = k._tensors(caches, k.rtt)
    a = k._table(ts, k.rtt)
    assert k._table(k._tensors(caches, k.rtt), k.rtt) is a
    other = type(caches)(kv=caches.kv.clone(), index_k=caches.index_k.clone())
    b = k._table(k._tensors(other, k.rtt), k.rtt)
    assert b is not a and b[0, ptable.KV_CACHE.value] == other.kv.data_ptr()
    k._delay = 7  # a scalar change is a new table too
    c = k._table(k._tensors(caches, k.rtt), k.rtt)
    assert c is not a and c[0, ptable.DELAY.value] == 7


def test_wrong_dtype_and_misalignment_are_refused_with_every_reason():
    k, caches = _kernel()
    ts = k._tensors(caches, k.rtt)
    i = [n for n, _ in ptable.SLOTS]
    ts[i.index("x")] = ts[i.index("x")].float()
    ts[i.index("hn")] = torch.zeros(64, dtype=torch.bfloat16)[1:]  # 2 bytes past an allocation
    with pytest.raises(ValueError) as e:
        layer.device_table([(ts, k._scalars(k.rtt))], "cpu")
    msg = str(e.value)
    assert "x is torch.float32, the kernel reads bf16" in msg
    assert "hn is not 16-byte aligned" in msg


def test_abort_word_may_be_unaligned():
    """The abort word of rank r is 8 * r bytes into the guard's table."""
    k, caches = _kernel()
    ts = k._tensors(caches, k.rtt)
    i = [n for n, _ in ptable.SLOTS]
    ts[i.index("abort")] = torch.zeros(4, dtype=torch.int32)[2:]
    layer.device_table([(ts, k._scalars(k.rtt))], "cpu")


def test_row_count_mismatch_is_refused():
    k, caches = _kernel()
    ts = k._tensors(caches, k.rtt)
    with pytest.raises(ValueError, match="tensors and"):
        layer.device_table([(ts[:-1], k._scalars(k.rtt))], "cpu")


def test_kernel_signature_is_the_table_and_the_absorption_strides():
    sig = layer.kernel_signature()
    assert sig == {"ptab": "*i64", "wkc_s0": "i32", "wkc_s1": "i32", "wkc_s2": "i32",
                   "wvc_s0": "i32", "wvc_s1": "i32", "wvc_s2": "i32"}


def test_launch_options():
    assert layer.launch_options("cpu") == {}
