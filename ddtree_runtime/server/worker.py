"""One engine thread and the FIFO queue in front of it.

The engine owns static caches sized once, on the worker thread: with `--max-batch 1` one
generation runs at a time (`Worker`, `Engine.generate`, CUDA-graphed rounds); with more, up to
`max_batch` jobs hold a cache slot each and decode together (`BatchWorker`, `BatchEngine`), joining
after their prefill and leaving at round boundaries, in order of arrival. Request handlers (on the
HTTP event loop) validate a request, wrap it in a `Job` and await the job's events; the worker
feeds them through the loop's `Mailbox` (one thread-safe call for a round's events): each round's
tokens (streamed requests only: a non-streamed one needs no wake-up per round) and the final
result. A client that leaves frees its place at once: a waiting job is taken out of the queue, and
a running one is cancelled before the engine's next phase or step (the job's `cancelled` event).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddtree_runtime.batching import BatchEngine
from ddtree_runtime.engine import Engine, GenerationError
from ddtree_runtime.generation import GenerationResult
from ddtree_runtime.server.events import EventLog
from ddtree_runtime.server.metrics import Metrics
from ddtree_runtime.server.protocol.errors import APIError
from ddtree_runtime.server.protocol.validation import Request


class Mailbox:
    """Events from the engine thread to the handlers on one event loop, handed over in batches: the
    tokens a round streams to every running job wake the loop once (a write to its self-pipe, a
    system call), not once per job, which on a 2-core CPU server cost the engine thread 5% of its
    time at 16 streams."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.pending: list[tuple[asyncio.Queue[tuple[str, Any]], tuple[str, Any]]] = []

    def post(self, queue: asyncio.Queue[tuple[str, Any]], event: tuple[str, Any]) -> None:
        """From any thread: `event` into `queue` on the loop, in order of posting."""
        with self.lock:
            self.pending.append((queue, event))
            if len(self.pending) > 1:  # a delivery is on its way already and takes this one too
                return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
            self.loop.call_soon_threadsafe(self.deliver)

    def deliver(self) -> None:
        with self.lock:
            batch, self.pending = self.pending, []
        for queue, event in batch:
            queue.put_nowait(event)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = weakref.WeakKeyDictionary()
_mailboxes_lock = threading.Lock()


def mailbox_of(loop: asyncio.AbstractEventLoop) -> Mailbox:
    """The loop's one mailbox (every job on it shares it, so a round's events batch together)."""
    with _mailboxes_lock:
        box = _mailboxes.get(loop)
        if box is None:
            box = _mailboxes[loop] = Mailbox(loop)
        return box


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

    mailbox: Mailbox = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.mailbox = mailbox_of(self.loop)

    def put(self, event: tuple[str, Any]) -> None:
        """From any thread: hand an event to the handler on the event loop."""
        self.mailbox.post(self.events, event)


class QueueFull(Exception):
    """The waiting room is full; the client should retry later."""


