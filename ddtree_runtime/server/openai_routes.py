"""The OpenAI routes: `/v1/models`, `/v1/completions` and `/v1/chat/completions`.

Handlers run on one asyncio loop and never wait on the engine: they validate (tokenizing a large
body in a worker thread, after a size check that needs no tokenizer), queue a `Job`, then await
its events.
Every completion also watches its connection, so a client that leaves, streamed or not, cancels
its generation before the engine's next phase and is counted as `abort`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ddtree_runtime.generation import GenerationResult
from ddtree_runtime.logprobs import TokenLogprob
from ddtree_runtime.server.admission import enqueue, off_loop_if_large, read_json
from ddtree_runtime.server.openapi import body_schema
from ddtree_runtime.server.protocol.errors import APIError
from ddtree_runtime.server.protocol.requests import ChatCompletionRequest, CompletionRequest
from ddtree_runtime.server.protocol.responses import (
    FINISH,
    ChatCompletionResponse,
    CompletionResponse,
    Reply,
    TextStream,
)
from ddtree_runtime.server.protocol.validation import Request as ParsedRequest
from ddtree_runtime.server.protocol.validation import parse_request
from ddtree_runtime.server.request_log import record_of
from ddtree_runtime.server.state import State
from ddtree_runtime.server.worker import Job, Scheduler
from ddtree_runtime.tokenizer import Tokenizer


def add_openai_routes(app: FastAPI, st: State) -> None:
    """`/v1/models`, `/v1/completions` and `/v1/chat/completions`, streamed or not."""

    def card() -> dict[str, Any]:
        limits = st.ready()[0]
        return {
            "id": st.model,
            "object": "model",
            "created": st.started,
            "owned_by": "specops",
            "root": st.settings.target,
            "max_model_len": limits.max_model_len,  # prompt + output
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        found = card()
        if model != st.model:
            raise APIError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")
        return found

    @app.post(
        "/v1/completions",
        openapi_extra=body_schema(CompletionRequest),
        response_model=CompletionResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def completions(request: Request) -> Response:
        return await _generate(st, request, chat=False)

    @app.post(
        "/v1/chat/completions",
        openapi_extra=body_schema(ChatCompletionRequest),
        response_model=ChatCompletionResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def chat_completions(request: Request) -> Response:
        return await _generate(st, request, chat=True)


async def _generate(st: State, request: Request, chat: bool) -> Response:
    """Admit and queue one completion, then answer it whole (here) or as a stream (`_stream`)."""
    record = record_of(request)
    body = await read_json(request)
    limits, tokenizer, _ = st.ready()
    req = await off_loop_if_large(request, parse_request, body, chat, limits, tokenizer)
    _describe(record, req)
    job = Job(req, asyncio.get_running_loop())
    enqueue(st.scheduler, job)
    record["job"] = job.number
    flow = _Flow(st, job, record)
    reply = Reply(req, st.model, tokenizer.token_text)
    if req.stream:
        return StreamingResponse(
            _stream(st, request, flow, reply, tokenizer),
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
    with st.tracked():
        watcher = asyncio.create_task(_until_gone(request, job, st.scheduler))
        try:
            while True:
                kind, payload = await job.events.get()
                if kind == "gone":
                    await _engine_released(job, payload)
                    flow.abort()
                    return Response(status_code=499)
                if kind == "error" or payload.stop_reason == "cancelled":
                    flow.finish("abort", job.tokens)
                    raise _shutting_down(payload)
                if kind == "done":
                    flow.done(payload)
                    return JSONResponse(
                        reply.body(
                            payload.text or "",
                            payload.stop_reason,
                            len(payload.output_ids),
                            payload.logprobs or (),
                            payload.prompt_logprobs,
                        )
                    )
        finally:
            watcher.cancel()
            flow.abort()  # only if nothing above finished it (e.g. the handler was cancelled)


def _describe(record: dict[str, Any], req: ParsedRequest) -> None:
    """What the log line says about a validated request (never its text)."""
    record.update(
        stream=req.stream, prompt_tokens=len(req.prompt_ids), max_tokens=req.max_tokens, mode=req.mode
    )
    if req.mode == "ddtree":
        record["budget"] = req.budget
    if req.logprobs is not None:
        record["logprobs"] = req.logprobs
    if req.ignored:
        record["ignored_fields"] = list(req.ignored)


def _sse(data: Any) -> bytes:
    """One SSE event: `data: <json>` (or `data: [DONE]`) and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"data: {payload}\n\n".encode()


