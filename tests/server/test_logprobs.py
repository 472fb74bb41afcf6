"""`logprobs`/`top_logprobs` on both routes, streamed and not, against the target's own forward.

The tiny tokenizer is word-level, so each reported token text names its id; the oracle is one
causal forward of the target (fp32, CPU) over prompt + output (see tests/runtime/test_logprobs.py
for why the values agree within fp32 rounding rather than bit for bit).
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import torch

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.loader import load_target
from ddtree_runtime.models.target import Target
from ddtree_runtime.tokenizer import Tokenizer
from tests.server.client import Server, sse_events
from tests.server.conftest import MODEL, Launched

C, CHAT = "/v1/completions", "/v1/chat/completions"
TOKENS = 10


@pytest.fixture(scope="module")
def target(launched: Launched) -> Target:
    model = load_target(launched.pair.target, torch.device("cpu"), torch.float32)
    model.setup_caches(64)
    return model


def forward_logprobs(target: Target, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: log_softmax (fp32) of one causal forward; row i is the distribution after ids[: i + 1]."""
    with torch.inference_mode():
        logits, _ = target(torch.tensor(ids), torch.arange(len(ids)), 0, None, TorchBackend(), False)
    return torch.log_softmax(logits.float(), dim=-1)


def check(
    target: Target, tokenizer: Tokenizer, prompt: list[int], out: list[tuple[str, float, dict[str, float]]]
) -> None:
    """`out`: per generated token its text, logprob and top (text -> logprob), as the server reported."""
    ids = [tokenizer.token_id(text) for text, _, _ in out]
    assert None not in ids
    want = forward_logprobs(target, prompt + ids[:-1])[len(prompt) - 1 :]
    for row, token, (_, logprob, top) in zip(want, ids, out, strict=True):
        assert logprob == pytest.approx(float(row[token]), abs=1e-5, rel=5e-6)
        best = row.topk(len(top))
        assert {tokenizer.token_id(t) for t in top} == set(best.indices.tolist())
        assert sorted(top.values(), reverse=True) == pytest.approx(best.values.tolist(), abs=1e-5, rel=5e-6)


def prompt_ids(tokenizer: Tokenizer) -> list[int]:
    return tokenizer.encode("after the war his school")


@pytest.mark.parametrize("mode", ["ar", "dflash", "ddtree"])
def test_completions_logprobs_are_the_targets(
    main_server: Server, launched: Launched, target: Target, mode: str
) -> None:
    tokenizer = Tokenizer(launched.pair.target)
    prompt = prompt_ids(tokenizer)
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": TOKENS,
        "logprobs": 3,
        "mode": mode,
        "ignore_eos": True,
    }
    status, out = main_server.post(C, body)
    assert status == 200, out
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == TOKENS
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(TOKENS)]
    # the token itself joins the top 3 when it is not among them
    tops = [
        {k: v for k, v in top.items() if k != token or len(top) == 3}
        for token, top in zip(lp["tokens"], lp["top_logprobs"], strict=True)
    ]
    assert all(len(t) == 3 for t in tops)
    check(target, tokenizer, prompt, list(zip(lp["tokens"], lp["token_logprobs"], tops, strict=True)))

    status, plain = main_server.post(C, {**body, "logprobs": None})
    assert status == 200 and plain["choices"][0]["logprobs"] is None
    assert plain["choices"][0]["text"] == out["choices"][0]["text"]  # asking changes no token


