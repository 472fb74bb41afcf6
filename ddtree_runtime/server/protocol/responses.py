"""Response bodies, stream chunks and streamed text, in OpenAI's shapes.

The pydantic models document the bodies at `/docs`; `Reply` builds them for one request, and
`TextStream` decides how much of the engine's text a stream may send so far.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel

from ddtree_runtime.generation import IncrementalText, first_stop
from ddtree_runtime.server.protocol.validation import Request

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


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
