"""The OpenAI wire format: request validation, response bodies, stream chunks, streamed text.

Everything a client sends is checked here, before anything is queued, so a bad request costs no
engine time and always gets a 4xx with OpenAI's error body (`{"error": {message, type, param,
code}}`), which the `openai` client turns into its typed exceptions. Shapes follow OpenAI's API and
what vLLM's `bench serve` sends (`max_completion_tokens`, text-part lists as chat content,
`ignore_eos`, `repetition_penalty: 1.0`, `logprobs: null`). Fields that are not understood are
ignored, as vLLM does; fields understood but not supported are refused unless neutral.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from ddtree_runtime.config import ConfigError
from ddtree_runtime.tokenizer import Tokenizer

MAX_STOP = 4
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
# understood, not supported: accepted only at the value that changes nothing
NEUTRAL = {
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "top_k": (-1, 0),
    "min_p": (0, 0.0),
    "min_tokens": (0,),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
}


class APIError(Exception):
    """A request the server refuses; `body()` is OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What every request is checked against: the served model and the engine's cache."""

    model: str
    max_context: int
    verify_rows: int  # cache rows one verify pass needs beyond prompt + output (engine's rule)
    vocab_size: int
    default_temperature: float


@dataclass(frozen=True)
class Request:
    """One validated request, ready for the engine."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (NaN and Infinity are not JSON and are refused)."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not valid JSON")

    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=refuse)
    except (UnicodeDecodeError, ValueError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e} (fix: send a JSON object)") from None
    if not isinstance(body, dict):
        raise APIError(
            400, f"the request body is a JSON {type(body).__name__}, not an object (fix: send {{...}})"
        )
    return body


def parse_request(body: dict[str, Any], chat: bool, limits: Limits, tokenizer: Tokenizer) -> Request:
    """Validate an OpenAI completions (chat=False) or chat completions body."""
    model = body.get("model")
    if model is not None and model != limits.model:
        raise APIError(
            404,
            f"the model {model!r} does not exist; this server serves {limits.model!r} (fix: see /v1/models)",
            param="model",
            code="model_not_found",
        )
    for name, allowed in NEUTRAL.items():
        value = body.get(name)
        if value is not None and not any(type(value) is type(a) and value == a for a in allowed):
            raise APIError(
                400, f"{name}={value!r} is not supported by this server (fix: leave it out)", param=name
            )
    prompt_ids = _chat_prompt(body, tokenizer) if chat else _text_prompt(body, limits, tokenizer)
    if not prompt_ids:
        param = "messages" if chat else "prompt"
        raise APIError(400, "the prompt is empty (fix: send at least one token of prompt)", param=param)
    stream = _boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")
    if options is not None and not isinstance(options, dict):
        raise APIError(
            400, 'stream_options must be an object like {"include_usage": true}', param="stream_options"
        )
    return Request(
        chat=chat,
        prompt_ids=prompt_ids,
        max_tokens=_max_tokens(body, chat, len(prompt_ids), limits),
        temperature=_number(body, "temperature", limits.default_temperature, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        seed=_integer(body, "seed", None, 0, 2**63 - 1),
        stop=_stop(body),
        ignore_eos=_boolean(body, "ignore_eos", False),
        stream=stream,
        include_usage=_boolean(options or {}, "include_usage", False, "stream_options.include_usage"),
    )


def _text_prompt(body: dict[str, Any], limits: Limits, tokenizer: Tokenizer) -> list[int]:
    """`prompt`: a string, a token-id list, or a one-element list of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < limits.vocab_size]
        if bad:
            raise APIError(
                400,
                f"token ids {bad[:5]} are outside the vocabulary [0, {limits.vocab_size})",
                param="prompt",
            )
        return list(prompt)
    if prompt is None:
        raise APIError(400, 'prompt is required (fix: send "prompt": "...")', param="prompt")
    raise APIError(
        400,
        "prompt must be a string or a list of token ids; one prompt per request (fix: send one string)",
        param="prompt",
    )


