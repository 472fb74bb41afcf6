"""The official `openai` client against the real server: streamed and not, completions and chat."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from ddtree_runtime.tokenizer import Tokenizer
from tests.server.client import Server, sse_events
from tests.server.conftest import BUDGET, MODEL, ORACLE_TOKENS, PROMPT, Launched


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_health_is_503_until_loaded_and_warmed(main_server: Server) -> None:
    seen = main_server.health_seen
    assert seen[-1] == 200 and 503 in seen and set(seen[:-1]) == {503}, seen
    status, headers, body = main_server.early_post
    assert status == 503 and headers["retry-after"] == "1"
    assert json.loads(body)["error"]["type"] == "server_error"


def test_models(main_server: Server) -> None:
    c = client(main_server)
    assert [m.id for m in c.models.list().data] == [MODEL]
    assert c.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("other")
    card = json.loads(main_server.request("GET", "/v1/models")[2])["data"][0]
    assert card["max_model_len"] == 1024 - (BUDGET + 1)  # --max-context minus one verify round's rows


def test_chat_matches_generate_cli_streamed_and_not(main_server: Server, oracle: dict[str, Any]) -> None:
    c = client(main_server)
    messages = [{"role": "user", "content": PROMPT}]
    full = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=ORACLE_TOKENS)
    assert full.choices[0].message.content == oracle["text"]
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == len(oracle["output_ids"]) == ORACLE_TOKENS
    assert full.usage.prompt_tokens == oracle["prompt_tokens"]
    assert full.usage.total_tokens == oracle["prompt_tokens"] + ORACLE_TOKENS

    chunks = list(
        c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=ORACLE_TOKENS, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    with_choices = [ch for ch in chunks if ch.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in with_choices) == oracle["text"]
    assert len(with_choices) > 2  # it really streamed, round by round
    assert with_choices[-1].choices[0].finish_reason == "length"
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == ORACLE_TOKENS
    assert chunks[-1].usage.prompt_tokens == oracle["prompt_tokens"]


def test_completions_streamed_equals_not(main_server: Server, launched: Launched) -> None:
    c = client(main_server)
    prompt = "after the war his school"
    full = c.completions.create(model=MODEL, prompt=prompt, max_tokens=20)
    assert full.usage.prompt_tokens == len(Tokenizer(launched.pair.target).encode(prompt))
    assert full.usage.completion_tokens == 20 and full.choices[0].finish_reason == "length"
    stream = c.completions.create(model=MODEL, prompt=prompt, max_tokens=20, stream=True)
    chunks = list(stream)
    assert all(ch.usage is None for ch in chunks)  # no usage chunk unless asked for
    assert "".join(ch.choices[0].text for ch in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    ids = Tokenizer(launched.pair.target).encode(prompt)
    by_ids = c.completions.create(model=MODEL, prompt=ids, max_tokens=20)
    assert by_ids.choices[0].text == full.choices[0].text


def test_stop_strings_cut_the_same_streamed_or_not(main_server: Server) -> None:
    c = client(main_server)
    prompt = "first one new"
    words = c.completions.create(model=MODEL, prompt=prompt, max_tokens=24).choices[0].text.split(" ")
    stop = f" {words[6]} {words[7]}"  # two words: the stream must hold back the first one
    want = " ".join(words[:6])
    full = c.completions.create(model=MODEL, prompt=prompt, max_tokens=24, stop=[stop, "zzz"])
    assert full.choices[0].text == want and full.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(model=MODEL, prompt=prompt, max_tokens=24, stop=stop, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_sampling_seed_and_top_p(main_server: Server) -> None:
    c = client(main_server)
    prompt = "his time was"
    greedy = c.completions.create(model=MODEL, prompt=prompt, max_tokens=16).choices[0].text
    # a vanishing nucleus keeps only the target's top token: sampling at T=1 becomes greedy, exactly
    nucleus = c.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=1.0, top_p=1e-9)
    assert nucleus.choices[0].text == greedy
    args = {"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    first = c.completions.create(**args).choices[0].text
    assert c.completions.create(**args).choices[0].text == first
    assert "".join(ch.choices[0].text for ch in c.completions.create(**args, stream=True)) == first


def test_typed_errors_through_the_client(main_server: Server) -> None:
    c = client(main_server)
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-4", prompt="the", max_tokens=2)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="the " * 1100, max_tokens=2)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "the"}], temperature=7)
    assert e.value.param == "temperature"


def test_vllm_bench_serve_request_shapes(main_server: Server) -> None:
    """The payloads `vllm bench serve` sends (openai and openai-chat backends), parsed the way it
    parses them: text from chunks with choices, completion_tokens from the usage chunk."""
    common = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    completion = {
        **common,
        "prompt": "the war",
        "repetition_penalty": 1.0,
        "max_tokens": 12,
        "logprobs": None,
    }
    chat = {**common, "messages": [{"role": "user", "content": [{"type": "text", "text": "the war"}]}],
            "max_completion_tokens": 12}  # fmt: skip
    for path, body, field in (
        ("/v1/completions", completion, "text"),
        ("/v1/chat/completions", chat, "delta"),
    ):
        status, headers, raw = main_server.request("POST", path, body)
        assert status == 200 and headers["content-type"] == "text/event-stream"
        events = sse_events(raw)
        assert events[-1] == "[DONE]"
        text = "".join(
            (e["choices"][0]["text"] if field == "text" else e["choices"][0]["delta"].get("content") or "")
            for e in events[:-1] if e["choices"]
        )  # fmt: skip
        usage = [e["usage"] for e in events[:-1] if not e["choices"]]
        assert len(usage) == 1 and usage[0]["completion_tokens"] == 12
        assert len(text.split()) == 12  # one word per token with the tiny word-level tokenizer
