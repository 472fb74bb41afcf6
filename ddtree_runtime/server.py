"""`python -m ddtree_runtime serve`: an OpenAI-compatible HTTP server for one target/drafter pair.

The standard library's threading HTTP server is enough: the engine runs one request at a time
(batch 1) on its own thread (`server_worker`), so HTTP threads only validate, wait and stream, and
the deployed runtime needs no web framework. Life cycle:

1. bind (127.0.0.1 by default) and answer at once: `/health` is 503 until the pair is loaded AND
   one warm-up generation has run (kernels compiled, caches touched), then 200;
2. serve `/v1/completions`, `/v1/chat/completions` (SSE streaming and not), `/v1/models`,
   `/metrics` (`server_metrics`); a full queue answers 503 with Retry-After;
3. on SIGTERM (or SIGINT): stop accepting, let in-flight and queued requests finish for up to
   `--drain-timeout` seconds (a second signal cuts that short), cancel the rest, exit 0.

Settings come from flags, else from `--env-file`, else defaults (`server_settings`); nothing from
that file is ever logged. Logs are JSON lines on stderr, one per request, without prompt text.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from ddtree_runtime.config import ConfigError
from ddtree_runtime.engine import Engine, GenerationError
from ddtree_runtime.loader import load_pair
from ddtree_runtime.server_metrics import Metrics
from ddtree_runtime.server_protocol import (
    FINISH,
    APIError,
    Limits,
    Reply,
    TextStream,
    parse_json,
    parse_request,
)
from ddtree_runtime.server_settings import (
    DEFAULT_MAX_CONTEXT,
    Settings,
    SettingsError,
    add_arguments,
    settings_from,
)
from ddtree_runtime.server_worker import Job, QueueFull, Scheduler, Worker
from ddtree_runtime.tokenizer import Tokenizer
from specops_contract import verify_rows

__all__ = ["add_arguments", "run"]  # what `ddtree_runtime.cli` wires into `serve`

MAX_BODY = 16 * 2**20
POLL_S = 0.1  # how often a waiting HTTP thread checks that its client is still there


class EventLog:
    """JSON lines on a stream: one per request plus start/stop events. Never prompt text or secrets."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.lock = stream, threading.Lock()

    def write(self, event: str, **fields_: Any) -> None:
        record = {
            "ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "event": event,
            **fields_,
        }
        line = json.dumps(record, default=str)
        with self.lock:
            self.stream.write(line + "\n")
            self.stream.flush()


class App:
    """Shared state of one server: settings, readiness, the queue, metrics, the in-flight count."""

    def __init__(self, settings: Settings, log: EventLog) -> None:
        self.settings, self.log = settings, log
        self.model = settings.served_model_name or settings.target
        self.state = "loading"  # loading | ready | draining
        self.stopping = threading.Event()  # first SIGTERM/SIGINT: drain
        self.hurry = threading.Event()  # second one: cancel what is left now
        self.scheduler = Scheduler(settings.queue_size)
        self.started = int(time.time())
        self.tokenizer: Tokenizer | None = None
        self.limits: Limits | None = None
        self.metrics: Metrics | None = None
        self.inflight = 0
        self.idle = threading.Condition()

    @contextmanager
    def tracked(self) -> Iterator[None]:
        """Counts a completion request from acceptance to its last byte, for the drain."""
        with self.idle:
            self.inflight += 1
        try:
            yield
        finally:
            with self.idle:
                self.inflight -= 1
                self.idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.inflight == 0, timeout)


