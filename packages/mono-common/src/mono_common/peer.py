"""Peer buffers for tensor-parallel ranks: granule layout, the size handshake, allocation.

A kernel asks for named regions (mailboxes, flags, the guard's abort flag, ...). Every region
is rounded up to whole 2 MiB granules; the layout is the same on every rank, so a region's
address on rank q is `base[q] + offset`, and the kernel gets one int64 table of those
addresses per region (indexed by rank).

The handshake runs BEFORE any allocation: every rank all-gathers its list of (name, bytes,
kind) and compares the lists itself. If any rank differs, every rank raises the same
PeerHandshakeError (listing each rank's sizes) at once; no rank waits for a deadline.

`allocate` (serving, and ranks as separate processes in tests): each rank allocates one pool
per kind with the GPU runtime (mono_common.ipc), zeroes it, exports its IPC handle; the
handles travel over the group's CPU collective (all_gather_object on a gloo group: SGLang's
TP CPU group in a server, any torch.distributed group in tests), and each rank opens its
peers' handles with lazy peer access. This reaches peers both across the GPUs of a node and
across rank processes sharing ONE GPU (torch symmetric memory refuses the latter: "detected
allocations from overlapping devices from different ranks"). Every step that can fail on one
rank alone (allocation, export, peer reachability, open) ends in an all-gather of every rank's
outcome, so a failure raises PeerAllocationError on EVERY rank at once, naming each rank's
failure, instead of leaving the other ranks waiting in a later collective. NVLink multicast
is never used. On ROCm every pool is fine-grained uncached memory
(hipExtMallocWithFlags(hipDeviceMallocUncached)): peers write the flags AND the mailbox data,
and coarse-grained memory does not keep another GPU's writes visible to polls (anchors.md
section 5, RCCL #1687). Pools live as long as the process (a server keeps them for life).

`allocate_local` gives the same tables for R simulated ranks on one device in one process
(ranks side by side in one launch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

GRANULE = 2 << 20  # 2 MiB


def round_to_granule(nbytes: int) -> int:
    """Bytes rounded up to whole 2 MiB granules (at least one granule)."""
    if nbytes < 0:
        raise ValueError(f"a region cannot have {nbytes} bytes")
    return max(1, -(-nbytes // GRANULE)) * GRANULE


@dataclasses.dataclass(frozen=True)
class Region:
    name: str
    nbytes: int  # as asked
    kind: str = "data"  # "data" or "flags": separate pools (flags are zeroed counters)
    offset: int = 0  # in the region's pool, granule-aligned
    size: int = 0  # granule-rounded


class PeerHandshakeError(RuntimeError):
    """The ranks asked for different peer-buffer layouts; raised on every rank alike."""


class PeerAllocationError(RuntimeError):
    """Some rank could not allocate, export, reach or open a pool; raised on every rank alike."""


def plan(requests: Sequence[tuple[str, int, str]]) -> list[Region]:
    """Granule-aligned layout of the requests [(name, nbytes, kind)] in the order given.

    Data and flag regions get separate pools, so offsets count within a region's own kind."""
    seen = set()
    out, next_off = [], {"data": 0, "flags": 0}
    for name, nbytes, kind in requests:
        if kind not in next_off:
            raise ValueError(f"region {name!r}: kind must be 'data' or 'flags', got {kind!r}")
        if name in seen:
            raise ValueError(f"region {name!r} requested twice")
        seen.add(name)
        size = round_to_granule(int(nbytes))
        out.append(Region(name, int(nbytes), kind, next_off[kind], size))
        next_off[kind] += size
    return out


def pool_bytes(regions: Sequence[Region], kind: str) -> int:
    return sum(r.size for r in regions if r.kind == kind)


AllGather = Callable[[object], list[object]]


@dataclasses.dataclass(frozen=True)
class Comm:
    """A rank group's CPU collective: this rank, the group size, and `all_gather(obj)`, which
    returns every rank's obj in rank order (every rank calls it, the same number of times)."""

    rank: int
    world: int
    all_gather: AllGather


def torch_all_gather(group=None) -> AllGather:
    """An AllGather over torch.distributed.all_gather_object (CPU objects, any backend)."""

    def gather(obj):
        import torch.distributed as dist

        out = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, obj, group=group)
        return out

    return gather


def torch_comm(group=None) -> Comm:
    """The `Comm` of a torch.distributed group (a gloo group keeps the exchange on the CPU)."""
    import torch.distributed as dist

    return Comm(dist.get_rank(group), dist.get_world_size(group), torch_all_gather(group))


