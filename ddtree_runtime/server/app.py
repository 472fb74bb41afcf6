"""The HTTP side: a FastAPI app (served by uvicorn) over the shared `State`.

Handlers run on one asyncio loop and never wait on the engine: they validate (tokenizing in a
worker thread, after a size check that needs no tokenizer), queue a `Job`, then await its events.
Every completion also watches its connection, so a client that leaves, streamed or not, cancels
its generation at the end of the current round and is counted as `abort`. One JSON log line per
request is written by `RequestLog`, just after the response's last byte.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ddtree_runtime.engine import GenerationResult
from ddtree_runtime.server.events import EventLog
from ddtree_runtime.server.metrics import CONTENT_TYPE, Metrics
from ddtree_runtime.server.protocol import (
    FINISH,
    APIError,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    CompletionRequest,
    CompletionResponse,
    Limits,
    Reply,
    TextStream,
    parse_json,
    parse_request,
)
from ddtree_runtime.server.settings import Settings
from ddtree_runtime.server.worker import Job, QueueFull, Scheduler
from ddtree_runtime.tokenizer import Tokenizer

MAX_BODY = 16 * 2**20
RECORD = "specops.record"  # the scope key of a request's log record


@dataclass
class State:
    """Shared state of one server: settings, readiness, the queue, metrics, the in-flight count."""

    settings: Settings
    log: EventLog
    version: str
    state: str = "loading"  # loading | ready | draining
    scheduler: Scheduler = field(init=False)
    started: int = field(default_factory=lambda: int(time.time()))
    tokenizer: Tokenizer | None = None
    limits: Limits | None = None
    metrics: Metrics | None = None
    inflight: int = 0  # completion requests from acceptance to last byte (read by the drain)

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(self.settings.queue_size)
        self.model = self.settings.served_model_name or self.settings.target

    @contextmanager
    def tracked(self) -> Iterator[None]:
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1

    def ready(self) -> tuple[Limits, Tokenizer, Metrics]:
        if self.state != "ready" or self.limits is None or self.tokenizer is None or self.metrics is None:
            raise APIError(
                503, f"the server is {self.state}", kind="server_error", headers={"Retry-After": "1"}
            )
        return self.limits, self.tokenizer, self.metrics


class RequestLog:
    """ASGI middleware: one JSON line per HTTP request (method, path, status, seconds and what the
    handler put in the scope's record), never prompt text; a handler bug becomes a logged 500."""

    def __init__(self, app: ASGIApp, log: EventLog) -> None:
        self.app, self.log = app, log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record: dict[str, Any] = {}
        scope[RECORD] = record
        status = 500
        began = time.perf_counter()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as e:  # already answered 500 by the app's handler; keep serving
            record.update(error=f"{type(e).__name__}: {e}", trace=traceback.format_exc(limit=8))
        finally:
            self.log.write(
                "request",
                method=scope["method"],
                path=scope["path"],
                status=record.pop("status", status),
                seconds=round(time.perf_counter() - began, 6),
                **record,
            )


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class TokenizeRequest(BaseModel):
    """vLLM's `/tokenize`: a prompt, or chat messages through the chat template."""

    model_config = ConfigDict(strict=True, extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    model: str | None = None
    tokens: list[int] = Field(description="token ids to turn back into text")


def build_app(st: State) -> ASGIApp:
    """The routes; the returned app is wrapped in the request log."""
    app = FastAPI(title="specops DDTree server", version=st.version, openapi_url="/openapi.json")

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        _record(_)["error"] = e.message
        return _error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        method, path = request.method, request.url.path
        if e.status_code == 404:
            message = f"no route {method} {path} (fix: see /docs for the routes)"
            return _error(APIError(404, message, code="not_found"))
        if e.status_code == 405:
            message = f"{method} is not allowed on {path} (fix: one of {(e.headers or {}).get('Allow', '')})"
            return _error(APIError(405, message, code="method_not_allowed", headers=dict(e.headers or {})))
        return _error(APIError(e.status_code, str(e.detail)))

    @app.exception_handler(Exception)
    async def bug(_: Request, e: Exception) -> JSONResponse:
        return _error(APIError(500, "internal error", kind="server_error"))

    @app.get("/health", summary="200 once loaded and warmed; 503 while loading or draining")
    @app.get("/ping", summary="the same as /health (vLLM, SageMaker)")
    async def health() -> JSONResponse:
        return JSONResponse({"status": st.state}, status_code=200 if st.state == "ready" else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": st.version}

    @app.get("/metrics", summary="Prometheus text format, vLLM's metric names")
    async def metrics() -> Response:
        if st.metrics is None:
            raise APIError(
                503, f"the server is {st.state}", kind="server_error", headers={"Retry-After": "1"}
            )
        return Response(st.metrics.render(*st.scheduler.counts()), media_type=CONTENT_TYPE)

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

    @app.post("/tokenize", openapi_extra=_body_schema(TokenizeRequest))
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await _validated(TokenizeRequest, await _json(request))
        limits, tokenizer, _ = st.ready()
        _check_model(body.model, limits)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "send one of prompt or messages", param="prompt")
        if body.prompt is not None:
            text = body.prompt
        else:
            messages = [{"role": m.role, "content": _content(m)} for m in body.messages or ()]
            text = tokenizer.apply_chat_template(messages)
        if len(text) > limits.max_prompt_chars:
            raise APIError(400, f"the text has {len(text)} characters (fix: shorten it)", param="prompt")
        ids = await anyio.to_thread.run_sync(tokenizer.encode, text)
        return {"count": len(ids), "max_model_len": limits.max_model_len, "tokens": ids, "token_strs": None}

    @app.post("/detokenize", openapi_extra=_body_schema(DetokenizeRequest))
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await _validated(DetokenizeRequest, await _json(request))
        limits, tokenizer, _ = st.ready()
        _check_model(body.model, limits)
        bad = [t for t in body.tokens if not 0 <= t < limits.vocab_size]
        if bad:
            raise APIError(400, f"token ids {bad[:5]} are outside the vocabulary", param="tokens")
        return {"prompt": tokenizer.decode(body.tokens)}

    @app.post(
        "/v1/completions",
        openapi_extra=_body_schema(CompletionRequest),
        response_model=CompletionResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def completions(request: Request) -> Response:
        return await _generate(st, request, chat=False)

    @app.post(
        "/v1/chat/completions",
        openapi_extra=_body_schema(ChatCompletionRequest),
        response_model=ChatCompletionResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def chat_completions(request: Request) -> Response:
        return await _generate(st, request, chat=True)

    _add_schemas(app)
    return RequestLog(app, st.log)


# ------------------------------------------------------------------------------------------- helpers
def _record(request: Request) -> dict[str, Any]:
    return request.scope.setdefault(RECORD, {})


def _content(message: ChatMessage) -> str:
    content = message.content
    return "".join(p.text for p in content) if isinstance(content, list) else content or ""


def _check_model(model: str | None, limits: Limits) -> None:
    if model is not None and model != limits.model:
        raise APIError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")


async def _validated(kind: type[BaseModel], body: dict[str, Any]) -> Any:
    try:
        return kind.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(400, f"{param or 'body'}: {first['msg']}", param=param) from None


async def _json(request: Request) -> dict[str, Any]:
    """The body, size-checked while it arrives (Content-Length or chunked), parsed as a JSON object."""
    length = request.headers.get("content-length")
    if length is None and "transfer-encoding" not in request.headers:
        raise APIError(
            411,
            "a Content-Length header (or a chunked body) is required (fix: send the body with its length)",
            headers={"Connection": "close"},
        )
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
        raise APIError(
            413, f"the body has {length} bytes; the limit is {MAX_BODY}", headers={"Connection": "close"}
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise APIError(
                413, f"the body is over the limit of {MAX_BODY} bytes", headers={"Connection": "close"}
            )
        chunks.append(chunk)
    return parse_json(b"".join(chunks))


async def _until_gone(request: Request, job: Job) -> None:
    """Wait for the client to close its connection, then cancel the job (at its next round)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.put(("gone", None))


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
        )

    def abort(self) -> None:
        """The client left (or the server stopped): out of the queue, or cancelled at the next round."""
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


async def _generate(st: State, request: Request, chat: bool) -> Response:
    record = _record(request)
    body = await _json(request)
    limits, tokenizer, _ = st.ready()
    req = await anyio.to_thread.run_sync(parse_request, body, chat, limits, tokenizer)
    record.update(
        stream=req.stream, prompt_tokens=len(req.prompt_ids), max_tokens=req.max_tokens, mode=req.mode
    )
    if req.mode == "ddtree":
        record["budget"] = req.budget
    if req.ignored:
        record["ignored_fields"] = list(req.ignored)
    job = Job(req, asyncio.get_running_loop())
    try:
        st.scheduler.submit(job)
    except QueueFull as e:
        raise APIError(
            503,
            f"the server is busy: {e} (fix: retry later)",
            kind="server_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        ) from None
    record["job"] = job.number
    flow = _Flow(st, job, record)
    reply = Reply(req, st.model)
    if req.stream:
        return StreamingResponse(
            _stream(st, request, flow, reply, tokenizer),
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
    with st.tracked():
        watcher = asyncio.create_task(_until_gone(request, job))
        try:
            while True:
                kind, payload = await job.events.get()
                if kind == "gone":
                    flow.abort()
                    return Response(status_code=499)
                if kind == "error" or payload.stop_reason == "cancelled":
                    flow.finish("abort", job.tokens)
                    raise _shutting_down(payload)
                if kind == "done":
                    flow.done(payload)
                    return JSONResponse(
                        reply.body(payload.text or "", payload.stop_reason, len(payload.output_ids))
                    )
        finally:
            watcher.cancel()
            flow.abort()  # only if nothing above finished it (e.g. the handler was cancelled)


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
    with st.tracked():
        watcher = asyncio.create_task(_until_gone(request, job))
        try:
            while True:
                kind, payload = await job.events.get()
                if kind == "gone":
                    flow.abort()
                    return
                if kind == "tokens":
                    delta = text.push(payload)
                    if delta:
                        yield _sse(reply.chunk(delta, first=first))
                        first = False
                    continue
                if kind == "error" or payload.stop_reason == "cancelled":
                    error = _shutting_down(payload)
                    flow.finish("abort", job.tokens, error=error.message)
                    yield _sse(error.body())
                    yield _sse("[DONE]")
                    return
                result: GenerationResult = payload
                yield _sse(reply.chunk(text.finish(result.text or ""), result.stop_reason, first=first))
                if job.request.include_usage:
                    yield _sse(reply.usage_chunk(len(result.output_ids)))
                yield _sse("[DONE]")
                flow.done(result)
                return
        finally:
            watcher.cancel()
            flow.abort()


# ------------------------------------------------------------------------------------------- /docs
def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Document a body that the handler parses itself (to answer OpenAI-shaped errors)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def _add_schemas(app: FastAPI) -> None:
    """Put the request models into the OpenAPI components that `_body_schema` refers to."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = plain()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest):
                found = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(found.pop("$defs", {}))
                components[model.__name__] = found
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