class Scheduler:
    """FIFO waiting room of bounded size plus the running jobs (one per engine slot). A job that
    arrives while the engine is mid-step waits for the step's end even when a slot is free: those
    waits do not count against `capacity`."""

    def __init__(self, capacity: int, slots: int = 1) -> None:
        self.capacity, self.slots = capacity, slots
        self.waiting: collections.deque[Job] = collections.deque()
        self.running: list[Job] = []
        self.cond = threading.Condition()
        self.numbers = itertools.count(1)

    def submit(self, job: Job) -> None:
        with self.cond:
            if len(self.waiting) >= self.capacity + self.slots - len(self.running):
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
            job = self.waiting.popleft()
            self.running.append(job)
            return job

    def finish(self, job: Job) -> None:
        with self.cond:
            self.running.remove(job)
            self.cond.notify_all()

    def counts(self) -> tuple[int, int]:
        """(waiting, running)."""
        with self.cond:
            return len(self.waiting), len(self.running)

    def context_rows(self) -> int:
        """Cache rows the running jobs hold (prompt and output so far)."""
        with self.cond:
            return sum(len(job.request.prompt_ids) + job.tokens for job in self.running)

    def cancel_all(self) -> None:
        """Drop every waiting job and cancel the running ones (end of a drain)."""
        with self.cond:
            for job in [*self.waiting, *self.running]:
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
        self.slots = 1  # sequences the caches hold: the KV usage gauge's denominator

    def run(self) -> None:
        while not self.stop.is_set():
            job = self.scheduler.take(timeout=0.2)
            if job is None:
                continue
            outcome: tuple[str, Any] = ("error", APIError(500, "generation failed", kind="server_error"))
            try:
                outcome = self.serve(job)
            finally:
                self.complete(job, outcome)

    def complete(self, job: Job, outcome: tuple[str, Any]) -> None:
        """A job leaves the engine: its slot freed, then its outcome handed over (whoever sees
        "done" sees the slot free), and a cancelled running job's last round logged."""
        self.scheduler.finish(job)
        self.show_kv_usage()
        freed = time.perf_counter()
        job.put(outcome)
        if job.cancelled_at is not None and job.started is not None and job.started < job.cancelled_at:
            # a running job was cancelled: how long its last round kept the engine after that
            self.log.write(
                "cancelled",
                job=job.number,
                tokens=job.tokens,
                engine_freed_after_s=round(freed - job.cancelled_at, 6),
            )

    def show_kv_usage(self) -> None:
        """The KV usage gauge: cache rows the running jobs hold over the rows of every slot."""
        self.metrics.kv_usage.set(self.scheduler.context_rows() / (self.engine.max_context * self.slots))

    @staticmethod
    def left_early(job: Job) -> tuple[str, Any] | None:
        """The outcome of a job whose client left between the queue and the engine (None: still wanted)."""
        if not job.cancelled.is_set():
            return None
        job.started = time.perf_counter()
        return "error", APIError(499, "the client left", kind="client_closed")

    def arguments(self, job: Job) -> dict[str, Any]:
        """The engine's keyword arguments for a job: its request, streaming and cancel wired to it."""
        req = job.request
        job.started = last = time.perf_counter()

        def on_tokens(tokens: list[int]) -> None:
            nonlocal last
            now = time.perf_counter()
            if job.first_token is None:
                job.first_token = now
            else:
                self.metrics.itl.observe(now - last)
            last = now
            job.tokens += len(tokens)
            self.show_kv_usage()
            if req.stream:
                job.put(("tokens", tokens))

        eos = set(req.stop_token_ids) | (set() if req.ignore_eos else set(self.eos))
        return {
            "prompt_ids": req.prompt_ids,
            "mode": req.mode,
            "budget": req.budget,
            "max_new_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "seed": req.seed,
            "eos_ids": tuple(eos),
            "stop": req.stop,
            "decode": self.decode,
            "on_tokens": on_tokens,
            "cancel": job.cancelled,
        }

    def done(self, job: Job, result: GenerationResult, budgets: list[int] | None = None) -> tuple[str, Any]:
        """A finished generation's metrics (spec-decode counters, prefill and decode time); `budgets`:
        each round's ddtree budget where the load picked them."""
        req = job.request
        if req.mode != "ar":
            accepted = result.accepted_per_round
            drafts = self.draft_tokens(req.mode, req.budget) * result.rounds
            if budgets:  # a round at budget 0 (off speculation) drafted nothing: no draft to count
                drafts = sum(budgets)
                accepted = [a for a, b in zip(accepted, budgets, strict=True) if b]
            self.metrics.record_rounds(drafts, accepted)
        prefill = result.phase_s.get("prefill", 0.0)
        self.metrics.prefill_time.observe(prefill)
        self.metrics.decode_time.observe(max(0.0, result.total_s - prefill))
        return "done", result

    def serve(self, job: Job) -> tuple[str, Any]:
        """Run one job; ("done", GenerationResult) or ("error", APIError)."""
        left = self.left_early(job)
        if left is not None:
            return left
        req = job.request
        try:
            result = self.engine.generate(
                **self.arguments(job),
                logprobs=req.logprobs,
                on_logprobs=(lambda es: job.put(("logprobs", es))) if req.stream else None,
                prompt_top=req.prompt_top,
            )
        except GenerationError as e:  # validation should have caught it; still the client's request
            return "error", APIError(400, str(e))
        except Exception as e:  # an engine failure (e.g. out of memory) fails this request only
            return "error", engine_failure(e)
        return self.done(job, result)


def engine_failure(e: Exception) -> APIError:
    return APIError(500, f"generation failed: {type(e).__name__}: {e}", kind="server_error")


class BatchWorker(Worker):
    """Runs queued jobs through a `BatchEngine`: before each step, waiting jobs take the free slots
    in order of arrival; after it, the jobs it finished leave. `stop` is honoured once no job runs
    (a drain cancels the running ones first)."""

    def __init__(
        self,
        engine: BatchEngine,
        scheduler: Scheduler,
        metrics: Metrics,
        decode: Callable[[list[int]], str],
        draft_tokens: Callable[[str, int], int],
        log: EventLog,
    ) -> None:
        super().__init__(engine, scheduler, metrics, decode, draft_tokens, log)
        self.batch = engine
        self.slots = engine.max_batch
        self.jobs: dict[int, Job] = {}  # by engine slot

    def run(self) -> None:
        engine = self.batch
        while not self.stop.is_set() or engine.live:
            while engine.free and not self.stop.is_set():
                job = self.scheduler.take(timeout=0 if engine.live else 0.2)
                if job is None:
                    break
                self.admit(job)
            if not engine.live:
                continue
            try:
                finished = engine.step()
            except Exception as e:  # an engine failure (e.g. out of memory) fails the step's jobs
                for live in engine.abort():
                    self.complete(self.jobs.pop(live.slot), ("error", engine_failure(e)))
                continue
            for live in finished:
                assert live.result is not None
                job = self.jobs.pop(live.slot)
                self.complete(job, self.done(job, live.result, live.budgets))

    def admit(self, job: Job) -> None:
        """A job into a free slot; its prefill starts at the next step."""
        left = self.left_early(job)
        if left is not None:
            self.complete(job, left)
            return
        req = job.request
        if req.prompt_top is not None:  # a prompt prefilled in chunks keeps no row's logits
            message = "prompt_logprobs is not recorded by batched rounds yet (fix: drop it, or serve with --max-batch 1)"
            self.complete(job, ("error", APIError(400, message)))
            return
        try:
            live = self.batch.add(
                **self.arguments(job),
                logprobs=req.logprobs,
                on_logprobs=(lambda es: job.put(("logprobs", es))) if req.stream else None,
            )
        except GenerationError as e:  # validation should have caught it; still the client's request
            self.complete(job, ("error", APIError(400, str(e))))
            return
        self.jobs[live.slot] = job
