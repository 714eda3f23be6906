"""Decode-vs-prefill KL for each width: the monokernel's decode logprobs against a prefill.

For a batch of b requests (b = 2, 4, 8: every served width), generate 64 tokens greedily
with top-20 logprobs on the monokernel server, then score the same prompt+completion in
one prefill (`input_logprobs`, which never runs the monokernel) and require the mean KL
of the top-20 distributions below 1e-3 and the greedy token to agree on >= 98% of steps.
Needs the GPUs and the checkpoint (see _server.py). Never run here (no GPU).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util as _ilu
import math
import pathlib as _pl

import pytest

_s = _ilu.spec_from_file_location("glm53_e2e_server", _pl.Path(__file__).with_name("_server.py"))
_server = _ilu.module_from_spec(_s)
_s.loader.exec_module(_server)
Server = _server.Server
PROMPTS = [f"Write a short paragraph about the number {i}." for i in range(8)]


def _kl(p: dict, q: dict) -> float:
    keys = set(p) & set(q)
    return sum(math.exp(p[k]) * (p[k] - q[k]) for k in keys)


@pytest.fixture(scope="module")
def server():
    s = Server()
    s.wait_ready()
    yield s
    s.stop()


@pytest.mark.parametrize("width", [2, 4, 8])
def test_decode_matches_prefill(server, width):
    def decode(prompt):
        return server.post("/generate", {
            "text": prompt,
            "sampling_params": {"temperature": 0, "max_new_tokens": 64},
            "return_logprob": True, "top_logprobs_num": 20,
        })

    with concurrent.futures.ThreadPoolExecutor(width) as pool:
        outs = list(pool.map(decode, PROMPTS[:width]))
    kls, agree, steps = [], 0, 0
    for prompt, out in zip(PROMPTS, outs):
        meta = out["meta_info"]
        full = prompt + out["text"]
        pre = server.post("/generate", {
            "text": full, "sampling_params": {"temperature": 0, "max_new_tokens": 1},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 20,
        })["meta_info"]["input_top_logprobs"]
        n = len(meta["output_top_logprobs"])
        for dec, pf in zip(meta["output_top_logprobs"], pre[-n - 1 : -1]):
            p = {t: lp for lp, t, *_ in dec}
            q = {t: lp for lp, t, *_ in pf}
            kls.append(_kl(p, q))
            agree += max(p, key=p.get) == max(q, key=q.get)
            steps += 1
    assert sum(kls) / len(kls) < 1e-3, (width, sum(kls) / len(kls))
    assert agree / steps >= 0.98, (width, agree / steps)
