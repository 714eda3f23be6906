"""Peer-buffer layout and the size handshake, with fake ranks (no torch.distributed)."""

import ctypes
import os
import threading

import pytest

from mono_common import peer

MiB = 1 << 20


def test_round_to_granule():
    assert peer.GRANULE == 2 * MiB
    assert peer.round_to_granule(0) == 2 * MiB
    assert peer.round_to_granule(1) == 2 * MiB
    assert peer.round_to_granule(2 * MiB) == 2 * MiB
    assert peer.round_to_granule(2 * MiB + 1) == 4 * MiB
    with pytest.raises(ValueError):
        peer.round_to_granule(-1)


def test_plan_offsets_are_granule_aligned_per_kind():
    regs = peer.plan([("mbox", 3 * MiB, "data"), ("flags", 100, "flags"), ("mbox2", 10, "data")])
    assert [(r.name, r.offset, r.size) for r in regs] == [
        ("mbox", 0, 4 * MiB), ("flags", 0, 2 * MiB), ("mbox2", 4 * MiB, 2 * MiB)]
    assert peer.pool_bytes(regs, "data") == 6 * MiB
    with pytest.raises(ValueError, match="twice"):
        peer.plan([("a", 1, "data"), ("a", 1, "data")])
    with pytest.raises(ValueError, match="kind"):
        peer.plan([("a", 1, "weird")])


class FakeGroup:
    """R fake ranks in threads; all_gather returns every rank's object once all have given one."""

    def __init__(self, world):
        self.world = world
        self.objs = [None] * world
        self.barrier = threading.Barrier(world, timeout=10)

    def gather_for(self, rank):
        def gather(obj):
            self.objs[rank] = obj
            self.barrier.wait()
            out = list(self.objs)
            self.barrier.wait()
            return out

        return gather


def _run_ranks(requests_by_rank):
    world = len(requests_by_rank)
    group = FakeGroup(world)
    results = [None] * world

    def body(rank):
        try:
            results[rank] = peer.handshake(requests_by_rank[rank], group.gather_for(rank), rank)
        except Exception as e:  # noqa: BLE001 - collected and checked below
            results[rank] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
        assert not t.is_alive(), "a rank hung in the handshake"
    return results


def test_handshake_same_sizes_gives_same_layout():
    req = [("mbox", 3 * MiB, "data"), ("flags", 4096, "flags")]
    res = _run_ranks([req] * 4)
    assert all(r == peer.plan(req) for r in res)


@pytest.mark.parametrize("bad", ["size", "order", "missing"])
def test_handshake_mismatch_fails_on_every_rank_with_every_size(bad):
    req = [("mbox", 3 * MiB, "data"), ("flags", 4096, "flags")]
    other = {
        "size": [("mbox", 5 * MiB, "data"), ("flags", 4096, "flags")],
        "order": list(reversed(req)),
        "missing": req[:1],
    }[bad]
    res = _run_ranks([req, req, other, req])
    assert all(isinstance(r, peer.PeerHandshakeError) for r in res)
    msgs = {str(r) for r in res}
    assert len(msgs) == 1, "every rank must raise the same error"
    msg = msgs.pop()
    for q in range(4):
        assert f"rank {q}:" in msg
    assert "rank 2:" in msg and "<- differs from rank 0" in msg.split("rank 2:")[1].splitlines()[0]
    assert f"mbox={3 * MiB}B" in msg


def test_allocate_local_gives_each_rank_its_own_zeroed_regions_and_the_tables():
    torch = pytest.importorskip("torch")
    reqs = [("mbox", 3 * MiB, "data"), ("flags", 100, "flags")]
    bufs = peer.allocate_local(reqs, 3, device="cpu")
    assert [b.rank for b in bufs] == [0, 1, 2] and all(b.world == 3 for b in bufs)
    for name in ("mbox", "flags"):
        tab = bufs[0].table[name]
        assert tab.dtype == torch.int64
        assert tab.tolist() == [b.local[name].data_ptr() for b in bufs]
        assert len(set(tab.tolist())) == 3
        assert all(b.table[name] is tab for b in bufs)
    assert bufs[1].local["mbox"].numel() == 4 * MiB and int(bufs[1].local["mbox"].sum()) == 0
    with pytest.raises(ValueError, match="world size"):
        peer.allocate_local(reqs, 0, device="cpu")


# ---------------------------------------------------------------------------------------------
# `allocate` with fake ranks: threads of one process, a fake GPU runtime on host memory (the
# IPC "open" of a handle gives back the exporting rank's address, valid in this one process)


