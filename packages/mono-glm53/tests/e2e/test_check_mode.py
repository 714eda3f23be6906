"""Check mode on a served model: SGLANG_AMD_MONO_CHECK=1, eager decode.

Starts the server with --disable-cuda-graph and SGLANG_AMD_MONO_CHECK=1, decodes at
concurrency 2, 4 and 8, and requires the log to show check lines for covered layers and
no "mono-glm53 check: layer" violation line. Needs the GPUs and the checkpoint
(see _server.py). Never run here (no GPU).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util as _ilu
import pathlib as _pl

_s = _ilu.spec_from_file_location("glm53_e2e_server", _pl.Path(__file__).with_name("_server.py"))
_server = _ilu.module_from_spec(_s)
_s.loader.exec_module(_server)
Server = _server.Server
def test_check_mode_has_no_violation():
    server = Server("--disable-cuda-graph", env={"SGLANG_AMD_MONO_CHECK": "1"})
    try:
        server.wait_ready()
        for width in (2, 4, 8):
            with concurrent.futures.ThreadPoolExecutor(width) as pool:
                list(pool.map(lambda i: server.generate(f"Count to {i}.", max_new_tokens=16), range(width)))
        log = server.log_text()
    finally:
        server.stop()
    assert "every covered layer also runs SGLang's layer" in log
    assert "mono-glm53 check: layer" not in log, [l for l in log.splitlines() if "mono-glm53 check" in l][:20]
