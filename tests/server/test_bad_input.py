"""Every kind of bad input gets a 4xx with OpenAI's error body, and the server keeps serving."""

from __future__ import annotations

import json
import socket

import pytest

from tests.server.client import Server
from tests.server.conftest import MODEL

C, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"model": MODEL, "prompt": "the city", "max_tokens": 2}
MSG = {"model": MODEL, "messages": [{"role": "user", "content": "the city"}], "max_tokens": 2}

CASES = [
    # (id, path, body, status, param, code)
    ("malformed json", C, b'{"prompt": "the",', 400, None, None),
    ("json array", C, b"[1, 2]", 400, None, None),
    ("json NaN", C, b'{"prompt": "the", "temperature": NaN}', 400, None, None),
    ("not utf-8", C, b"\xff\xfe{}", 400, None, None),
    ("unknown model", C, {**OK, "model": "gpt-4"}, 404, "model", "model_not_found"),
    ("prompt over context", C, {**OK, "prompt": "the " * 1100}, 400, "prompt", "context_length_exceeded"),
    ("max_tokens over context", C, {**OK, "max_tokens": 5000}, 400, "prompt", "context_length_exceeded"),
    ("chat over context", CHAT, {**MSG, "max_completion_tokens": 2000}, 400, "messages", "context_length_exceeded"),
    ("temperature text", C, {**OK, "temperature": "hot"}, 400, "temperature", None),
    ("temperature bool", C, {**OK, "temperature": True}, 400, "temperature", None),
    ("temperature high", C, {**OK, "temperature": 2.5}, 400, "temperature", None),
    ("temperature negative", CHAT, {**MSG, "temperature": -0.1}, 400, "temperature", None),
    ("top_p zero", C, {**OK, "top_p": 0}, 400, "top_p", None),
    ("top_p high", C, {**OK, "top_p": 1.5}, 400, "top_p", None),
    ("max_tokens zero", C, {**OK, "max_tokens": 0}, 400, "max_tokens", None),
    ("max_tokens fraction", C, {**OK, "max_tokens": 2.5}, 400, "max_tokens", None),
    ("max_tokens text", CHAT, {**MSG, "max_tokens": "10"}, 400, "max_tokens", None),
    ("seed over 64 bits", C, {**OK, "seed": 2**64}, 400, "seed", None),
    ("seed text", C, {**OK, "seed": "abc"}, 400, "seed", None),
    ("empty prompt", C, {**OK, "prompt": ""}, 400, "prompt", None),
    ("empty token list", C, {**OK, "prompt": []}, 400, "prompt", None),
    ("missing prompt", C, {"model": MODEL}, 400, "prompt", None),
    ("two prompts", C, {**OK, "prompt": ["the", "city"]}, 400, "prompt", None),
    ("token out of vocab", C, {**OK, "prompt": [5, 10**6]}, 400, "prompt", None),
    ("empty messages", CHAT, {**MSG, "messages": []}, 400, "messages", None),
    ("bad role", CHAT, {**MSG, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0]", None),
    ("content number", CHAT, {**MSG, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", None),
    ("image part", CHAT, {**MSG, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content", None),
    ("five stops", C, {**OK, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ("empty stop", C, {**OK, "stop": ""}, 400, "stop", None),
    ("n=2", C, {**OK, "n": 2}, 400, "n", None),
    ("penalty", CHAT, {**MSG, "presence_penalty": 0.5}, 400, "presence_penalty", None),
    ("top_k", C, {**OK, "top_k": 5}, 400, "top_k", None),
    ("include_usage text", C, {**OK, "stream": True, "stream_options": {"include_usage": 1}}, 400,
     "stream_options.include_usage", None),
    ("stream text", C, {**OK, "stream": "yes"}, 400, "stream", None),
    ("stream_options without stream", C, {**OK, "stream_options": {"include_usage": True}}, 400,
     "stream_options", None),
    ("unknown route", "/v1/embeddings", {"input": "x"}, 404, None, "not_found"),
    # issue 27: JSON nested past the parser's stack, tool calls the template cannot show, vLLM extras
    ("deep json", C, b'{"prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", 400, None, None),
    ("deep json tokenize", "/tokenize", b'{"prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", 400, None, None),
    ("tool call history", CHAT, {**MSG, "messages": [
        {"role": "user", "content": "the city"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}, 400, "messages[1].tool_calls", None),
    ("tool call without id", CHAT, {**MSG, "messages": [{"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, 400,
     "messages[0].tool_calls[0].id", None),
    ("both template flags", CHAT, {**MSG, "add_generation_prompt": True, "continue_final_message": True},
     400, "continue_final_message", None),
    ("truncate zero", C, {**OK, "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens", None),
    # issue 27 item 10: logprobs up to vLLM's cap, top_logprobs only with logprobs, what is not streamed
    ("logprobs over the cap", C, {**OK, "logprobs": 21}, 400, "logprobs", None),
    ("logprobs negative", C, {**OK, "logprobs": -1}, 400, "logprobs", None),
    ("logprobs bool on completions", C, {**OK, "logprobs": True}, 400, "logprobs", None),
    ("top_logprobs over the cap", CHAT, {**MSG, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
    ("top_logprobs without logprobs", CHAT, {**MSG, "top_logprobs": 2}, 400, "top_logprobs", None),
    ("prompt_logprobs over the cap", C, {**OK, "prompt_logprobs": 21}, 400, "prompt_logprobs", None),
    ("prompt_logprobs streamed", CHAT, {**MSG, "stream": True, "prompt_logprobs": 1}, 400, "prompt_logprobs", None),
    ("echo on chat", CHAT, {**MSG, "echo": True}, 400, "echo", None),
    ("echo streamed with logprobs", C, {**OK, "echo": True, "stream": True, "logprobs": 1}, 400, "echo", None),
]  # fmt: skip


def _error(data: bytes) -> dict[str, object]:
    body = json.loads(data)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_request_gets_openai_error(
    main_server: Server, path: str, body: object, status: int, param: str | None, code: str | None
) -> None:
    got, headers, data = main_server.request("POST", path, body)
    assert got == status, data
    assert headers["content-type"] == "application/json"
    error = _error(data)
    assert error["param"] == param and error["code"] == code
    assert error["type"] == "invalid_request_error"


def _raw(server: Server, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_transport_level_errors(main_server: Server) -> None:
    no_length = _raw(main_server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert no_length.startswith(b"HTTP/1.1 411")
    _error(no_length.split(b"\r\n\r\n", 1)[1])
    huge = _raw(main_server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
    assert huge.startswith(b"HTTP/1.1 413")
    status, _, data = main_server.request("GET", "/nowhere")
    assert status == 404
    _error(data)


def test_still_serving_after_bad_input(main_server: Server) -> None:
    assert main_server.request("GET", "/health")[0] == 200
    status, body = main_server.post(C, OK)
    assert status == 200 and body["usage"]["completion_tokens"] == 2
    assert main_server.proc.poll() is None
