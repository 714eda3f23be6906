"""An injected wait fault must stop ALL ranks: no token of the failed step reaches a client.

Starts the TP server (TP 4 or 8, the kernel's default launcher) with the kernel's fault
injection (`MONO_GLM53_FAULT=rank1:stage12`, read by `mono_glm53.kernels.layer.fault_stage`
when a width's kernel is built: rank 1's program 0 never signals the hand-off into the MLA
stage), eager decode and no server warm-up, so the first routed step is the test's: two
requests decoding together, a 2-row step, which the kernel serves at every TP size. Rank 1's
other programs time out; the abort flag they raise lives in every rank's peer region
(mono_common.peer, allocated by build over SGLang's TP group), so every rank's launch stops
on it and, in the serving guard mode (fault), dies at address 0x0: an exception on every
rank before any output of the step is used. Requires: both requests fail (no completion
text), every TP rank's process exits, and the log holds each rank's error word as mono's
guard watcher logs it (mono_common.guard_watch): rank 1's timeout at stage 12, every other
rank's stop on the abort flag rank 1 raised.
Needs the GPUs and the checkpoint (see _server.py). Never run here. The same fault with the
ranks as processes on one H200: tests/kernels/test_tp_processes_gpu.py.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import importlib.util as _ilu
import pathlib as _pl
import time
import urllib.error

import pytest

_s = _ilu.spec_from_file_location("glm53_e2e_server", _pl.Path(__file__).with_name("_server.py"))
_server = _ilu.module_from_spec(_s)
_s.loader.exec_module(_server)
Server = _server.Server
tp_size = _server.tp_size
FAILED_REQUEST = (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException)


def test_wait_fault_stops_every_rank():
    tp = tp_size()
    if tp < 2:
        pytest.skip("a wait fault across ranks needs TP >= 2")
    server = Server("--disable-cuda-graph", "--skip-server-warmup", "--watchdog-timeout", "30",
                    env={"MONO_GLM53_FAULT": "rank1:stage12"})
    try:
        server.wait_ready()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(server.generate, f"Count to {n}.", max_new_tokens=64) for n in (10, 20)]
            for f in futures:
                with pytest.raises(FAILED_REQUEST):
                    out = f.result(timeout=600)
                    pytest.fail(f"a token of the failed step reached the client: {out!r}")
        deadline = time.time() + 120
        while server.proc.poll() is None and time.time() < deadline:
            time.sleep(2)
        assert server.proc.poll() is not None, "the server (some rank) kept running after the fault"
        log = server.log_text()
        assert f"mono-glm53 TP rank 1 of {tp}: guarded wait timed out: stage 12 (mla), rank 1" in log
        for r in range(tp):
            if r != 1:
                assert f"mono-glm53 TP rank {r} of {tp}: stopped on the abort flag raised by rank 1" in log, r
    finally:
        server.stop()