def handshake(requests: Sequence[tuple[str, int, str]], all_gather: AllGather, rank: int) -> list[Region]:
    """Check that every rank asks for the same regions in the same order; return the layout.

    `all_gather(obj)` returns every rank's obj in rank order (torch_all_gather in serving, a
    fake in tests). Every rank compares every list, so all ranks reach the same verdict."""
    mine = [(str(n), int(b), str(k)) for n, b, k in requests]
    lists = [[tuple(x) for x in lst] for lst in all_gather(mine)]
    if not (0 <= rank < len(lists)) or lists[rank] != mine:
        raise PeerHandshakeError(f"all_gather returned no entry for rank {rank} equal to its own request")
    if any(lst != lists[0] for lst in lists):
        lines = ["peer buffers: the ranks asked for different sizes or orders; every rank stops:"]
        for q, lst in enumerate(lists):
            mark = "" if lst == lists[0] else "   <- differs from rank 0"
            lines.append(f"  rank {q}: " + ", ".join(f"{n}={b}B({k})" for n, b, k in lst) + mark)
        raise PeerHandshakeError("\n".join(lines))
    return plan(mine)


def _agree(comm: Comm, failure: str | None, step: str) -> None:
    """Every rank tells every rank whether `step` failed on it; if it failed anywhere, every
    rank raises the same PeerAllocationError naming each failed rank."""
    failures = comm.all_gather(failure)
    bad = [(q, f) for q, f in enumerate(failures) if f is not None]
    if bad:
        raise PeerAllocationError("\n".join(
            [f"peer buffers: {step} failed on {len(bad)} of {comm.world} ranks; every rank stops:"]
            + [f"  rank {q}: {f}" for q, f in bad]))


@dataclasses.dataclass
class PeerBuffers:
    """Allocated regions: `local[name]` is this rank's tensor view (uint8), `table[name]` the
    int64 device tensor of every rank's address of that region (indexed by rank)."""

    rank: int
    world: int
    regions: list[Region]
    local: dict[str, object]
    table: dict[str, object]
    keep: list  # handles that must outlive the buffers

    def scoped(self, prefix: str) -> PeerBuffers:
        """The regions named `prefix.<name>`, under `<name>` (one allocation serving several
        launches, e.g. one set of regions per width: `w2.glm53.ar1.mbox` -> `glm53.ar1.mbox`)."""
        cut = len(prefix) + 1
        names = [r.name for r in self.regions if r.name.startswith(prefix + ".")]
        if not names:
            raise KeyError(f"no peer region is named {prefix}.<name>")
        return PeerBuffers(
            self.rank, self.world,
            [dataclasses.replace(r, name=r.name[cut:]) for r in self.regions if r.name in names],
            {n[cut:]: self.local[n] for n in names}, {n[cut:]: self.table[n] for n in names}, self.keep)


#: The guard's abort flag as a peer region (int32 flag + spare word): every rank's flag lives
#: where every rank's programs reach it, so one rank's expired wait raises it on all ranks
#: (`abort_args` gives mono_common.guard_host.Guard's `abort=` argument).
ABORT_REGION = ("mono.guard.abort", 8, "flags")


def abort_args(bufs: PeerBuffers, name: str = ABORT_REGION[0]):
    """(this rank's int32 [2] abort flag, the int64 [world] table of every rank's): the
    `abort=` of a `Guard` for one rank of a world whose ranks are separate processes."""
    import torch

    return bufs.local[name][:8].view(torch.int32), bufs.table[name]


def _tables(regions, bases_by_kind, device):
    import torch

    return {
        r.name: torch.tensor([b + r.offset for b in bases_by_kind[r.kind]], dtype=torch.int64, device=device)
        for r in regions
    }


class _Pools:
    """This rank's pools and the peers' pools it opened; `release` frees and unmaps them (only
    on a failed allocation: the pools of a good one live as long as the process)."""

    def __init__(self, rt):
        self.rt, self.own, self.opened = rt, {}, {}

    def release(self) -> None:
        for addr in self.opened.values():
            try:
                self.rt.close(addr)
            except Exception:  # noqa: BLE001 - best effort on a path that is raising already
                pass
        for addr in self.own.values():
            try:
                self.rt.free(addr)
            except Exception:  # noqa: BLE001 - as above
                pass
        self.own, self.opened = {}, {}


def _device_identity(device):
    """(uuid, index) of a CUDA/HIP device, uuid None where torch does not report one."""
    import torch

    if device.type != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return (str(uuid) if uuid is not None else None, device.index)


