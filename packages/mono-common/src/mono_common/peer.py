"""Peer buffers for tensor-parallel ranks: granule layout, the size handshake, allocation.

A kernel asks for named regions (mailboxes, flags, ...). Every region is rounded up to whole
2 MiB granules; the layout is the same on every rank, so a region's address on rank q is
`base[q] + offset`, and the kernel gets one int64 table of those addresses per region.

The handshake runs BEFORE any allocation: every rank all-gathers its list of (name, bytes)
and compares the lists itself. If any rank differs, every rank raises the same
PeerHandshakeError (listing each rank's sizes) at once; no rank waits for a deadline.

Allocation uses torch.distributed._symmetric_memory (a kept library; no hand-made IPC on
CUDA). NVLink multicast is never used. On ROCm, flag regions (kind="flags") are put in
fine-grained, uncached memory (hipExtMallocWithFlags(hipDeviceMallocUncached), shared
through HIP IPC handles): coarse-grained memory does not keep polls of another GPU's
writes coherent (anchors.md section 5, RCCL #1687).
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
    kind: str = "data"  # "data" or "flags" (flags: fine-grained on ROCm)
    offset: int = 0  # in the region's pool, granule-aligned
    size: int = 0  # granule-rounded


class PeerHandshakeError(RuntimeError):
    """The ranks asked for different peer-buffer layouts; raised on every rank alike."""


def plan(requests: Sequence[tuple[str, int, str]]) -> list[Region]:
    """Granule-aligned layout of the requests [(name, nbytes, kind)] in the order given.

    Data and flag regions get separate pools (they may come from different allocators), so
    offsets count within a region's own kind."""
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


def torch_all_gather(group=None) -> AllGather:
    """An AllGather over torch.distributed.all_gather_object (CPU objects, any backend)."""

    def gather(obj):
        import torch.distributed as dist

        out = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, obj, group=group)
        return out

    return gather


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


def _tables(regions, bases_by_kind, device):
    import torch

    return {
        r.name: torch.tensor([b + r.offset for b in bases_by_kind[r.kind]], dtype=torch.int64, device=device)
        for r in regions
    }


def allocate(requests: Sequence[tuple[str, int, str]], group=None, device=None,
             all_gather: AllGather | None = None) -> PeerBuffers:
    """Handshake, then allocate every region symmetrically on the ranks of `group`.

    Regions are zeroed once here (counters and flags start at 0 and only grow afterwards)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    regions = handshake(requests, all_gather or torch_all_gather(group), rank)
    device = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
    rocm = bool(getattr(torch.version, "hip", None))
    local, bases, keep = {}, {}, []
    for kind in ("data", "flags"):
        total = pool_bytes(regions, kind)
        if not total:
            bases[kind] = [0] * world
            continue
        if kind == "flags" and rocm:
            pool, ptrs, handle = _rocm_uncached_pool(total, group, device)
        else:
            pool = symm.empty(total, dtype=torch.uint8, device=device)
            handle = symm.rendezvous(pool, dist.group.WORLD if group is None else group)
            ptrs = list(handle.buffer_ptrs)
        pool.zero_()
        keep.append((pool, handle))
        bases[kind] = ptrs
        for r in regions:
            if r.kind == kind:
                local[r.name] = pool[r.offset:r.offset + r.size]
    torch.cuda.synchronize(device)
    dist.barrier(group)  # every rank's zeroing is done before any peer may write
    return PeerBuffers(rank, world, regions, local, _tables(regions, bases, device), keep)


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


def _rocm_uncached_pool(nbytes: int, group, device):
    """Fine-grained uncached device memory shared through HIP IPC (ROCm only; not run here:
    no ROCm machine was available)."""
    import ctypes

    import torch.distributed as dist

    hip = ctypes.CDLL("libamdhip64.so")
    ptr = ctypes.c_void_p()
    hip_device_malloc_uncached = 0x3
    rc = hip.hipExtMallocWithFlags(ctypes.byref(ptr), ctypes.c_size_t(nbytes), hip_device_malloc_uncached)
    if rc != 0:
        raise RuntimeError(f"hipExtMallocWithFlags(uncached) failed: {rc}")
    handle = (ctypes.c_byte * 64)()
    rc = hip.hipIpcGetMemHandle(ctypes.byref(handle), ptr)
    if rc != 0:
        raise RuntimeError(f"hipIpcGetMemHandle failed: {rc}")
    handles = torch_all_gather(group)(bytes(handle))
    me = dist.get_rank(group)
    ptrs = []
    for q, h in enumerate(handles):
        if q == me:
            ptrs.append(ptr.value)
            continue
        peer = ctypes.c_void_p()
        hh = (ctypes.c_byte * 64).from_buffer_copy(h)
        rc = hip.hipIpcOpenMemHandle(ctypes.byref(peer), hh, 1)  # hipIpcMemLazyEnablePeerAccess
        if rc != 0:
            raise RuntimeError(f"hipIpcOpenMemHandle(rank {q}) failed: {rc}")
        ptrs.append(peer.value)
    # A uint8 tensor over the raw allocation, for zeroing and local views.
    pool = _tensor_from_ptr(ptr.value, nbytes, device)
    return pool, ptrs, (hip, ptr)


def _tensor_from_ptr(addr: int, nbytes: int, device):
    import torch

    class _Holder:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (addr, False), "version": 3}

    return torch.as_tensor(_Holder(), device=device)