async def _stream(
    st: State, request: Request, flow: _Flow, reply: Reply, tokenizer: Tokenizer
) -> AsyncIterator[bytes]:
    job = flow.job
    text = TextStream(tokenizer.decode, job.request.stop)
    first = True
    logprobs: list[TokenLogprob] = []  # of tokens whose event has not gone out yet
    if job.request.echo is not None:  # the prompt first (echo with logprobs is not streamed)
        yield _sse(reply.chunk(job.request.echo, first=True))
        first = False
    with st.tracked():
        watcher = asyncio.create_task(_until_gone(request, job, st.scheduler))
        try:
            while True:
                kind, payload = await job.events.get()
                if kind == "gone":
                    await _engine_released(job, payload)
                    flow.abort()
                    return
                if kind == "logprobs":  # comes just before its round's "tokens"
                    logprobs += payload
                    continue
                if kind == "tokens":
                    delta = text.push(payload)
                    if delta or logprobs:
                        yield _sse(reply.chunk(delta, first=first, logprobs=logprobs))
                        first, logprobs = False, []
                    continue
                if kind == "error" or payload.stop_reason == "cancelled":
                    error = _shutting_down(payload)
                    flow.finish("abort", job.tokens, error=error.message)
                    yield _sse(error.body())
                    yield _sse("[DONE]")
                    return
                result: GenerationResult = payload
                rest = text.finish(result.text or "")
                yield _sse(reply.chunk(rest, result.stop_reason, first=first, logprobs=logprobs))
                if job.request.include_usage:
                    yield _sse(reply.usage_chunk(len(result.output_ids)))
                yield _sse("[DONE]")
                flow.done(result)
                return
        finally:
            watcher.cancel()
            flow.abort()


@dataclass
class _Flow:
    """One completion request from the queue to its last event: its metrics and log record, once."""

    st: State
    job: Job
    record: dict[str, Any]
    finished: bool = False

    def finish(self, finished: str, tokens: int, **extra: Any) -> None:
        if self.finished:
            return
        self.finished = True
        job, now = self.job, time.perf_counter()
        queue_s = (job.started or now) - job.arrived
        ttft_s = None if job.first_token is None else job.first_token - job.arrived
        assert self.st.metrics is not None
        self.st.metrics.record_request(
            finished, len(job.request.prompt_ids), tokens, queue_s, ttft_s, now - job.arrived
        )
        self.record.update(
            finish_reason=finished,
            completion_tokens=tokens,
            queue_s=round(queue_s, 6),
            ttft_s=None if ttft_s is None else round(ttft_s, 6),
            e2e_s=round(now - job.arrived, 6),
            **extra,
        )

    def done(self, result: GenerationResult) -> None:
        self.finish(
            FINISH[result.stop_reason],
            len(result.output_ids),
            rounds=result.rounds,
            tau=round(result.mean_accepted, 4),
            engine_s=round(result.total_s, 6),  # e2e_s minus this: what serving the request added
        )

    def abort(self) -> None:
        """The client left (or the server stopped): out of the queue, or cancelled before the next phase."""
        if not self.finished:
            self.st.scheduler.withdraw(self.job)
            self.record.update(disconnected=True, status=499)
            self.finish("abort", self.job.tokens)


def _shutting_down(result: GenerationResult | APIError) -> APIError:
    return (
        result
        if isinstance(result, APIError)
        else APIError(503, "the server is shutting down", kind="server_error")
    )


async def _until_gone(request: Request, job: Job, scheduler: Scheduler) -> None:
    """Wait for the client to close its connection, then cancel the job at once (the engine stops
    before its next phase) and tell the handler, which answers and counts it."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.events.put_nowait(("gone", not scheduler.withdraw(job)))  # True: it was running


async def _engine_released(job: Job, was_running: bool) -> None:
    """After a client left: wait for a running job's last event before answering and logging, so
    the loop leaves the GIL to the engine while it stops (before its next phase)."""
    while was_running and (await job.events.get())[0] not in ("done", "error"):
        pass
