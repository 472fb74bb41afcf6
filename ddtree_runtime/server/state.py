"""The shared state of one server, which every route reads: settings, readiness, queue, metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ddtree_runtime.server.events import EventLog
from ddtree_runtime.server.metrics import Metrics
from ddtree_runtime.server.protocol.errors import APIError
from ddtree_runtime.server.protocol.validation import Limits
from ddtree_runtime.server.settings import Settings
from ddtree_runtime.server.worker import Scheduler
from ddtree_runtime.tokenizer import Tokenizer


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
        self.scheduler = Scheduler(self.settings.queue_size, self.settings.max_batch)
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
