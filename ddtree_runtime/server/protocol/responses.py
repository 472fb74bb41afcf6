"""Response bodies, stream chunks and streamed text, in OpenAI's shapes.

The pydantic models document the bodies at `/docs`; `Reply` builds them for one request, and
`TextStream` decides how much of the engine's text a stream may send so far.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from ddtree_runtime.generation import IncrementalText, first_stop
from ddtree_runtime.logprobs import TokenLogprob
from ddtree_runtime.server.protocol.validation import Request

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
MIN_LOGPROB = -9999.0  # what a -inf log-probability is reported as (JSON has no infinity; vLLM's value)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy shape: per generated token, its text, offset in the output text, logprob, and
    the top tokens' (with the token itself) by text."""

    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
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


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]  # the token's text as UTF-8


class TokenLogprobs(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobs]


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Reply:
    """Response bodies and stream chunks of one request, in OpenAI's shapes."""

    def __init__(self, request: Request, model: str, token_text: Callable[[int], str]) -> None:
        self.request, self.model, self.token_text = request, model, token_text
        self.id = f"{'chatcmpl' if request.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.text_offset = 0  # completions' logprobs: where the next token's text starts

    def logprobs(self, entries: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """A choice's `logprobs` for these generated tokens (None when the request asked for none,
        or a stream event carries no token)."""
        if self.request.logprobs is None or not entries:
            return None
        if self.request.chat:
            return {"content": [self._chat_logprob(e.token, e.logprob, e.top) for e in entries]}
        tokens = [self.token_text(e.token) for e in entries]
        offsets = []
        for token in tokens:
            offsets.append(self.text_offset)
            self.text_offset += len(token)
        tops = []
        for e in entries:
            top = {self.token_text(t): max(v, MIN_LOGPROB) for t, v in e.top}
            top.setdefault(self.token_text(e.token), max(e.logprob, MIN_LOGPROB))
            tops.append(top)
        return {
            "text_offset": offsets,
            "token_logprobs": [max(e.logprob, MIN_LOGPROB) for e in entries],
            "tokens": tokens,
            "top_logprobs": tops,
        }

    def _chat_logprob(
        self, token: int, logprob: float, top: tuple[tuple[int, float], ...] | None = None
    ) -> dict[str, Any]:
        text = self.token_text(token)
        out: dict[str, Any] = {
            "token": text,
            "logprob": max(logprob, MIN_LOGPROB),
            "bytes": list(text.encode()),
        }
        if top is not None:
            out["top_logprobs"] = [self._chat_logprob(t, v) for t, v in top]
        return out

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

    def body(
        self, text: str, stop_reason: str, completion_tokens: int, logprobs: Sequence[TokenLogprob] = ()
    ) -> dict[str, Any]:
        """The whole, non-streamed response."""
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": self.logprobs(logprobs),
            "finish_reason": FINISH[stop_reason],
        }
        if self.request.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(False), "choices": [choice], "usage": self.usage(completion_tokens)}

    def chunk(
        self,
        text: str,
        stop_reason: str | None = None,
        first: bool = False,
        logprobs: Sequence[TokenLogprob] = (),
    ) -> dict[str, Any]:
        """One stream event carrying `text` (chat: the role rides on the first one) and the
        logprobs of the tokens generated since the last event (their text may still be held)."""
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": self.logprobs(logprobs),
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

    Each round decodes only its new tokens (`IncrementalText`) and releases what can no longer
    change: text before the first stop string, minus a tail that could still grow into one; a
    partial UTF-8 character is never released. Only that held tail waits between rounds.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...]) -> None:
        self.text, self.stop = IncrementalText(decode), stop
        self.pending = ""  # decoded, not released yet
        self.sent = 0  # characters released so far
        self.stopped = False

    def push(self, tokens: list[int]) -> str:
        """New tokens in; the text that is now safe to send out."""
        if self.stopped:
            return ""
        added = self.text.push(tokens)
        self.pending += added
        cut = first_stop(self.pending, len(added), self.stop)
        self.stopped = cut is not None
        end = cut if cut is not None else len(self.pending) - self._held(self.pending)
        out, self.pending = self.pending[:end], self.pending[end:]
        self.sent += len(out)
        return out

    def finish(self, final_text: str) -> str:
        """The rest of the engine's final text."""
        rest = final_text[self.sent :]
        self.sent = len(final_text)
        return rest

    def _held(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        return max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