def test_chat_logprobs_streamed_and_not_with_the_openai_client(
    main_server: Server, launched: Launched, target: Target
) -> None:
    tokenizer = Tokenizer(launched.pair.target)
    c = openai.OpenAI(base_url=f"{main_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "the city of"}]
    args: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": TOKENS,
        "logprobs": True,
        "top_logprobs": 2,
    }
    full = c.chat.completions.create(**args)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens
    for entry in content:
        assert entry.bytes == list(entry.token.encode()) and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, True, False))
    check(
        target,
        tokenizer,
        prompt,
        [(e.token, e.logprob, {t.token: t.logprob for t in e.top_logprobs}) for e in content],
    )

    streamed = [
        e
        for ch in c.chat.completions.create(**args, stream=True)
        if ch.choices and ch.choices[0].logprobs
        for e in ch.choices[0].logprobs.content
    ]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]

    plain = c.chat.completions.create(**{**args, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == full.choices[0].message.content


def test_streamed_completion_logprobs_add_up_to_the_whole(main_server: Server) -> None:
    body = {"model": MODEL, "prompt": "the city of", "max_tokens": TOKENS, "logprobs": 0, "ignore_eos": True}
    status, whole = main_server.post(C, body)
    assert status == 200
    status, _, raw = main_server.request("POST", C, {**body, "stream": True})
    events = [e for e in sse_events(raw)[:-1] if e["choices"][0]["logprobs"]]
    assert len(events) > 1  # round by round
    joined = {
        k: [x for e in events for x in e["choices"][0]["logprobs"][k]]
        for k in whole["choices"][0]["logprobs"]
    }
    assert joined == whole["choices"][0]["logprobs"]
    assert all(len(top) == 1 for top in joined["top_logprobs"])  # logprobs=0: the token's own only
    lines = [json.loads(line) for line in main_server.log.read_text().splitlines() if line.startswith("{")]
    assert [r["logprobs"] for r in lines if r.get("path") == C and "logprobs" in r][-1:] == [
        0
    ]  # the log line names it


def test_prompt_logprobs_and_echo_on_completions(
    main_server: Server, launched: Launched, target: Target
) -> None:
    tokenizer = Tokenizer(launched.pair.target)
    prompt = prompt_ids(tokenizer)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
    status, plain = main_server.post(C, body)
    status, out = main_server.post(C, {**body, "echo": True, "logprobs": 2, "prompt_logprobs": 3})
    assert status == 200, out
    choice = out["choices"][0]
    assert choice["text"] == tokenizer.decode(prompt) + plain["choices"][0]["text"]
    want = forward_logprobs(target, prompt)[:-1]  # row i - 1: prompt token i
    ranks = [1 + int((row > row[t]).sum()) for row, t in zip(want, prompt[1:], strict=True)]

    ranked = choice["prompt_logprobs"]
    assert ranked[0] is None and len(ranked) == len(prompt)
    for row, token, rank, got in zip(want, prompt[1:], ranks, ranked[1:], strict=True):
        best = row.topk(3)
        assert {int(k) for k in got} == {token, *best.indices.tolist()}
        assert got[str(token)]["rank"] == rank and got[str(token)]["decoded_token"] == tokenizer.token_text(
            token
        )
        assert got[str(token)]["logprob"] == pytest.approx(float(row[token]), abs=1e-5, rel=5e-6)
        for k, (i, v) in enumerate(zip(best.indices.tolist(), best.values.tolist(), strict=True)):
            assert got[str(i)]["rank"] == k + 1 or i == token
            assert got[str(i)]["logprob"] == pytest.approx(v, abs=1e-5, rel=5e-6)

    lp = choice["logprobs"]  # the prompt's tokens first, the first one without a logprob
    n = len(prompt)
    assert lp["tokens"][:n] == [tokenizer.token_text(t) for t in prompt] and len(lp["tokens"]) == n + 4
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:n] == pytest.approx(
        [float(r[t]) for r, t in zip(want, prompt[1:], strict=True)], abs=1e-5
    )
    assert all(
        len({k for k in top if k != tok}) <= 2
        for tok, top in zip(lp["tokens"][1:], lp["top_logprobs"][1:], strict=True)
    )
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(n + 4)]


def test_chat_prompt_logprobs_ride_on_the_response(main_server: Server) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "the city of"}],
        "max_tokens": 2,
        "prompt_logprobs": 0,
    }
    status, out = main_server.post(CHAT, body)
    assert status == 200, out
    assert out["prompt_logprobs"][0] is None and out["usage"]["prompt_tokens"] == len(out["prompt_logprobs"])
    assert all(len(d) == 1 and next(iter(d.values()))["rank"] >= 1 for d in out["prompt_logprobs"][1:])
    assert "prompt_logprobs" not in out["choices"][0] and out["choices"][0]["logprobs"] is None


def test_streamed_echo_sends_the_prompt_first(main_server: Server) -> None:
    body = {"model": MODEL, "prompt": "the city of", "max_tokens": 6, "ignore_eos": True, "echo": True}
    status, whole = main_server.post(C, body)
    assert status == 200 and whole["choices"][0]["text"].startswith("the city of")
    status, _, raw = main_server.request("POST", C, {**body, "stream": True})
    events = sse_events(raw)[:-1]
    assert events[0]["choices"][0]["text"] == "the city of"
    assert "".join(e["choices"][0]["text"] for e in events) == whole["choices"][0]["text"]
