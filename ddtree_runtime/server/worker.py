"""One engine thread and the FIFO queue in front of it (batch 1).

The engine owns static caches sized once, so exactly one generation runs at a time, on the worker
thread. Request handlers (on the HTTP event loop) validate a request, wrap it in a `Job` and await
the job's events; the worker feeds them through the loop's thread-safe call: each round's tokens
(streamed requests only: a non-streamed one needs no wake-up per round) and the final result. A
client that leaves frees its place at once: a waiting job is taken out of the queue, and a running
one is cancelled before the engine's next phase (the job's `cancelled` event).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddtree_runtime.engine import Engine, GenerationError
from ddtree_runtime.server.events import EventLog
from ddtree_runtime.server.metrics import Metrics
from ddtree_runtime.server.protocol.errors import APIError
from ddtree_runtime.server.protocol.validation import Request


@dataclass
class Job:
    """A request on its way through the queue; `events` carries (kind, payload) to its handler:
    ("tokens", [ids]) per round when streamed (after ("logprobs", [TokenLogprob]) when asked for), then
    ("done", GenerationResult) or ("error", APIError)."""

    request: Request
    loop: asyncio.AbstractEventLoop
    number: int = 0  # set by Scheduler.submit: the order of arrival, for the logs
    events: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    started: float | None = None
    first_token: float | None = None
    tokens: int = 0  # generated so far (the engine thread counts them)
    cancelled_at: float | None = None  # when its client was found gone (or the drain ran out)

    def put(self, event: tuple[str, Any]) -> None:
        """From any thread: hand an event to the handler on the event loop."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class QueueFull(Exception):
    """The waiting room is full; the client should retry later."""


class Scheduler:
    """FIFO waiting room of bounded size plus the one running job."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.waiting: collections.deque[Job] = collections.deque()
        self.running: Job | None = None
        self.cond = threading.Condition()
        self.numbers = itertools.count(1)

    def submit(self, job: Job) -> None:
        with self.cond:
            if len(self.waiting) >= self.capacity:
                raise QueueFull(f"{len(self.waiting)} requests are already waiting")
            job.number = next(self.numbers)
            self.waiting.append(job)
            self.cond.notify_all()

    def withdraw(self, job: Job) -> bool:
        """Cancel a job (its client left): out of the queue at once, or, if it is running, stopped at
        its next engine phase. False if it had already started."""
        with self.cond:
            job.cancelled_at = job.cancelled_at or time.perf_counter()
            job.cancelled.set()
            try:
                self.waiting.remove(job)
            except ValueError:
                return False
            self.cond.notify_all()
            return True

    def take(self, timeout: float) -> Job | None:
        """The next job, now running; None after `timeout` seconds of empty queue."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.waiting, timeout):
                return None
            self.running = self.waiting.popleft()
            return self.running

    def finish(self) -> None:
        with self.cond:
            self.running = None
            self.cond.notify_all()

    def counts(self) -> tuple[int, int]:
        """(waiting, running)."""
        with self.cond:
            return len(self.waiting), int(self.running is not None)

    def cancel_all(self) -> None:
        """Drop every waiting job and cancel the running one (end of a drain)."""
        with self.cond:
            for job in [*self.waiting, *([self.running] if self.running else [])]:
                job.cancelled.set()
                job.put(("error", APIError(503, "the server is shutting down", kind="server_error")))
            self.waiting.clear()
            self.cond.notify_all()


class Worker(threading.Thread):
    """Runs queued jobs through the engine, one at a time, until `stop` is set (between jobs)."""

    def __init__(
        self,
        engine: Engine,
        scheduler: Scheduler,
        metrics: Metrics,
        decode: Callable[[list[int]], str],
        draft_tokens: Callable[[str, int], int],
        log: EventLog,
    ) -> None:
        super().__init__(name="engine", daemon=True)
        self.engine, self.scheduler, self.metrics, self.decode = engine, scheduler, metrics, decode
        self.draft_tokens = draft_tokens  # (mode, budget) -> draft tokens verified per round
        self.log = log
        self.eos = tuple(engine.target.config.eos_token_ids)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            job = self.scheduler.take(timeout=0.2)
            if job is None:
                continue
            try:
                outcome = self.serve(job)
            finally:
                self.metrics.kv_usage.set(0)
                self.scheduler.finish()
                freed = time.perf_counter()
            job.put(outcome)  # after finish(): whoever sees "done" sees the engine free
            if job.cancelled_at is not None and job.started is not None and job.started < job.cancelled_at:
                # a running job was cancelled: how long its last round kept the engine after that
                self.log.write(
                    "cancelled",
                    job=job.number,
                    tokens=job.tokens,
                    engine_freed_after_s=round(freed - job.cancelled_at, 6),
                )

    def serve(self, job: Job) -> tuple[str, Any]:
        """Run one job; ("done", GenerationResult) or ("error", APIError)."""
        req = job.request
        job.started = last = time.perf_counter()
        if job.cancelled.is_set():  # its client left between the queue and here
            return "error", APIError(499, "the client left", kind="client_closed")
        max_context = self.engine.max_context
        prompt_len = len(req.prompt_ids)

        def on_tokens(tokens: list[int]) -> None:
            nonlocal last
            now = time.perf_counter()
            if job.first_token is None:
                job.first_token = now
            else:
                self.metrics.itl.observe(now - last)
            last = now
            job.tokens += len(tokens)
            self.metrics.kv_usage.set((prompt_len + job.tokens) / max_context)
            if req.stream:
                job.put(("tokens", tokens))

        eos = set(req.stop_token_ids) | (set() if req.ignore_eos else set(self.eos))
        try:
            result = self.engine.generate(
                req.prompt_ids,
                mode=req.mode,
                budget=req.budget,
                max_new_tokens=req.max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                seed=req.seed,
                eos_ids=tuple(eos),
                stop=req.stop,
                decode=self.decode,
                on_tokens=on_tokens,
                cancel=job.cancelled,
                logprobs=req.logprobs,
                on_logprobs=(lambda es: job.put(("logprobs", es))) if req.stream else None,
                prompt_top=req.prompt_top,
            )
        except GenerationError as e:  # validation should have caught it; still the client's request
            return "error", APIError(400, str(e))
        except Exception as e:  # an engine failure (e.g. out of memory) fails this request only
            return "error", APIError(500, f"generation failed: {type(e).__name__}: {e}", kind="server_error")
        if req.mode != "ar":
            self.metrics.record_rounds(self.draft_tokens(req.mode, req.budget), result.accepted_per_round)
        prefill = result.phase_s.get("prefill", 0.0)
        self.metrics.prefill_time.observe(prefill)
        self.metrics.decode_time.observe(max(0.0, result.total_s - prefill))
        return "done", result
