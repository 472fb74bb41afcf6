"""The real server on a tiny Qwen3.5 hybrid pair: `ddtree` over HTTP gives the target's own greedy
tokens (through Gated DeltaNet states verified along each tree branch) and accepts drafts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddtree_runtime.engine import Engine
from ddtree_runtime.loader import load_pair
from ddtree_runtime.tiny import TinyPair
from ddtree_runtime.tokenizer import Tokenizer
from tests.server.client import Server

PROMPT = "the city of"
TOKENS = 24


@pytest.mark.slow
def test_ddtree_server_on_a_hybrid_pair_returns_the_ar_text(hybrid_pair: TinyPair, tmp_path: Path) -> None:
    server = Server.start(
        ["--target", str(hybrid_pair.target), "--drafter", str(hybrid_pair.drafter), "--device", "cpu",
         "--mode", "ddtree", "--budget", "16", "--dtype", "float32", "--max-context", "512",
         "--served-model-name", "tiny-hybrid"],
        tmp_path / "hybrid.log",
    )  # fmt: skip
    try:
        target, _ = load_pair(hybrid_pair.target, None, torch.device("cpu"), torch.float32)
        tokenizer = Tokenizer(hybrid_pair.target)
        want = Engine(target, None, 512).generate(
            tokenizer.encode(PROMPT), mode="ar", max_new_tokens=TOKENS, eos_ids=()
        )
        server.wait_ready()
        status, body = server.post(
            "/v1/completions",
            {"model": "tiny-hybrid", "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0,
             "ignore_eos": True},
        )  # fmt: skip
        assert status == 200, body
        assert body["choices"][0]["text"] == tokenizer.decode(want.output_ids)
        metrics = server.metrics()
        assert metrics["vllm:spec_decode_num_accepted_tokens_total"] > 0
    finally:
        assert server.terminate() == 0
