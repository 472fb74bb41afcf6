"""The OpenAI wire format: request models, validation, response bodies, stream chunks, streamed text.

Request bodies are pydantic models (they document themselves at `/docs`); everything a client sends
is checked here, before anything is queued, so a bad request costs no engine time and gets a 4xx
with OpenAI's error body (`{"error": {message, type, param, code}}`), which the `openai` client turns
into its typed exceptions. Shapes follow OpenAI's API and what vLLM's `bench serve` sends. Unknown
fields are accepted and named in the request's log line (as vLLM does); fields that would change
the output and are not implemented are refused with a 400 naming the field, never ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ddtree_runtime.config import ConfigError
from ddtree_runtime.tokenizer import Tokenizer

MAX_STOP = 4
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
# understood, not supported: accepted only at the value that changes nothing
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "prompt_logprobs": (None,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "top_k": (-1, 0),
    "min_p": (0, 0.0),
    "min_tokens": (0,),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "chat_template_kwargs": (None, {}),
}
NEUTRAL_WHY = {
    "tools": "tool calling is not implemented",
    "tool_choice": "tool calling is not implemented",
    "functions": "tool calling is not implemented",
    "function_call": "tool calling is not implemented",
    "response_format": "constrained decoding (json_object, json_schema) is not implemented",
    "guided_json": "constrained decoding is not implemented",
    "guided_regex": "constrained decoding is not implemented",
    "guided_choice": "constrained decoding is not implemented",
    "guided_grammar": "constrained decoding is not implemented",
    "structured_outputs": "constrained decoding is not implemented",
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


# ------------------------------------------------------------------------------------ request models
class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class DDTreeOptions(_Strict):
    """vLLM-style extra: `"ddtree": {"mode": "ddtree", "budget": 64}` (same as the top-level fields)."""

    mode: str | None = None
    budget: int | None = None


class _Sampling(_Strict):
    """Fields shared by completions and chat completions."""

    model: str | None = Field(None, description="the served model id (see /v1/models); optional")
    max_tokens: int | None = Field(None, ge=1, le=2**31 - 1)
    max_completion_tokens: int | None = Field(None, ge=1, le=2**31 - 1, description="wins over max_tokens")
    temperature: float | None = Field(
        None, ge=0, le=2, description="default: --temperature, else generation_config.json, else 0"
    )
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stop: str | list[str] | None = Field(None, description=f"up to {MAX_STOP} strings; [] = none")
    stop_token_ids: list[int] | None = Field(None, description="token ids that end generation (vLLM)")
    ignore_eos: bool = Field(False, description="vLLM extra: keep generating past EOS")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    mode: str | None = Field(None, description="specops extra: ar | dflash | ddtree, within --modes")
    budget: int | None = Field(None, description="specops extra: ddtree budget, within --budgets")
    ddtree: DDTreeOptions | None = Field(None, description='specops extra: {"mode": ..., "budget": N}')


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="one prompt: a string or a list of token ids (a one-element list of either is allowed)"
    )


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: str = Field(description=" | ".join(CHAT_ROLES))
    content: str | list[TextPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _known_role(self) -> ChatMessage:
        if self.role not in CHAT_ROLES:
            raise ValueError(f"needs a role, one of {', '.join(CHAT_ROLES)}")
        return self


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


# ----------------------------------------------------------------------------------- response models
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


_FIELDS = {
    name
    for model in (
        CompletionRequest,
        ChatCompletionRequest,
        ChatMessage,
        TextPart,
        StreamOptions,
        DDTreeOptions,
    )
    for name in model.model_fields
}


def _param(loc: tuple[int | str, ...]) -> str | None:
    """A pydantic error location as OpenAI's `param` (`messages[0].content`); union tags dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _FIELDS:
            out += f".{part}" if out else part
        else:
            break
    return out or None


