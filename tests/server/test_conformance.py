"""What a user of vLLM's server expects (issue 17): defaults, fields that change the output, the
extra endpoints, HTTP details, and per-request `mode`/`budget` within what the server warmed."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import openai
import pytest

from ddtree_runtime.server.lifecycle import generation_defaults
from ddtree_runtime.server.protocol.validation import Limits, parse_request
from ddtree_runtime.tokenizer import Tokenizer
from tests.server.client import Server, sse_events, stream_text
from tests.server.conftest import BUDGET, BUDGETS, MODEL, MODES, Launched

C, CHAT = "/v1/completions", "/v1/chat/completions"
PROMPT = "after the war his school"


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def _raw(server: Server, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def _log(server: Server) -> list[dict[str, object]]:
    return [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]


# ------------------------------------------------------------------ defect 3: no silent ignores
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_format", {"type": "json_object"}),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
        ("guided_json", {"type": "object"}),
        ("tool_choice", "auto"),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        # vLLM's extras (issue 27, item 9): implemented, or refused by name
        ("use_beam_search", True),
        ("length_penalty", 0.5),
        ("bad_words", ["city"]),
        ("allowed_token_ids", [5, 6]),
        ("logits_processors", ["my.module:Processor"]),
        ("chat_template", "{{ messages }}"),
        ("spaces_between_special_tokens", False),
    ],
)
def test_output_changing_fields_are_refused_by_name(main_server: Server, field: str, value: object) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "the"}], "max_tokens": 2, field: value}
    status, out = main_server.post(CHAT, body)
    assert status == 400 and out["error"]["param"] == field and field in out["error"]["message"]


def test_neutral_values_of_those_fields_are_accepted(main_server: Server) -> None:
    body = {"model": MODEL, "prompt": "the", "max_tokens": 2, "response_format": {"type": "text"},
            "tool_choice": "none", "stop": [], "user": "someone"}  # fmt: skip
    status, out = main_server.post(C, body)
    assert status == 200 and out["usage"]["completion_tokens"] == 2


def test_stop_token_ids_end_generation_at_that_token(main_server: Server, launched: Launched) -> None:
    c = _client(main_server)
    tokenizer = Tokenizer(launched.pair.target)
    free = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12)
    ids = tokenizer.encode(free.choices[0].text)
    stop_id = ids[4]
    cut = ids.index(stop_id) + 1  # the first time it comes
    for stream in (False, True):
        body = {
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 12,
            "stop_token_ids": [stop_id],
            "stream": stream,
        }
        status, _, raw = main_server.request("POST", C, body)
        assert status == 200
        if stream:
            events = sse_events(raw)
            text, finish = stream_text(events, chat=False), events[-2]["choices"][0]["finish_reason"]
        else:
            out = json.loads(raw)
            text, finish = out["choices"][0]["text"], out["choices"][0]["finish_reason"]
            assert out["usage"]["completion_tokens"] == cut
        assert finish == "stop" and tokenizer.encode(text) == ids[:cut]  # a plain token stays in the text


# --------------------------------------------------------------- defect 4: vLLM's and OpenAI's defaults
def test_completion_defaults_to_16_tokens_and_reads_max_completion_tokens(main_server: Server) -> None:
    status, out = main_server.post(C, {"model": MODEL, "prompt": PROMPT, "ignore_eos": True})
    assert status == 200 and out["usage"]["completion_tokens"] == 16
    body = {"model": MODEL, "prompt": PROMPT, "ignore_eos": True, "max_completion_tokens": 5, "max_tokens": 9}
    status, out = main_server.post(C, body)
    assert status == 200 and out["usage"]["completion_tokens"] == 5


def test_negative_seed_is_a_seed_and_user_must_be_a_string(main_server: Server) -> None:
    args = {"model": MODEL, "prompt": "his time was", "max_tokens": 8, "temperature": 1.0, "seed": -7}
    first = main_server.post(C, args)
    assert first[0] == 200 and main_server.post(C, args)[1]["choices"] == first[1]["choices"]
    status, out = main_server.post(C, {"model": MODEL, "prompt": "the", "max_tokens": 2, "user": 123})
    assert status == 400 and out["error"]["param"] == "user"


def test_generation_config_defaults_apply_and_are_logged(tmp_path: Path, main_server: Server,
                                                         launched: Launched) -> None:  # fmt: skip
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True})
    )
    applied, not_applied = generation_defaults(str(tmp_path))
    assert applied == {"temperature": 0.6, "top_p": 0.95} and not_applied == {"top_k": 20}
    limits = Limits(MODEL, 1024, 69, 6, ("ddtree",), (BUDGET,), "ddtree", BUDGET, 0.6, 0.95, 10_000)
    tokenizer = Tokenizer(launched.pair.target)
    req = parse_request({"prompt": "the", "max_tokens": 2}, False, limits, tokenizer)
    assert (req.temperature, req.top_p) == (0.6, 0.95)
    req = parse_request({"prompt": "the", "temperature": 0, "top_p": 1}, False, limits, tokenizer)
    assert (req.temperature, req.top_p) == (0.0, 1.0)
    # the tiny target's own file has no sampling keys (do_sample: false): nothing applied, and said so
    logged = [e for e in _log(main_server) if e["event"] == "generation_defaults"]
    assert logged == [{**logged[0], "applied": {}, "not_applied": {}, "overridden_by_flag": None}]


def test_vllm_prompt_extras_change_the_prompt_as_vllm_does(main_server: Server, launched: Launched) -> None:
    """Issue 27, item 9: truncate_prompt_tokens, add_generation_prompt and continue_final_message."""
    tokenizer = Tokenizer(launched.pair.target)
    ids = tokenizer.encode(PROMPT)
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0}
    status, cut = main_server.post(C, {**body, "prompt": PROMPT, "truncate_prompt_tokens": 2})
    assert status == 200 and cut["usage"]["prompt_tokens"] == 2
    assert (
        cut["choices"][0]["text"]
        == main_server.post(C, {**body, "prompt": ids[-2:]})[1]["choices"][0]["text"]
    )

    user = [{"role": "user", "content": PROMPT}]
    closed = main_server.post("/tokenize", {"messages": user, "add_generation_prompt": False})[1]["tokens"]
    opened = main_server.post("/tokenize", {"messages": user})[1]["tokens"]
    assert opened[: len(closed)] == closed and len(opened) > len(closed)
    chat = main_server.post(CHAT, {**body, "messages": user, "add_generation_prompt": False})[1]
    assert chat["usage"]["prompt_tokens"] == len(closed)

    going_on = [*user, {"role": "assistant", "content": "the city"}]
    prompt = main_server.post("/tokenize", {"messages": going_on, "continue_final_message": True})[1][
        "tokens"
    ]
    assert prompt[-2:] == tokenizer.encode("the city")  # the turn is left open: no end-of-turn token
    chat = main_server.post(CHAT, {**body, "messages": going_on, "continue_final_message": True})[1]
    plain = main_server.post(C, {**body, "prompt": prompt})[1]
    assert chat["choices"][0]["message"]["content"] == plain["choices"][0]["text"]


def test_tool_call_history_reaches_a_template_that_shows_it(launched: Launched, tmp_path: Path) -> None:
    """Issue 27, item 9: an assistant's tool calls and the tool's answer go through the template (a
    template without them refuses the request, see test_bad_input)."""
    folder = tmp_path / "tools-target"
    folder.mkdir()
    (folder / "tokenizer.json").symlink_to(launched.pair.target / "tokenizer.json")
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}call {{ c.function.name }} {{ c.function.arguments }} {{ c.id }}"
        "{% endfor %}{% if m.tool_call_id %} for {{ m.tool_call_id }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tokenizer = Tokenizer(folder)
    limits = Limits(MODEL, 1024, 69, 6, ("ar",), (BUDGET,), "ar", BUDGET, 0.0, 1.0, 10_000)
    call = {"id": "c1", "type": "function", "function": {"name": "school", "arguments": "city"}}
    messages = [
        {"role": "user", "content": "the"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "war"},
    ]
    req = parse_request({"messages": messages, "max_tokens": 2}, True, limits, tokenizer)
    rendered = (
        "<|im_start|>user\nthe<|im_end|>\n<|im_start|>assistant\ncall school city c1<|im_end|>\n"
        "<|im_start|>tool\nwar for c1<|im_end|>\n<|im_start|>assistant\n"
    )
    assert req.prompt_ids == tokenizer.encode(rendered)


# ------------------------------------------------------------------------ defect 5: lone surrogates
@pytest.mark.parametrize(
    ("path", "raw"),
    [
        (C, b'{"prompt": "the \\ud800 city", "max_tokens": 2}'),
        (CHAT, b'{"messages": [{"role": "user", "content": "x\\udfff"}], "max_tokens": 2}'),
    ],
)
def test_lone_surrogate_is_a_400(main_server: Server, path: str, raw: bytes) -> None:
    status, _, data = main_server.request("POST", path, raw)
    assert status == 400 and "surrogate" in json.loads(data)["error"]["message"]


# --------------------------------------------------------------------------- defect 7: the endpoints
def test_tokenize_detokenize_version_ping(main_server: Server, launched: Launched) -> None:
    tokenizer = Tokenizer(launched.pair.target)
    status, out = main_server.post("/tokenize", {"model": MODEL, "prompt": PROMPT})
    assert status == 200 and out["tokens"] == tokenizer.encode(PROMPT) and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 1024 - (BUDGET + 1)
    chat = {"messages": [{"role": "user", "content": PROMPT}]}
    status, out = main_server.post("/tokenize", chat)
    assert status == 200 and out["tokens"] == tokenizer.prompt_ids(PROMPT)
    status, out = main_server.post("/detokenize", {"tokens": tokenizer.encode(PROMPT)})
    assert status == 200 and out["prompt"] == PROMPT
    status, out = main_server.post("/detokenize", {"tokens": [10**6]})
    assert status == 400 and out["error"]["param"] == "tokens"
    status, _, data = main_server.request("GET", "/version")
    assert status == 200 and json.loads(data)["version"]
    assert main_server.request("GET", "/ping")[0] == 200


def test_openapi_documents_the_request_models(main_server: Server) -> None:
    status, _, data = main_server.request("GET", "/openapi.json")
    schemas = json.loads(data)["components"]["schemas"]
    assert status == 200 and {"CompletionRequest", "ChatCompletionRequest", "ChatMessage"} <= set(schemas)
    assert {"prompt", "max_tokens", "stop_token_ids", "mode", "budget", "ddtree"} <= set(
        schemas["CompletionRequest"]["properties"]
    )
    assert main_server.request("GET", "/docs")[0] == 200


# ----------------------------------------------------------------------------- defect 8: HTTP details
def test_http_details(main_server: Server) -> None:
    body = json.dumps({"model": MODEL, "prompt": "the city", "max_tokens": 3}).encode()
    chunked = _raw(
        main_server,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        + f"{len(body[:10]):x}\r\n".encode() + body[:10] + b"\r\n"
        + f"{len(body[10:]):x}\r\n".encode() + body[10:] + b"\r\n0\r\n\r\n",
    )  # fmt: skip
    assert chunked.startswith(b"HTTP/1.1 200"), chunked[:200]
    assert json.loads(chunked.split(b"\r\n\r\n", 1)[1])["usage"]["completion_tokens"] == 3
    for method in (b"HEAD", b"OPTIONS", b"DELETE", b"PUT"):
        reply = _raw(
            main_server, method + b" /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert reply.startswith(b"HTTP/1.1 405"), (method, reply[:100])
        assert b"allow: post" in reply.lower()
    stream = json.dumps({"model": MODEL, "prompt": "the city", "max_tokens": 3, "stream": True}).encode()
    old = _raw(
        main_server,
        b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(stream)}\r\n\r\n".encode() + stream,
    )  # fmt: skip
    head, _, payload = old.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0]
    assert b"transfer-encoding" not in head.lower()  # HTTP/1.0 has no chunked framing
    assert sse_events(payload)[-1] == "[DONE]"
    garbage = _raw(main_server, b"\x16\x03\x01 garbage\r\n\r\n")
    assert garbage.startswith(b"HTTP/1.1 400")
    assert main_server.request("GET", "/health")[0] == 200


# ------------------------------------------------------------------- per-request mode and budget
def test_every_mode_and_budget_per_request_gives_the_ar_text(main_server: Server) -> None:
    warmed = [e for e in _log(main_server) if e["event"] == "warmed"]
    assert warmed[0]["pairs"] == [[m, b] for m in MODES for b in (BUDGETS if m == "ddtree" else (BUDGET,))]
    assert warmed[0]["draft_head"] == "target"  # auto on the CPU: the target's own head
    base = {"model": MODEL, "prompt": PROMPT, "max_tokens": 20, "ignore_eos": True}
    want = main_server.post(C, {**base, "mode": "ar"})[1]["choices"][0]["text"]
    before = main_server.metrics()
    for extra in ({"mode": "dflash"}, {"mode": "ddtree", "budget": 8}, {"ddtree": {"budget": 16}}, {}):
        status, out = main_server.post(C, {**base, **extra})
        assert status == 200 and out["choices"][0]["text"] == want, extra
    assert (
        main_server.metrics()["vllm:spec_decode_num_drafts_total"]
        > before["vllm:spec_decode_num_drafts_total"]
    )
    records = [e for e in _log(main_server) if e.get("path") == C and e.get("status") == 200][-4:]
    assert [(r["mode"], r.get("budget")) for r in records] == [
        ("dflash", None), ("ddtree", 8), ("ddtree", 16), ("ddtree", BUDGET)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "param", "needle"),
    [
        ({"mode": "beam"}, "mode", "ar, dflash, ddtree"),
        ({"budget": 32}, "budget", "8, 16"),
        ({"ddtree": {"budget": 64}}, "ddtree.budget", "8, 16"),
        ({"mode": "ar", "budget": 8}, "budget", "ddtree only"),
        ({"budget": 8, "ddtree": {"budget": 16}}, "budget", "disagree"),
    ],
)
def test_mode_and_budget_outside_the_served_set_are_refused(
    main_server: Server, extra: dict[str, object], param: str, needle: str
) -> None:
    status, out = main_server.post(C, {"model": MODEL, "prompt": "the", "max_tokens": 2, **extra})
    assert status == 400 and out["error"]["param"] == param and needle in out["error"]["message"]


def test_small_server_serves_only_its_mode(small_server: Server) -> None:
    status, out = small_server.post(C, {"prompt": "the", "max_tokens": 2, "mode": "ddtree"})
    assert status == 400 and out["error"]["param"] == "mode" and "one of ar" in out["error"]["message"]
