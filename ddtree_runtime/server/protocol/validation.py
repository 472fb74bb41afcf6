"""A request body checked against the served model's `Limits`, into an engine-ready `Request`.

Tokenizing happens here too, after a size check that needs no tokenizer, so a prompt that cannot
fit is refused before the tokenizer spends seconds on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError
from pydantic import ValidationError

from ddtree_runtime.config import ConfigError
from ddtree_runtime.server.protocol.errors import APIError
from ddtree_runtime.server.protocol.fields import refuse_unsupported
from ddtree_runtime.server.protocol.requests import (
    MAX_STOP,
    ChatCompletionRequest,
    ChatMessage,
    ChatTemplateOptions,
    CompletionRequest,
    DDTreeOptions,
    Sampling,
    openai_param,
)
from ddtree_runtime.tokenizer import Tokenizer
from specops_contract import verify_rows

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions


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
        """Cache rows one round needs beyond prompt + output (the contract's rule, the engine's too)."""
        return verify_rows(mode, self.block_size, budget)

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
    logprobs: int | None = None  # top logprobs per generated token (0: the token's own only); None: off
    prompt_logprobs: int | None = None  # the same per prompt token (vLLM's extra)
    echo: str | None = None  # completions: the prompt's text, put before the completion's

    @property
    def prompt_top(self) -> int | None:
        """Top logprobs the prompt tokens need: `prompt_logprobs`'s, and with `echo` `logprobs`'."""
        asked = [
            n for n in (self.prompt_logprobs, None if self.echo is None else self.logprobs) if n is not None
        ]
        return max(asked, default=None)


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (NaN, Infinity and lone surrogates are refused)."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not valid JSON")

    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=refuse)
    except (UnicodeDecodeError, ValueError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e} (fix: send a JSON object)") from None
    except RecursionError:  # [[[[...]]]] deeper than the parser's stack: a client error, not a 500
        raise APIError(
            400, "the request body nests arrays or objects too deeply (fix: send a flat JSON object)"
        ) from None
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
    refuse_unsupported(body)
    if chat and body.get("echo") not in (None, False):  # vLLM's chat echo repeats the last message
        raise APIError(
            400,
            f"echo={body['echo']!r} is refused on chat completions: not implemented (fix: leave it out)",
            param="echo",
        )
    try:
        req = (ChatCompletionRequest if chat else CompletionRequest).model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = openai_param(first["loc"])
        raise APIError(400, f"{param or 'body'}: {first['msg']}", param=param) from None
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")
    if req.stream and req.prompt_logprobs is not None:  # as vLLM
        raise APIError(
            400,
            "prompt_logprobs are not streamed (fix: stream=false, or leave it out)",
            param="prompt_logprobs",
        )
    mode, budget = _mode_budget(req, limits)
    if chat:
        assert isinstance(req, ChatCompletionRequest)
        prompt_ids = _chat_prompt(req, limits, tokenizer)
    else:
        assert isinstance(req, CompletionRequest)
        prompt_ids = _text_prompt(req, limits, tokenizer)
    if req.truncate_prompt_tokens is not None:  # vLLM: the last N tokens (left truncation)
        prompt_ids = prompt_ids[-req.truncate_prompt_tokens :]
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
        logprobs=_logprobs(req),
        prompt_logprobs=req.prompt_logprobs,
        echo=_echo(req, prompt_ids, tokenizer),
    )


def _mode_budget(req: Sampling, limits: Limits) -> tuple[str, int]:
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
        # refused before the tokenizer spends seconds on it (unless it is to be truncated anyway)
        if len(prompt) > limits.max_prompt_chars and req.truncate_prompt_tokens is None:
            raise _too_long(len(prompt), limits, "prompt")
        return tokenizer.encode(prompt, req.add_special_tokens)
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
    chars = sum(len(m.plain_text()) for m in req.messages)
    if chars > limits.max_prompt_chars and req.truncate_prompt_tokens is None:
        raise _too_long(chars, limits, "messages")
    return tokenizer.encode(chat_text(req.messages, req, tokenizer), req.add_special_tokens)


def chat_text(messages: list[ChatMessage], options: ChatTemplateOptions, tokenizer: Tokenizer) -> str:
    """The prompt text of a conversation (chat completions and `/tokenize`); what the template
    cannot show is refused (400), never dropped: an assistant's tool calls need a template that
    renders them."""
    # vLLM's rule: the model either answers in a new turn or goes on with the last message
    sent = options.model_fields_set
    if options.continue_final_message and options.add_generation_prompt and "add_generation_prompt" in sent:
        raise APIError(
            400,
            "add_generation_prompt and continue_final_message cannot both be true (fix: send one)",
            param="continue_final_message",
        )
    clean = []
    for i, m in enumerate(messages):
        message: dict[str, Any] = {"role": m.role, "content": m.plain_text()}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_calls:
            if not tokenizer.renders_tool_calls:
                raise APIError(
                    400,
                    f"messages[{i}].tool_calls: this model's chat template does not show tool calls, so "
                    "the history would lose them (fix: send the calls as the message's text)",
                    param=f"messages[{i}].tool_calls",
                )
            message["tool_calls"] = [call.model_dump() for call in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        clean.append(message)
    try:
        return tokenizer.apply_chat_template(
            clean, options.add_generation_prompt, options.continue_final_message
        )
    except (ConfigError, TemplateError) as e:
        raise APIError(400, f"the chat template refused the messages: {e}", param="messages") from None


def _max_tokens(req: Sampling, chat: bool, prompt_len: int, usable: int) -> int:
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


def _logprobs(req: CompletionRequest | ChatCompletionRequest) -> int | None:
    """How many top logprobs per token (None: none asked for): completions' `logprobs` N, chat's
    `logprobs: true` with `top_logprobs` N (vLLM's rule: top_logprobs > 0 needs logprobs)."""
    if isinstance(req, CompletionRequest):
        return req.logprobs
    if not req.logprobs:
        if req.top_logprobs:
            raise APIError(
                400,
                f"top_logprobs={req.top_logprobs} needs logprobs=true (fix: send both)",
                param="top_logprobs",
            )
        return None
    return req.top_logprobs or 0


def _echo(req: Sampling, prompt_ids: list[int], tokenizer: Tokenizer) -> str | None:
    """The prompt text a completion with `echo` starts with: the prompt as sent, or the text of its
    tokens (token ids, or a truncated prompt)."""
    if not isinstance(req, CompletionRequest) or not req.echo:
        return None
    if req.stream and req.logprobs is not None:
        raise APIError(
            400, "echo with logprobs is not streamed (fix: stream=false, or leave out logprobs)", param="echo"
        )
    prompt: Any = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str) and req.truncate_prompt_tokens is None:
        return prompt
    return tokenizer.decode(prompt_ids)


def _stop(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOP or not all(stops):
        raise APIError(
            400, f"stop must be a non-empty string or a list of up to {MAX_STOP} of them", param="stop"
        )
    return tuple(stops)