def _chat_prompt(body: dict[str, Any], tokenizer: Tokenizer) -> list[int]:
    """`messages` through the model's chat template; content is a string or a list of text parts."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    clean = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
            raise APIError(400, f"{where} needs a role, one of {', '.join(CHAT_ROLES)}", param=where)
        content = m.get("content")
        if isinstance(content, list):
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content
            ):
                raise APIError(
                    400, f"{where}.content: only text parts are supported", param=f"{where}.content"
                )
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(
                400, f"{where}.content must be a string or a list of text parts", param=f"{where}.content"
            )
        clean.append({"role": m["role"], "content": content})
    try:
        return tokenizer.encode(tokenizer.apply_chat_template(clean))
    except (ConfigError, TemplateError) as e:
        raise APIError(400, f"the chat template refused the messages: {e}", param="messages") from None


def _max_tokens(body: dict[str, Any], chat: bool, prompt_len: int, limits: Limits) -> int:
    """`max_tokens` (or chat's `max_completion_tokens`); by default whatever the context leaves."""
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    room = limits.max_context - limits.verify_rows - prompt_len
    asked = _integer(body, name, None, 1, 2**31 - 1)
    if room < 1 or (asked is not None and asked > room):
        usable = limits.max_context - limits.verify_rows
        raise APIError(
            400,
            f"this model's maximum context length is {usable} tokens, but the request needs "
            f"{prompt_len} prompt tokens + {asked or 1} completion tokens (fix: shorten the prompt or "
            f"lower {name})",
            param="messages" if chat else "prompt",
            code="context_length_exceeded",
        )
    return room if asked is None else asked


def _number(
    body: dict[str, Any], name: str, default: float, low: float, high: float, low_open: bool = False
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise APIError(400, f"{name} must be a number, got {json.dumps(value)[:40]}", param=name)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise APIError(400, f"{name}={value} is outside {bracket}{low}, {high}]", param=name)
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, f"{name} must be an integer, got {json.dumps(value)[:40]}", param=name)
    if not low <= value <= high:
        raise APIError(400, f"{name}={value} is outside [{low}, {high}]", param=name)
    return value


def _boolean(body: dict[str, Any], name: str, default: bool, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(400, f"{param or name} must be true or false", param=param or name)
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or not 1 <= len(stops) <= MAX_STOP
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise APIError(
            400, f"stop must be a non-empty string or a list of 1 to {MAX_STOP} of them", param="stop"
        )
    return tuple(stops)


class Reply:
    """Response bodies and stream chunks of one request, in OpenAI's shapes."""

    def __init__(self, request: Request, model: str) -> None:
        self.request, self.model = request, model
        self.id = f"{'chatcmpl' if request.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.request.chat else "text_completion"
        return {
            "id": self.id,
            "object": f"{kind}.chunk" if chunk and self.request.chat else kind,
            "created": self.created,
            "model": self.model,
        }

    def usage(self, completion_tokens: int) -> dict[str, int]:
        n = len(self.request.prompt_ids)
        return {
            "prompt_tokens": n,
            "completion_tokens": completion_tokens,
            "total_tokens": n + completion_tokens,
        }

    def body(self, text: str, stop_reason: str, completion_tokens: int) -> dict[str, Any]:
        """The whole, non-streamed response."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": FINISH[stop_reason]}
        if self.request.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(False), "choices": [choice], "usage": self.usage(completion_tokens)}

    def chunk(self, text: str, stop_reason: str | None = None, first: bool = False) -> dict[str, Any]:
        """One stream event carrying `text` (chat: the role rides on the first one)."""
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": FINISH[stop_reason] if stop_reason else None,
        }
        if self.request.chat:
            choice["delta"] = (
                {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            )
        else:
            choice["text"] = text
        out = {**self._head(True), "choices": [choice]}
        if self.request.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        """The last event with `stream_options.include_usage`: no choices, the usage."""
        return {**self._head(True), "choices": [], "usage": self.usage(completion_tokens)}


class TextStream:
    """Streamed text that always ends up equal to the engine's final text.

    Each round decodes all tokens so far and releases only what can no longer change: text before
    the first stop string, minus a tail that could still grow into one, minus a trailing partial
    UTF-8 character (U+FFFD while a multi-byte token sequence is incomplete).
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...]) -> None:
        self.decode, self.stop = decode, stop
        self.ids: list[int] = []
        self.sent = ""

    def push(self, tokens: list[int]) -> str:
        """New tokens in; the text that is now safe to send out."""
        self.ids.extend(tokens)
        text = self.decode(self.ids)
        cuts = [text.find(s) for s in self.stop if s in text]
        text = text[: min(cuts)] if cuts else text[: len(text) - self._held(text)]
        return self._release(text.rstrip("\ufffd"))

    def finish(self, final_text: str) -> str:
        """The rest of the engine's final text."""
        return self._release(final_text)

    def _held(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        return max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)

    def _release(self, text: str) -> str:
        if not text.startswith(self.sent) or len(text) == len(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta
