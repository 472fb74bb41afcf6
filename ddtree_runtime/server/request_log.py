"""One JSON log line per HTTP request, written just after the response's last byte.

Handlers add their fields (finish reason, token counts, timings) to the request's record in the
ASGI scope; the middleware writes it with the method, path, status and seconds, never prompt text.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ddtree_runtime.server.events import EventLog

RECORD = "specops.record"  # the scope key of a request's log record


def record_of(request: Request) -> dict[str, Any]:
    """The request's log record, which handlers fill and `RequestLog` writes."""
    return request.scope.setdefault(RECORD, {})


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
