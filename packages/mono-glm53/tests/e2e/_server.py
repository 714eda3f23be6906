"""Helpers shared by the GLM-5.3 e2e tests: start an SGLang server, query it, stop it.

What every e2e test needs (none of it exists on the CI or the CPU machine, so these tests
are skipped there without --run-e2e, and have never been run):
- 8 H200 (sm_90, TP8) or 4/8 MI355X (gfx950, TP4/TP8) in one host;
- sglang 0.5.23 and mono-common + mono-glm53 pip-installed in the server's environment
  (the `sglang.srt.plugins` entry point must be registered);
- the GLM-5.3 FP8 block-128 checkpoint on local disk, its path in MONO_GLM53_CHECKPOINT;
- for GSM8K, the GSM8K test split as JSONL in MONO_GSM8K_JSONL (no network is assumed).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

CHECKPOINT_ENV = "MONO_GLM53_CHECKPOINT"
TP_ENV = "MONO_GLM53_TP"


def checkpoint() -> str:
    path = os.environ.get(CHECKPOINT_ENV)
    if not path or not os.path.isdir(path):
        pytest.skip(f"needs the GLM-5.3 FP8 checkpoint: set {CHECKPOINT_ENV} to its folder")
    return path


def tp_size() -> int:
    return int(os.environ.get(TP_ENV, "8"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra: str, env: dict | None = None, monokernel: bool = True):
        self.port = _free_port()
        args = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", checkpoint(),
            "--tp-size", str(tp_size()),
            "--page-size", "64",
            "--kv-cache-dtype", "bfloat16",
            "--port", str(self.port),
            *(("--enable-amd-monokernel",) if monokernel else ()),
            *extra,
        ]
        self.log = open(f"/tmp/mono-glm53-e2e-{self.port}.log", "w")
        self.proc = subprocess.Popen(
            args, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, timeout_s: float = 1800) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log: {self.log.name}")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(5)
        raise TimeoutError(f"server not ready in {timeout_s} s; log: {self.log.name}")

    def generate(self, text: str, **sampling) -> dict:
        body = json.dumps({"text": text, "sampling_params": {"temperature": 0, **sampling}})
        req = urllib.request.Request(self.url("/generate"), body.encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def post(self, path: str, payload: dict) -> dict:
        req = urllib.request.Request(self.url(path), json.dumps(payload).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server's own process group only
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()

    def log_text(self) -> str:
        with open(self.log.name) as f:
            return f.read()
