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
    token_logprobs: list[float | None]  # None: an echoed prompt's first token
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class PromptLogprob(BaseModel):
    """vLLM's entry of `prompt_logprobs` (keyed by token id)."""

    logprob: float
    rank: int | None
    decoded_token: str


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None
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
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None


class Reply:
    """Response bodies and stream chunks of one request, in OpenAI's shapes."""

    def __init__(self, request: Request, model: str, token_text: Callable[[int], str]) -> None:
        self.request, self.model, self.token_text = request, model, token_text
        self.id = f"{'chatcmpl' if request.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.text_offset = 0  # completions' logprobs: where the next token's text starts

    def logprobs(
        self, entries: Sequence[TokenLogprob], echoed: Sequence[TokenLogprob] | None = None
    ) -> dict[str, Any] | None:
        """A choice's `logprobs` for these generated tokens (None when the request asked for none,
        or a stream event carries no token); completions with `echo` put the prompt's first
        (`echoed`: those of the prompt's tokens after its first, which has none)."""
        n = self.request.logprobs
        if n is None or not (entries or echoed):
            return None
        if self.request.chat:
            return {"content": [self._chat_logprob(e.token, e.logprob, e.top) for e in entries]}
        rows: list[tuple[int, float | None, dict[str, float] | None]] = []
        if echoed is not None:
            rows.append((self.request.prompt_ids[0], None, None))
        for e in [*(echoed or ()), *entries]:
            top = {self.token_text(t): max(v, MIN_LOGPROB) for t, v in e.top[:n]}
            top.setdefault(self.token_text(e.token), max(e.logprob, MIN_LOGPROB))
            rows.append((e.token, max(e.logprob, MIN_LOGPROB), top))
        tokens = [self.token_text(token) for token, _, _ in rows]
        offsets = []
        for token in tokens:
            offsets.append(self.text_offset)
            self.text_offset += len(token)
        return {
            "text_offset": offsets,
            "token_logprobs": [logprob for _, logprob, _ in rows],
            "tokens": tokens,
            "top_logprobs": [top for _, _, top in rows],
        }

    def prompt_logprobs(self, entries: Sequence[TokenLogprob] | None) -> list[dict[str, Any] | None] | None:
        """vLLM's `prompt_logprobs`: none for the first prompt token, then per token a map from
        token id to logprob, rank and text, of the token and the `prompt_logprobs` most likely."""
        n = self.request.prompt_logprobs
        if n is None or entries is None:
            return None

        def one(token: int, logprob: float, rank: int | None) -> dict[str, Any]:
            return {
                "logprob": max(logprob, MIN_LOGPROB),
                "rank": rank,
                "decoded_token": self.token_text(token),
            }

        out: list[dict[str, Any] | None] = [None]
        for e in entries:
            ranked = {str(t): one(t, v, k + 1) for k, (t, v) in enumerate(e.top[:n])}
            ranked.setdefault(str(e.token), one(e.token, e.logprob, e.rank))
            out.append(ranked)
        return out

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
        self,
        text: str,
        stop_reason: str,
        completion_tokens: int,
        logprobs: Sequence[TokenLogprob] = (),
        prompt_logprobs: Sequence[TokenLogprob] | None = None,
    ) -> dict[str, Any]:
        """The whole, non-streamed response."""
        echo = self.request.echo
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": self.logprobs(logprobs, prompt_logprobs if echo is not None else None),
            "finish_reason": FINISH[stop_reason],
        }
        out = {**self._head(False), "choices": [choice], "usage": self.usage(completion_tokens)}
        if self.request.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text if echo is None else echo + text
        if self.request.prompt_logprobs is not None:  # vLLM: on the choice (completions), the response (chat)
            (out if self.request.chat else choice)["prompt_logprobs"] = self.prompt_logprobs(prompt_logprobs)
        return out

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
