"""An injected wait fault must stop ALL ranks: no token of the failed step reaches a client.

Starts the TP server with the kernel's fault injection (`MONO_GLM53_FAULT=rank1:stage12`,
read by `mono_glm53.kernels.layer.fault_stage`: rank 1's program 0 never signals the hand-off
into the MLA stage, so rank 1's other programs time out and its peers stop on the abort
flag or their own all-reduce deadline) and a short --watchdog-timeout, sends a request, and
requires: the request fails (no completion text), every TP rank's process exits (the
server's process group is gone within the watchdog), and the log holds mono's error word
("guarded wait timed out" on one rank, "stopped on the abort flag" on the others).
Needs the GPUs and the checkpoint (see _server.py), and a server that serves TP > 1 with the
kernel, which the spec refuses today (no cross-GPU peer buffers yet). Never run here. The
same fault on ranks side by side on one H200 is tests/kernels
test_tp_injected_fault_on_one_rank_stops_every_rank.
"""

from __future__ import annotations

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
def test_wait_fault_stops_every_rank():
    if tp_size() < 2:
        pytest.skip("a wait fault across ranks needs TP >= 2")
    server = Server("--watchdog-timeout", "30", env={"MONO_GLM53_FAULT": "rank1:stage12"})
    try:
        server.wait_ready()
        with pytest.raises((urllib.error.URLError, ConnectionError, TimeoutError)):
            out = server.generate("Hello", max_new_tokens=8)
            pytest.fail(f"a token of the failed step reached the client: {out!r}")
        deadline = time.time() + 120
        while server.proc.poll() is None and time.time() < deadline:
            time.sleep(2)
        assert server.proc.poll() is not None, "the server (some rank) kept running after the fault"
        log = server.log_text()
        assert "guarded wait timed out" in log
        assert "stopped on the abort flag" in log
    finally:
        server.stop()
