"""Do two launches on two streams run at the same time on this GPU? Each of two kernels
(P programs) bumps its own counter, then waits (bounded) for the other's to reach P.
Prints the counters each saw; with concurrency both see P.

PYTHONPATH=packages/mono-common/src python3 packages/mono-glm53/bench/diag_streams.py
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _pair(mine_ptr, other_ptr, seen_ptr, P, LIMIT):
    pid = tl.program_id(0)
    tl.atomic_add(mine_ptr, 1, sem="release")
    v = tl.atomic_add(other_ptr, 0, sem="acquire")
    i = 0
    while (v < P) & (i < LIMIT):
        v = tl.atomic_add(other_ptr, 0, sem="acquire")
        i += 1
    tl.store(seen_ptr + pid, v)


def main():
    for P in (16, 66, 132):
        c = torch.zeros(2, dtype=torch.int32, device="cuda")
        seen = torch.zeros(2, P, dtype=torch.int32, device="cuda")
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            _pair[(P,)](c[0:], c[1:], seen[0], P, 20_000_000)
        with torch.cuda.stream(s2):
            _pair[(P,)](c[1:], c[0:], seen[1], P, 20_000_000)
        torch.cuda.synchronize()
        print(f"P={P}: kernel A saw B at {int(seen[0].min())}/{P}, B saw A at {int(seen[1].min())}/{P}", flush=True)


if __name__ == "__main__":
    main()
