"""TP ranks as separate processes on this machine, for GPU tests (no sglang needed).

The parent (a test) calls `run_ranks(script, world, *args)`: it starts `world` processes
`python script RANK WORLD STORE OUT *args`, waits for all of them (killing every one on a
timeout), and returns each rank's result dict. A child calls `child_args()` for (rank, world,
out, args), `init_group(rank, world)` for a gloo process group over a file store (the CPU
group peer buffers exchange their IPC handles over, as SGLang's TP CPU group does), and
`write_result(out, dict)` (JSON) before it exits. Ranks that share one GPU each see the
others' kernels run concurrently only under the CUDA MPS daemon (`nvidia-cuda-mps-control
-d`); without it they time-slice (milliseconds per switch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

_STORE = "MONO_RANKS_STORE"


def run_ranks(script: str, world: int, *args: str, timeout_s: float = 540.0,
              env: Mapping[str, str] | None = None,
              rank_env: Mapping[int, Mapping[str, str]] | None = None) -> list[dict]:
    """Run `world` rank processes of `script`; return [result of rank r] (a rank that wrote
    none gives {"exit": code, "log": its output's tail}). Raises TimeoutError, after killing
    every rank, when they do not all end within `timeout_s`."""
    tmp = tempfile.mkdtemp(prefix="mono-ranks-")
    store = os.path.join(tmp, "store")
    procs, logs, outs = [], [], []
    for r in range(world):
        out = os.path.join(tmp, f"rank{r}.json")
        log = open(os.path.join(tmp, f"rank{r}.log"), "w")
        e = {**os.environ, **(env or {}), **((rank_env or {}).get(r, {})), _STORE: store}
        procs.append(subprocess.Popen([sys.executable, script, str(r), str(world), out, *args],
                                      stdout=log, stderr=subprocess.STDOUT, env=e))
        logs.append(log)
        outs.append(out)
    end = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(timeout=max(1.0, end - time.monotonic()))
    except subprocess.TimeoutExpired as timeout:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        raise TimeoutError(f"{world} ranks of {os.path.basename(script)} ran past {timeout_s} s:\n"
                           + "\n".join(f"--- rank {r}\n{_tail(log.name)}" for r, log in enumerate(logs))
                           ) from timeout
    finally:
        for log in logs:
            log.close()
    results = []
    for r, (p, out) in enumerate(zip(procs, outs)):
        if os.path.exists(out):
            with open(out) as f:
                res = json.load(f)
            res.setdefault("exit", p.returncode)
            res.setdefault("log", _tail(logs[r].name))
        else:
            res = {"exit": p.returncode, "log": _tail(logs[r].name)}
        results.append(res)
    return results


def _tail(path: str, n: int = 4000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-n:]


def child_args(argv: Sequence[str] | None = None) -> tuple[int, int, str, list[str]]:
    """(rank, world, result path, the test's own args) of a rank process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return int(argv[0]), int(argv[1]), argv[2], argv[3:]


def init_group(rank: int, world: int, timeout_s: float = 300.0):
    """A gloo process group of the rank processes over the parent's file store; returns the
    default (WORLD) group."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + os.environ[_STORE], rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return dist.group.WORLD


def write_result(out: str, result: Mapping) -> None:
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(result), f)
    os.replace(tmp, out)
