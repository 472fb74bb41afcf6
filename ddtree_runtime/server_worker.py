"""One engine thread and the FIFO queue in front of it (batch 1).

The engine owns static caches sized once, so exactly one generation runs at a time, on the worker
thread. HTTP threads validate a request, wrap it in a `Job` and wait on the job's event queue; the
worker feeds that queue with each round's tokens (through the engine's `on_tokens`) and the final
result. A client that leaves frees its place at once: a waiting job is taken out of the queue, and a
running one is cancelled at the end of its current round (`on_tokens` answers False).
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddtree_runtime.engine import Engine, GenerationError
from ddtree_runtime.server_metrics import Metrics
from ddtree_runtime.server_protocol import APIError, Request


@dataclass
class Job:
    """A request on its way through the queue; `events` carries (kind, payload) to its HTTP thread:
    ("tokens", [ids]) per round, then ("done", GenerationResult) or ("error", APIError)."""

    request: Request
    number: int = 0  # set by Scheduler.submit: the order of arrival, for the logs
    events: queue.SimpleQueue[tuple[str, Any]] = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    started: float | None = None
    first_token: float | None = None


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
        """Take a job out of the queue (its client left); False if it already started."""
        with self.cond:
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
                job.events.put(("error", APIError(503, "the server is shutting down", kind="server_error")))
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
        mode: str,
        budget: int,
    ) -> None:
        super().__init__(name="engine", daemon=True)
        self.engine, self.scheduler, self.metrics, self.decode = engine, scheduler, metrics, decode
        self.mode, self.budget = mode, budget
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            job = self.scheduler.take(timeout=0.2)
            if job is None:
                continue
            try:
                outcome = self.serve(job)
            finally:
                self.scheduler.finish()
            job.events.put(outcome)  # after finish(): whoever sees "done" sees the engine free

    def serve(self, job: Job) -> tuple[str, Any]:
        """Run one job; ("done", GenerationResult) or ("error", APIError)."""
        req = job.request
        job.started = time.perf_counter()

        def on_tokens(tokens: list[int]) -> bool:
            if job.first_token is None:
                job.first_token = time.perf_counter()
            job.events.put(("tokens", tokens))
            return not job.cancelled.is_set()

        try:
            result = self.engine.generate(
                req.prompt_ids,
                mode=self.mode,
                budget=self.budget,
                max_new_tokens=req.max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                seed=req.seed,
                eos_ids=() if req.ignore_eos else None,
                stop=req.stop,
                decode=self.decode,
                on_tokens=on_tokens,
            )
        except GenerationError as e:  # validation should have caught it; still the client's request
            return "error", APIError(400, str(e))
        except Exception as e:  # an engine failure (e.g. out of memory) fails this request only
            return "error", APIError(500, f"generation failed: {type(e).__name__}: {e}", kind="server_error")
        self.metrics.record_rounds(result.accepted_per_round)
        return "done", result