class FakeRuntime:
    """mono_common.ipc.DeviceRuntime's calls on host memory; `fail` names a call that raises."""

    def __init__(self, fail: str | None = None):
        import ctypes

        self.ctypes, self.fail = ctypes, fail
        self.buffers, self.freed, self.closed, self.opened = {}, [], [], []

    def _maybe_fail(self, call):
        if call == self.fail:
            raise RuntimeError(f"fake {call} failure")

    def set_device(self, index):
        self._maybe_fail("set_device")

    def malloc(self, nbytes, uncached=False):
        self._maybe_fail("malloc")
        buf = (self.ctypes.c_uint8 * nbytes)()
        for i in range(0, nbytes, 4096):
            buf[i] = 0xAB  # garbage, so the zeroing is checked
        addr = self.ctypes.addressof(buf)
        self.buffers[addr] = buf
        return addr

    def memset(self, addr, value, nbytes):
        self.ctypes.memset(addr, value, nbytes)

    def synchronize(self):
        pass

    def export(self, addr):
        self._maybe_fail("export")
        return addr.to_bytes(8, "little") + bytes(56)

    def open(self, handle):
        self._maybe_fail("open")
        assert len(handle) == 64
        addr = int.from_bytes(handle[:8], "little")
        self.opened.append(addr)
        return addr

    def close(self, addr):
        self.closed.append(addr)

    def free(self, addr):
        self.freed.append(addr)

    def view(self, addr, nbytes, device):
        import torch

        return torch.frombuffer((self.ctypes.c_uint8 * nbytes).from_address(addr), dtype=torch.uint8)


def _allocate_ranks(requests_by_rank, runtimes):
    world = len(requests_by_rank)
    group = FakeGroup(world)
    results = [None] * world

    def body(rank):
        comm = peer.Comm(rank, world, group.gather_for(rank))
        try:
            results[rank] = peer.allocate(requests_by_rank[rank], device="cpu", comm=comm,
                                          runtime=runtimes[rank])
        except Exception as e:  # noqa: BLE001 - collected and checked below
            results[rank] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a rank hung in allocate"
    return results


REQ = [("mbox", 3 * MiB, "data"), ("flags", 100, "flags"), peer.ABORT_REGION]


def test_allocate_maps_every_rank_pool_into_every_table():
    torch = pytest.importorskip("torch")
    rts = [FakeRuntime() for _ in range(4)]
    res = _allocate_ranks([REQ] * 4, rts)
    assert all(isinstance(b, peer.PeerBuffers) for b in res), res
    for name in ("mbox", "flags", "mono.guard.abort"):
        want = [b.local[name].data_ptr() for b in res]
        assert len(set(want)) == 4
        for b in res:
            assert b.table[name].dtype == torch.int64 and b.table[name].tolist() == want
    for q, b in enumerate(res):
        assert b.rank == q and b.world == 4
        assert b.local["mbox"].numel() == 4 * MiB and int(b.local["mbox"].sum()) == 0  # zeroed
        assert sorted(rts[q].opened) == sorted(  # every peer's pool of each kind, never its own
            a for p, o in enumerate(res) if p != q for a in (o.local["mbox"].data_ptr(), o.local["flags"].data_ptr()))
    # the abort flag: an int32 [2] view of this rank's region, and the table of every rank's
    flag, tab = peer.abort_args(res[2])
    assert flag.dtype == torch.int32 and flag.numel() == 2
    assert flag.data_ptr() == res[2].local["mono.guard.abort"].data_ptr()
    assert tab is res[2].table["mono.guard.abort"]
    # a write into rank 1's region is what rank 3 reaches through its table
    res[1].local["mbox"][5] = 7
    addr = res[3].table["mbox"][1].item()
    assert torch.frombuffer((ctypes.c_uint8 * 8).from_address(addr), dtype=torch.uint8)[5] == 7


def test_guard_of_one_process_rank_polls_its_peer_abort_flag():
    """Guard(abort=...) of one rank of a world of processes: the kernel gets this rank's flag
    (in the peer region), the table of every rank's flag, and its own error word."""
    torch = pytest.importorskip("torch")
    from mono_common.guard_host import Guard

    res = _allocate_ranks([REQ] * 3, [FakeRuntime() for _ in range(3)])
    g = Guard(3, device="cpu", mode="report", deadline_s=1.0, abort=peer.abort_args(res[1]))
    abort, tab, err = g.args(1)
    assert abort.data_ptr() == res[1].local["mono.guard.abort"].data_ptr() and abort.numel() == 2
    assert tab.tolist() == [b.local["mono.guard.abort"].data_ptr() for b in res]
    assert tuple(g.errors.shape) == (1, 16) and err.data_ptr() == g.errors.data_ptr()
    # rank 0's program raising the flag of every rank through the table reaches this guard
    torch.frombuffer((ctypes.c_int32 * 2).from_address(tab[1].item()), dtype=torch.int32)[0] = 1
    assert g.abort[0, 0].item() == 1
    g.check(synchronize=False)  # no error word: a raised flag alone is not this rank's failure


