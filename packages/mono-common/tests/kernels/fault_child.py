"""Run by test_runtime_gpu in a subprocess: a chain launch in `fault` mode with one program that
never arrives. The process must die with an illegal-address error; before it does, the guard's
check prints the error word it read from pinned host memory."""

import os
import sys

from mono_common import errors
from mono_common.chain_host import Chain
from mono_common.guard_host import Guard

if __name__ == "__main__":
    G = int(sys.argv[1])
    g = Guard(1, device="cuda", mode="fault", deadline_s=0.2)
    c = Chain(G, 2, guard=g)
    c.launch(stall=G // 2)
    try:
        g.check()
    except errors.MonoDeviceError as e:
        print(f"WORD: {e}", file=sys.stderr)
        print(f"CAUSE: {e.__cause__}", file=sys.stderr, flush=True)
        os._exit(3)  # no interpreter teardown on a dead CUDA context
    print("CHILD SURVIVED", flush=True)
    sys.exit(0)
