"""GSM8K on a served GLM-5.3 with --enable-amd-monokernel, against the same server without it.

Needs (see _server.py): the GPUs, the checkpoint (MONO_GLM53_CHECKPOINT), the GSM8K test
split as JSONL (MONO_GSM8K_JSONL, fields "question" and "answer"). Runs 200 questions
greedily at concurrency 1..8 (so every width 2/4/8 is served) and requires the accuracy
to be within 2 points of the stock server's and above 0.90. Never run here (no GPU).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util as _ilu
import json
import os
import pathlib as _pl
import re

import pytest

_s = _ilu.spec_from_file_location("glm53_e2e_server", _pl.Path(__file__).with_name("_server.py"))
_server = _ilu.module_from_spec(_s)
_s.loader.exec_module(_server)
Server = _server.Server

N = int(os.environ.get("MONO_GSM8K_N", "200"))


def _questions():
    path = os.environ.get("MONO_GSM8K_JSONL")
    if not path or not os.path.exists(path):
        pytest.skip("needs the GSM8K test split: set MONO_GSM8K_JSONL to a JSONL file")
    with open(path) as f:
        return [json.loads(line) for line in f][:N]


def _number(text):
    nums = re.findall(r"-?\d[\d,]*\.?\d*", text.replace("$", ""))
    return nums[-1].replace(",", "").rstrip(".") if nums else None


def _accuracy(server, items, concurrency):
    def one(item):
        prompt = f"Question: {item['question']}\nAnswer step by step, then give the final number.\nAnswer:"
        out = server.generate(prompt, max_new_tokens=512)["text"]
        return _number(out) == item["answer"].split("####")[-1].strip().replace(",", "")

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, items)) / len(items)


def test_gsm8k_matches_the_stock_server():
    items = _questions()
    scores = {}
    for mono in (False, True):
        server = Server(monokernel=mono)
        try:
            server.wait_ready()
            scores[mono] = [_accuracy(server, items, c) for c in (1, 4, 8)]
        finally:
            server.stop()
    for stock, ours in zip(scores[False], scores[True]):
        assert ours >= 0.90 and ours >= stock - 0.02, scores