def test_allocate_scoped_regions_per_launch():
    res = _allocate_ranks([[("w2.mbox", 10, "data"), ("w4.mbox", 10, "data")]] * 2, [FakeRuntime() for _ in range(2)])
    w4 = res[1].scoped("w4")
    assert [r.name for r in w4.regions] == ["mbox"] and w4.rank == 1 and w4.world == 2
    assert w4.table["mbox"] is res[1].table["w4.mbox"] and w4.local["mbox"] is res[1].local["w4.mbox"]
    with pytest.raises(KeyError, match="w8"):
        res[1].scoped("w8")


@pytest.mark.parametrize("bad", ["size", "order"])
def test_allocate_mismatch_fails_on_every_rank_before_allocating(bad):
    other = {"size": [("mbox", 5 * MiB, "data")] + REQ[1:], "order": [REQ[1], REQ[0], REQ[2]]}[bad]
    rts = [FakeRuntime() for _ in range(3)]
    res = _allocate_ranks([REQ, other, REQ], rts)
    assert all(isinstance(r, peer.PeerHandshakeError) for r in res), res
    msg = str(res[0])
    assert all(str(r) == msg for r in res)
    assert "rank 1:" in msg and "<- differs from rank 0" in msg.split("rank 1:")[1].splitlines()[0]
    assert all(not rt.buffers for rt in rts), "no rank may allocate after a failed handshake"


@pytest.mark.parametrize("call", ["malloc", "export", "open"])
def test_a_failure_on_one_rank_fails_every_rank_at_once(call):
    rts = [FakeRuntime(fail=call if r == 2 else None) for r in range(4)]
    res = _allocate_ranks([REQ] * 4, rts)
    assert all(isinstance(r, peer.PeerAllocationError) for r in res), res
    msg = str(res[0])
    assert all(str(r) == msg for r in res), "every rank must raise the same error"
    assert f"rank 2: RuntimeError: fake {call} failure" in msg and "rank 0:" not in msg
    for rt in rts:  # what was allocated or opened is given back
        assert sorted(rt.freed) == sorted(rt.buffers) and sorted(rt.closed) == sorted(rt.opened)


def test_find_loaded_library_reads_the_maps():
    from mono_common.ipc import find_loaded_library

    maps = ("7f00-7f10 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
            "7f10-7f20 r-xp 00000000 08:01 3 /venv/tilelang/lib/libcudart_stub.so\n"
            "7f20-7f30 r-xp 00000000 08:01 2 /venv/my env/lib/libcudart.so.13 (deleted)\n"
            "7f40-7f50 rw-p 00000000 00:00 0 \n")
    assert find_loaded_library("libcudart", maps) == "/venv/my env/lib/libcudart.so.13"
    assert find_loaded_library("libamdhip64", maps) is None


# ---------------------------------------------------------------------------------------------
# the same handshake and exchange between real rank PROCESSES over a gloo group (the CPU
# collective a server's TP CPU group provides), with a host-memory runtime


_CHILD = os.path.join(os.path.dirname(__file__), "peer_process_child.py")


def test_processes_exchange_their_pools_over_gloo():
    pytest.importorskip("torch")
    from mono_common.testing.ranks import run_ranks

    res = run_ranks(_CHILD, 3, "same", timeout_s=240)
    assert all(r["exit"] == 0 and "tables" in r for r in res), [r.get("log") for r in res]
    for name in ("mbox", "flags", "mono.guard.abort"):
        want = [r["local"][name] for r in res]  # each rank's own address, in its own process
        assert all(r["tables"][name] == want for r in res), name
    assert all(r["mallocs"] == 2 for r in res)  # one pool per kind


@pytest.mark.parametrize("bad", ["size", "order"])
def test_processes_with_different_requests_all_fail_at_once_with_each_ranks_sizes(bad):
    pytest.importorskip("torch")
    from mono_common.testing.ranks import run_ranks

    res = run_ranks(_CHILD, 3, bad, timeout_s=240)
    assert all(r["exit"] == 0 and "error" in r for r in res), [r.get("log") for r in res]
    msgs = {r["error"] for r in res}
    assert len(msgs) == 1, "every rank must raise the same error"
    msg = msgs.pop()
    assert all(f"rank {q}:" in msg for q in range(3))
    assert "<- differs from rank 0" in msg.split("rank 1:")[1].splitlines()[0]
    assert all(r["mallocs"] == 0 for r in res), "no rank allocates after a failed handshake"
