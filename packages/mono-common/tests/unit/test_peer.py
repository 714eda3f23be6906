"""Peer-buffer layout and the size handshake, with fake ranks (no torch.distributed)."""

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