def _unreachable(me, idents, device) -> list[str]:
    """Peers on another GPU this rank's GPU cannot access (checked only where that GPU is
    visible in this process; otherwise the IPC open decides)."""
    import torch

    if me is None or me[0] is None:
        return []
    visible = {}
    for i in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        if uuid is not None:
            visible[str(uuid)] = i
    bad = []
    for q, other in enumerate(idents):
        if other is None or other[0] is None or other[0] == me[0] or other[0] not in visible:
            continue
        if not torch.cuda.can_device_access_peer(device.index, visible[other[0]]):
            bad.append(f"its GPU cannot access rank {q}'s GPU (cuda:{visible[other[0]]} here) by peer "
                       "access: the in-kernel all-reduce needs P2P (NVLink or PCIe) between the TP GPUs")
    return bad


def allocate(requests: Sequence[tuple[str, int, str]], group=None, device=None, *,
             comm: Comm | None = None, runtime=None) -> PeerBuffers:
    """Handshake, then allocate every region on every rank of `group` (a torch.distributed
    group, best a gloo one; or `comm`), shared through IPC handles (see the module doc).

    Regions are zeroed once here (counters and flags start at 0 and only grow afterwards);
    when this returns on any rank, every rank's pools are zeroed and mapped. `runtime`: the
    mono_common.ipc.DeviceRuntime to use (tests pass a fake)."""
    import torch

    from mono_common import ipc

    comm = comm or torch_comm(group)
    regions = handshake(requests, comm.all_gather, comm.rank)
    device = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
    rt = runtime or ipc.runtime()
    kinds = [k for k in ("data", "flags") if pool_bytes(regions, k)]
    pools = _Pools(rt)
    handles, failure = {}, None
    try:
        rt.set_device(device.index)
        for kind in kinds:
            n = pool_bytes(regions, kind)
            # uncached: fine-grained on ROCm (peers write every region), plain cudaMalloc on CUDA
            pools.own[kind] = rt.malloc(n, uncached=True)
            rt.memset(pools.own[kind], 0, n)
        rt.synchronize()
        handles = {kind: rt.export(pools.own[kind]) for kind in kinds}
        me = _device_identity(device)
    except Exception as e:  # noqa: BLE001 - reported to every rank by _agree
        failure, me = f"{type(e).__name__}: {e}", None
    try:
        _agree(comm, failure, "allocating and exporting the pools")
        everyone = comm.all_gather((handles, me))
        failure = None
        try:
            problems = _unreachable(me, [x[1] for x in everyone], device)
            if problems:
                raise PeerAllocationError("; ".join(problems))
            for q, (their, _) in enumerate(everyone):
                if q != comm.rank:
                    for kind in kinds:
                        pools.opened[(q, kind)] = rt.open(their[kind])
        except Exception as e:  # noqa: BLE001 - reported to every rank by _agree
            failure = f"{type(e).__name__}: {e}"
        _agree(comm, failure, "opening the peers' pools")
    except PeerAllocationError:
        pools.release()
        raise
    bases = {kind: [pools.own[kind] if q == comm.rank else pools.opened[(q, kind)] for q in range(comm.world)]
             for kind in kinds}
    local = {r.name: rt.view(pools.own[r.kind] + r.offset, r.size, device) for r in regions}
    tables = _tables(regions, bases, device)
    comm.all_gather(None)  # every rank has its tables before any rank's kernel may write a peer
    return PeerBuffers(comm.rank, comm.world, regions, local, tables, [pools])


def allocate_local(requests: Sequence[tuple[str, int, str]], world: int, device=None) -> list[PeerBuffers]:
    """The buffers of `world` simulated ranks on ONE device, one `PeerBuffers` per rank, with
    the tables `allocate` gives: each rank's regions are a separate allocation, reached by the
    other ranks only through the address tables (nothing may rely on adjacency). For running
    several ranks' launches side by side on one GPU (tests, benchmarks); zeroed once."""
    import torch

    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    regions = plan(requests)
    device = torch.device(device if device is not None else "cuda")
    pools = {kind: [torch.zeros(max(1, pool_bytes(regions, kind)), dtype=torch.uint8, device=device)
                    for _ in range(world)] for kind in ("data", "flags")}
    bases = {kind: [p.data_ptr() for p in pools[kind]] for kind in pools}
    tables = _tables(regions, bases, device)
    out = []
    for rank in range(world):
        local = {r.name: pools[r.kind][rank][r.offset:r.offset + r.size] for r in regions}
        out.append(PeerBuffers(rank, world, regions, local, tables, [pools]))
    return out