# ------------------------------------------------------------------------------------------ requests
@dataclass(frozen=True)
class Limits:
    """What every request is checked against: the served model, the engine's cache, the defaults."""

    model: str
    max_context: int
    vocab_size: int
    block_size: int  # the drafter's (2 without one)
    modes: tuple[str, ...]
    budgets: tuple[int, ...]
    default_mode: str
    default_budget: int
    default_temperature: float
    default_top_p: float
    max_prompt_chars: int  # more characters than this cannot fit max_context tokens

    def rows(self, mode: str, budget: int) -> int:
        """Cache rows one verify round needs beyond prompt + output (the engine's rule)."""
        return {"ar": 1, "dflash": self.block_size, "ddtree": budget + 1}[mode]

    @property
    def max_model_len(self) -> int:
        """Prompt + output that every allowed (mode, budget) can serve."""
        most = max(self.rows(m, b) for m in self.modes for b in (self.budgets if m == "ddtree" else (0,)))
        return self.max_context - most


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
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    mode: str
    budget: int
    ignored: tuple[str, ...] = ()  # unknown fields, named in the log line


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (NaN, Infinity and lone surrogates are refused)."""

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
    try:  # a "\ud800" escape decodes to a lone surrogate, which no tokenizer can encode
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(
            400,
            f"the request body has an unpaired UTF-16 surrogate ({e.object[e.start : e.end]!a}), which is "
            "not a Unicode character (fix: send valid Unicode text)",
        ) from None
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
            why = NEUTRAL_WHY.get(name, "this server does not support it")
            raise APIError(400, f"{name}={value!r} is refused: {why} (fix: leave it out)", param=name)
    try:
        req = (ChatCompletionRequest if chat else CompletionRequest).model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = _param(first["loc"])
        raise APIError(400, f"{param or 'body'}: {first['msg']}", param=param) from None
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")
    mode, budget = _mode_budget(req, limits)
    if chat:
        assert isinstance(req, ChatCompletionRequest)
        prompt_ids = _chat_prompt(req, limits, tokenizer)
    else:
        assert isinstance(req, CompletionRequest)
        prompt_ids = _text_prompt(req, limits, tokenizer)
    if not prompt_ids:
        param = "messages" if chat else "prompt"
        raise APIError(400, "the prompt is empty (fix: send at least one token of prompt)", param=param)
    bad = [t for t in req.stop_token_ids or () if not 0 <= t < limits.vocab_size]
    if bad:
        raise APIError(400, f"stop_token_ids {bad[:5]} are outside the vocabulary", param="stop_token_ids")
    return Request(
        chat=chat,
        prompt_ids=prompt_ids,
        max_tokens=_max_tokens(req, chat, len(prompt_ids), limits.max_context - limits.rows(mode, budget)),
        temperature=limits.default_temperature if req.temperature is None else req.temperature,
        top_p=limits.default_top_p if req.top_p is None else req.top_p,
        seed=req.seed,
        stop=_stop(req.stop),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        stream=req.stream,
        include_usage=req.stream_options is not None and req.stream_options.include_usage,
        mode=mode,
        budget=budget,
        ignored=tuple(sorted(req.model_extra or {})),
    )


def _mode_budget(req: _Sampling, limits: Limits) -> tuple[str, int]:
    """The request's decoding mode and ddtree budget: top-level extras or `ddtree: {...}`."""
    nested = req.ddtree or DDTreeOptions()
    picked: dict[str, tuple[Any, str]] = {}
    for name in ("mode", "budget"):
        top, inner = getattr(req, name), getattr(nested, name)
        if top is not None and inner is not None and top != inner:
            raise APIError(400, f"{name} and ddtree.{name} disagree (fix: send one)", param=name)
        picked[name] = (top, name) if top is not None else (inner, f"ddtree.{name}")
    (mode, mode_param), (budget, budget_param) = picked["mode"], picked["budget"]
    mode = mode or limits.default_mode
    if mode not in limits.modes:
        raise APIError(
            400,
            f"{mode_param}={mode!r} is not served here (fix: one of {', '.join(limits.modes)}; the server's "
            "--modes sets them)",
            param=mode_param,
        )
    if budget is not None and mode != "ddtree":
        raise APIError(
            400,
            f"{budget_param} applies to mode ddtree only, not {mode} (fix: leave it out)",
            param=budget_param,
        )
    budget = limits.default_budget if budget is None else budget
    if mode == "ddtree" and budget not in limits.budgets:
        raise APIError(
            400,
            f"{budget_param}={budget} is not served here (fix: one of {', '.join(map(str, limits.budgets))}; "
            "the server's --budgets sets them)",
            param=budget_param,
        )
    return mode, budget


def _too_long(chars: int, limits: Limits, param: str) -> APIError:
    return APIError(
        400,
        f"the prompt has {chars} characters, more than {limits.max_context} tokens can hold (the "
        f"longest token has {limits.max_prompt_chars // limits.max_context}) (fix: shorten the prompt)",
        param=param,
        code="context_length_exceeded",
    )


def _text_prompt(req: CompletionRequest, limits: Limits, tokenizer: Tokenizer) -> list[int]:
    """`prompt`: a string, a token-id list, or a one-element list of either."""
    prompt: Any = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if len(prompt) > limits.max_prompt_chars:  # refused before the tokenizer spends seconds on it
            raise _too_long(len(prompt), limits, "prompt")
        return tokenizer.encode(prompt)
    if all(isinstance(t, int) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < limits.vocab_size]
        if bad:
            raise APIError(
                400,
                f"token ids {bad[:5]} are outside the vocabulary [0, {limits.vocab_size})",
                param="prompt",
            )
        return list(prompt)
    raise APIError(
        400,
        "prompt must be a string or a list of token ids; one prompt per request (fix: send one string)",
        param="prompt",
    )


def _chat_prompt(req: ChatCompletionRequest, limits: Limits, tokenizer: Tokenizer) -> list[int]:
    """`messages` through the model's chat template; content is a string or a list of text parts."""
    clean = []
    for m in req.messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        clean.append({"role": m.role, "content": content or ""})
    chars = sum(len(m["content"]) for m in clean)
    if chars > limits.max_prompt_chars:
        raise _too_long(chars, limits, "messages")
    try:
        return tokenizer.encode(tokenizer.apply_chat_template(clean))
    except (ConfigError, TemplateError) as e:
        raise APIError(400, f"the chat template refused the messages: {e}", param="messages") from None


def _max_tokens(req: _Sampling, chat: bool, prompt_len: int, usable: int) -> int:
    """`max_completion_tokens` or `max_tokens`; by default 16 for completions (OpenAI, vLLM) and
    whatever the context leaves for chat."""
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    asked = getattr(req, name)
    room = usable - prompt_len
    if room < 1 or (asked is not None and asked > room):
        raise APIError(
            400,
            f"this model's maximum context length is {usable} tokens, but the request needs "
            f"{prompt_len} prompt tokens + {asked or 1} completion tokens (fix: shorten the prompt or "
            f"lower {name})",
            param="messages" if chat else "prompt",
            code="context_length_exceeded",
        )
    if asked is not None:
        return asked
    return room if chat else min(COMPLETION_DEFAULT_MAX_TOKENS, room)


def _stop(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOP or not all(stops):
        raise APIError(
            400, f"stop must be a non-empty string or a list of up to {MAX_STOP} of them", param="stop"
        )
    return tuple(stops)


# ----------------------------------------------------------------------------------------- responses
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