class Handler(BaseHTTPRequestHandler):
    """Routes one connection's requests; each request ends with one log line."""

    protocol_version = "HTTP/1.1"
    server_version = "specops-ddtree"
    timeout = 300  # idle keep-alive connections and stalled readers give their thread back
    server: HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: `_dispatch` writes one structured line per request instead."""

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The base class's own refusals (bad request line, unknown method) in OpenAI's shape too."""
        self.close_connection = True
        error = APIError(code, message or explain or "bad request")
        self._send_json(code, error.body())
        self.app.log.write("request", method=self.command or None, status=code, error=error.message)

    def do_GET(self) -> None:
        self._dispatch(self._get)

    def do_POST(self) -> None:
        self._dispatch(self._post)

    @property
    def app(self) -> App:
        return self.server.app

    def _dispatch(self, route: Callable[[dict[str, Any]], int]) -> None:
        record: dict[str, Any] = {}
        began = time.perf_counter()
        status = 500
        try:
            status = route(record)
        except APIError as e:
            record["error"] = e.message
            status = self._send_json(e.status, e.body(), e.headers)
        except OSError:  # the client went away while we wrote
            record["disconnected"] = True
            status = 499
            self.close_connection = True
        except Exception as e:  # a bug must not take the server down; the client gets a 500
            record.update(error=f"{type(e).__name__}: {e}", trace=traceback.format_exc(limit=8))
            status = self._send_json(500, APIError(500, "internal error", kind="server_error").body())
        finally:
            self.app.log.write(
                "request",
                method=self.command,
                path=self.path.split("?", 1)[0],
                status=status,
                seconds=round(time.perf_counter() - began, 6),
                **record,
            )

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> int:
        return self._send(status, json.dumps(body).encode(), "application/json", headers)

    def _send(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> int:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        return status

    def _not_ready(self) -> APIError:
        return APIError(
            503, f"the server is {self.app.state}", kind="server_error", headers={"Retry-After": "1"}
        )

    def _get(self, record: dict[str, Any]) -> int:
        app, path = self.app, self.path.split("?", 1)[0]
        if path == "/health":
            return self._send_json(200 if app.state == "ready" else 503, {"status": app.state})
        if path == "/metrics":
            if app.metrics is None:
                raise self._not_ready()
            text = app.metrics.render(*app.scheduler.counts())
            return self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        if path == "/v1/models" or path.startswith("/v1/models/"):
            if app.state != "ready" or app.limits is None:
                raise self._not_ready()
            card = {
                "id": app.model,
                "object": "model",
                "created": app.started,
                "owned_by": "specops",
                "root": app.settings.target,
                "max_model_len": app.limits.max_context - app.limits.verify_rows,  # prompt + output
            }
            if path == "/v1/models":
                return self._send_json(200, {"object": "list", "data": [card]})
            if path.removeprefix("/v1/models/") != app.model:
                raise APIError(
                    404,
                    f"the model {path.removeprefix('/v1/models/')!r} does not exist",
                    param="model",
                    code="model_not_found",
                )
            return self._send_json(200, card)
        raise APIError(404, f"no route GET {path} (fix: see /v1/models, /health, /metrics)", code="not_found")

    def _post(self, record: dict[str, Any]) -> int:
        app, path = self.app, self.path.split("?", 1)[0]
        routes = {"/v1/completions": False, "/v1/chat/completions": True}
        if path not in routes:
            self._discard_body()
            raise APIError(
                404, f"no route POST {path} (fix: /v1/completions or /v1/chat/completions)", code="not_found"
            )
        body = parse_json(self._read_body())
        if app.state != "ready" or app.limits is None or app.tokenizer is None:
            raise self._not_ready()
        req = parse_request(body, routes[path], app.limits, app.tokenizer)
        record.update(stream=req.stream, prompt_tokens=len(req.prompt_ids), max_tokens=req.max_tokens)
        job = Job(req)
        with app.tracked():
            try:
                app.scheduler.submit(job)
            except QueueFull as e:
                raise APIError(
                    503,
                    f"the server is busy: {e} (fix: retry later)",
                    kind="server_error",
                    code="queue_full",
                    headers={"Retry-After": "1"},
                ) from None
            record["job"] = job.number
            reply = Reply(req, app.model)
            return self._stream(job, reply, record) if req.stream else self._complete(job, reply, record)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise APIError(411, "a Content-Length header is required (fix: send the body with its length)")
        if int(length) > MAX_BODY:
            self.close_connection = True
            raise APIError(413, f"the body has {length} bytes; the limit is {MAX_BODY}")
        return self.rfile.read(int(length))

    def _discard_body(self) -> None:
        length = self.headers.get("Content-Length", "")
        if length.isdigit() and int(length) <= MAX_BODY:
            self.rfile.read(int(length))
        else:
            self.close_connection = True

    def _client_gone(self) -> bool:
        """True when the peer closed (EOF or reset); pipelined bytes mean it is still there."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _next_event(self, job: Job) -> tuple[str, Any] | None:
        """The job's next event; None once the client has gone (the job is then withdrawn)."""
        while True:
            try:
                return job.events.get(timeout=POLL_S)
            except queue.Empty:
                if self._client_gone():
                    self.app.scheduler.withdraw(job)
                    return None

    def _finish(self, job: Job, record: dict[str, Any], finished: str, tokens: int, **extra: Any) -> None:
        """Metrics and the log record of a request that reached the queue."""
        now = time.perf_counter()
        queue_s = (job.started or now) - job.arrived
        ttft_s = None if job.first_token is None else job.first_token - job.arrived
        assert self.app.metrics is not None
        self.app.metrics.record_request(
            finished, len(job.request.prompt_ids), tokens, queue_s, ttft_s, now - job.arrived
        )
        record.update(
            finish_reason=finished,
            completion_tokens=tokens,
            queue_s=round(queue_s, 6),
            ttft_s=None if ttft_s is None else round(ttft_s, 6),
            e2e_s=round(now - job.arrived, 6),
            **extra,
        )

    def _abort(self, job: Job, record: dict[str, Any], tokens: int) -> int:
        self.app.scheduler.withdraw(job)
        self._finish(job, record, "abort", tokens, disconnected=True)
        self.close_connection = True
        return 499

    def _complete(self, job: Job, reply: Reply, record: dict[str, Any]) -> int:
        tokens = 0
        while True:
            event = self._next_event(job)
            if event is None:
                return self._abort(job, record, tokens)
            kind, payload = event
            if kind == "tokens":
                tokens += len(payload)
                continue
            if kind == "error" or payload.stop_reason == "cancelled":
                self._finish(job, record, "abort", tokens)
                raise (
                    payload
                    if kind == "error"
                    else APIError(503, "the server is shutting down", kind="server_error")
                )
            result = payload
            self._finish(
                job,
                record,
                FINISH[result.stop_reason],
                len(result.output_ids),
                rounds=result.rounds,
                tau=round(result.mean_accepted, 4),
            )
            return self._send_json(
                200, reply.body(result.text or "", result.stop_reason, len(result.output_ids))
            )

    def _stream(self, job: Job, reply: Reply, record: dict[str, Any]) -> int:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        assert self.app.tokenizer is not None
        text = TextStream(self.app.tokenizer.decode, job.request.stop)
        first, tokens = True, 0
        try:
            while True:
                event = self._next_event(job)
                if event is None:
                    return self._abort(job, record, tokens)
                kind, payload = event
                if kind == "tokens":
                    tokens += len(payload)
                    delta = text.push(payload)
                    if delta:
                        self._event(reply.chunk(delta, first=first))
                        first = False
                    continue
                if kind == "error" or payload.stop_reason == "cancelled":
                    error = (
                        payload
                        if kind == "error"
                        else APIError(503, "the server is shutting down", kind="server_error")
                    )
                    self._event(error.body())
                    self._event("[DONE]")
                    self._write_chunk(b"")
                    self._finish(job, record, "abort", tokens, error=error.message)
                    return 200
                result = payload
                self._event(reply.chunk(text.finish(result.text or ""), result.stop_reason, first=first))
                if job.request.include_usage:
                    self._event(reply.usage_chunk(len(result.output_ids)))
                self._event("[DONE]")
                self._write_chunk(b"")
                self._finish(
                    job,
                    record,
                    FINISH[result.stop_reason],
                    len(result.output_ids),
                    rounds=result.rounds,
                    tau=round(result.mean_accepted, 4),
                )
                return 200
        except OSError:
            return self._abort(job, record, tokens)

    def _event(self, data: Any) -> None:
        """One SSE event: `data: <json>` (or `data: [DONE]`) and a blank line."""
        payload = data if isinstance(data, str) else json.dumps(data)
        self._write_chunk(f"data: {payload}\n\n".encode())

    def _write_chunk(self, data: bytes) -> None:
        """One HTTP/1.1 chunk (an empty one ends the body)."""
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # listen backlog: hundreds of clients may connect at the same moment

    def __init__(self, address: tuple[str, int], app: App) -> None:
        self.app = app
        super().__init__(address, Handler)


def load(app: App) -> tuple[Engine, Tokenizer]:
    """The pair, its tokenizer and an engine; then the warm-up generation that /health waits for."""
    s = app.settings
    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SettingsError("--device cuda, but torch sees no CUDA device (fix: --device cpu)")
    dtype = getattr(torch, str(s.dtype))
    tokenizer = Tokenizer(s.target)
    target, drafter = load_pair(s.target, s.drafter if s.mode != "ar" else None, device, dtype)
    max_context = s.max_context or min(target.config.max_position_embeddings, DEFAULT_MAX_CONTEXT)
    engine = Engine(target, drafter, max_context)
    block = drafter.config.block_size if drafter is not None else 2
    rows = verify_rows(s.mode, block, s.budget)
    warm_ids = tokenizer.encode("Hello, world") or [0]
    if len(warm_ids) + 2 * block + rows > max_context:
        raise SettingsError(
            f"--mode {s.mode} --budget {s.budget} needs {rows} cache rows per verify round, which leaves "
            f"no room in --max-context {max_context} (fix: lower --budget or raise --max-context)"
        )
    began = time.perf_counter()
    try:
        engine.generate(warm_ids, mode=s.mode, budget=s.budget, max_new_tokens=2 * block, eos_ids=())
    except GenerationError as e:
        raise SettingsError(f"the warm-up generation was refused: {e}") from None
    app.log.write("warmed", seconds=round(time.perf_counter() - began, 3))
    app.tokenizer = tokenizer
    app.limits = Limits(app.model, max_context, rows, target.config.vocab_size, s.temperature)
    app.metrics = Metrics(app.model, s.mode, s.budget if s.mode == "ddtree" else block - 1, block - 1)
    return engine, tokenizer


def drain(app: App, httpd: HTTPServer, worker: Worker) -> None:
    """Stop accepting, let in-flight requests finish (bounded), cancel the rest, and wait for the
    engine thread to leave its round (exiting under a running torch op aborts the process)."""
    app.state = "draining"
    httpd.shutdown()
    httpd.socket.close()
    waiting, running = app.scheduler.counts()
    app.log.write("draining", waiting=waiting, running=running, timeout_s=app.settings.drain_timeout)
    deadline = time.monotonic() + app.settings.drain_timeout
    drained = app.wait_idle(0)
    while not drained and not app.hurry.is_set() and time.monotonic() < deadline:
        drained = app.wait_idle(min(0.2, max(0.0, deadline - time.monotonic())))
    if not drained:
        app.scheduler.cancel_all()
        app.wait_idle(5.0)
    worker.stop.set()
    worker.join(60)
    app.log.write("stopped", drained=drained)


def run(args: argparse.Namespace) -> int:
    """The `serve` command; exit 0 after a drain, 2 on bad settings or a pair that cannot load."""
    log = EventLog(sys.stderr)
    try:
        settings = settings_from(args)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    app = App(settings, log)
    try:
        httpd = HTTPServer((settings.host, settings.port), app)
    except OSError as e:
        print(
            f"error: cannot listen on {settings.host}:{settings.port}: {e.strerror} "
            "(fix: pick another --port or stop what holds it)",
            file=sys.stderr,
        )
        return 2

    def on_signal(*_: Any) -> None:
        (app.hurry if app.stopping.is_set() else app.stopping).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    host, port = httpd.server_address[:2]
    # the socket already listens; log that before serving, so no request line can come first
    log.write(
        "listening",
        host=host,
        port=port,
        pid=os.getpid(),
        model=app.model,
        mode=settings.mode,
        budget=settings.budget,
        device=settings.device,
        dtype=settings.dtype,
        max_context=settings.max_context,
        queue_size=settings.queue_size,
    )
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    try:
        engine, tokenizer = load(app)
    except (ConfigError, GenerationError, SettingsError) as e:
        print(f"error: {e}", file=sys.stderr)
        log.write("failed", error=str(e))
        httpd.shutdown()
        return 2
    worker = Worker(engine, app.scheduler, app.metrics, tokenizer.decode, settings.mode, settings.budget)
    worker.start()
    if not app.stopping.is_set():
        app.state = "ready"
        log.write("ready", max_context=app.limits.max_context if app.limits else None)
    while not app.stopping.wait(0.5):
        pass
    drain(app, httpd, worker)
    return 0
