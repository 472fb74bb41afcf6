"""The server's log: JSON lines on stderr, one per request plus start/stop events.

Never prompt text, never a value from the env file. uvicorn's own messages (a malformed request
line, a protocol error) arrive through `logging` and are written as JSON lines too.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime, timezone
from typing import Any


class EventLog:
    """JSON lines on a stream, safe from any thread."""

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

    def capture(self, *loggers: str) -> None:
        """Route these `logging` loggers (uvicorn's) into this log, warnings and errors only."""
        handler = _Handler(self)
        for name in loggers:
            logger = logging.getLogger(name)
            logger.handlers[:] = [handler]
            logger.setLevel(logging.WARNING)
            logger.propagate = False


class _Handler(logging.Handler):
    def __init__(self, log: EventLog) -> None:
        super().__init__(logging.WARNING)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        self.log.write("http", level=record.levelname.lower(), message=record.getMessage())
