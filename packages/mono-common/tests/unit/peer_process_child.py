"""One rank process of test_peer.py's cross-process handshake tests (CPU, gloo).

usage: python peer_process_child.py RANK WORLD OUT CASE
CASE "same": every rank asks for the same regions; "size" / "order": rank 1 asks otherwise.
`mono_common.peer.allocate` runs over a real gloo group (the collective SGLang's TP CPU group
gives a server) with a host-memory runtime: an opened handle yields the exporting rank's
address, recorded in the tables but never read (it belongs to another process).
"""

import ctypes
import sys

import torch

from mono_common import peer
from mono_common.testing import ranks

MiB = 1 << 20


class HostRuntime:
    def __init__(self):
        self.buffers, self.mallocs = {}, 0

    def set_device(self, index):
        pass

    def malloc(self, nbytes, uncached=False):
        self.mallocs += 1
        buf = (ctypes.c_uint8 * nbytes)()
        self.buffers[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def memset(self, addr, value, nbytes):
        ctypes.memset(addr, value, nbytes)

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
        return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(addr), dtype=torch.uint8)


def main():
    rank, world, out, (case,) = ranks.child_args()
    group = ranks.init_group(rank, world, timeout_s=60)
    req = [("mbox", 3 * MiB, "data"), ("flags", 100, "flags"), peer.ABORT_REGION]
    if rank == 1 and case == "size":
        req = [("mbox", 5 * MiB, "data")] + req[1:]
    if rank == 1 and case == "order":
        req = [req[1], req[0], req[2]]
    rt = HostRuntime()
    result = {"rank": rank}
    try:
        bufs = peer.allocate(req, group=group, device="cpu", runtime=rt)
        result.update(tables={n: bufs.table[n].tolist() for n in ("mbox", "flags", "mono.guard.abort")},
                      local={n: bufs.local[n].data_ptr() for n in ("mbox", "flags", "mono.guard.abort")})
    except peer.PeerHandshakeError as e:
        result.update(error=str(e))
    result["mallocs"] = rt.mallocs
    ranks.write_result(out, result)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
