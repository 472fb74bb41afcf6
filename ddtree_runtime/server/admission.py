"""What a request must pass before it costs engine time: a bounded JSON body and room in the queue.

Readiness is the third gate (`State.ready`); the fields themselves are checked by
`protocol.validation`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from fastapi import Request

from ddtree_runtime.server.protocol.errors import APIError
from ddtree_runtime.server.protocol.validation import parse_json
from ddtree_runtime.server.worker import Job, QueueFull, Scheduler

MAX_BODY = 16 * 2**20
# Bodies up to this size are validated and tokenized on the event loop: that takes well under a
# millisecond, less than the hop to a worker thread. Larger ones go to a thread, so that a huge
# prompt never stalls /health or other requests.
INLINE_BODY = 16 * 2**10
T = TypeVar("T")


async def read_json(request: Request) -> dict[str, Any]:
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
    request.state.body_bytes = size
    return parse_json(b"".join(chunks))


async def off_loop_if_large(request: Request, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` for the request read by `read_json`: inline for a small body, else in a thread."""
    if request.state.body_bytes <= INLINE_BODY:
        return fn(*args)
    return await anyio.to_thread.run_sync(fn, *args)


def enqueue(scheduler: Scheduler, job: Job) -> None:
    """Queue the job, or refuse it with a 503 the client may retry when the queue is full."""
    try:
        scheduler.submit(job)
    except QueueFull as e:
        raise APIError(
            503,
            f"the server is busy: {e} (fix: retry later)",
            kind="server_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        ) from None
