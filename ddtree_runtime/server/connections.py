"""The HTTP connections a server keeps: a deadline for each request's headers, a cap on how many are
open, and the open-file limit raised to what the host allows.

Without them, about a thousand half-open connections (clients that never finish their headers, on
purpose or not) use every file descriptor of a process under the usual soft limit of 1024: accept
fails, and `/health` stops answering for as long as they are held. uvicorn has no header deadline
(its keep-alive timeout starts only after a response), so the h11 protocol is extended here:

- a connection must send a request's headers within `header_timeout` seconds of connecting (or of
  the first byte of its next request); else it is closed;
- past `max_connections` open connections, the one idle the longest (no request in progress:
  still owing its headers, or waiting between requests) is closed to make room; a connection busy
  with a request is never closed (if all are busy, the newcomer is).
"""

from __future__ import annotations

import asyncio
import resource

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

FD_RESERVE = 128  # descriptors kept for everything but connections: weights, logs, the listener
# asyncio accepts up to a whole listen queue in one go, and sees a connection (connection_made) a
# few loop turns after its accept, and frees a closed one's descriptor a turn later: the cap leaves
# room for IN_FLIGHT_BATCHES queues, or accept itself runs out of descriptors.
IN_FLIGHT_BATCHES = 4
MAX_BACKLOG = 1024


def raise_open_file_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def accept_backlog(open_files: int) -> int:
    """The listen queue: MAX_BACKLOG, smaller only where descriptors are few (a 1024 limit)."""
    return max(16, min(MAX_BACKLOG, (open_files - FD_RESERVE) // (2 * IN_FLIGHT_BATCHES)))


def connection_cap(open_files: int) -> int:
    """Connections the server keeps open: its descriptors less FD_RESERVE and the accept batches."""
    return max(8, open_files - FD_RESERVE - IN_FLIGHT_BATCHES * accept_backlog(open_files))


def guarded_protocol(header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the header deadline and the connection cap (uvicorn builds one
    per connection from the class, so the settings ride on a subclass)."""
    return type(
        "GuardedH11Protocol",
        (_Guarded,),
        {"header_timeout": header_timeout, "max_connections": max_connections},
    )


class _Guarded(H11Protocol):
    header_timeout: float
    max_connections: int
    idle_since: float = 0.0  # when it last had no request in progress (connected, or answered)
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        self.idle_since = self.loop.time()
        self._owe_head()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head_arrived()
        elif data and self._head_timer is None:  # the first bytes of its next request
            self._owe_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.idle_since = self.loop.time()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def _owe_head(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def _head_arrived(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def _make_room(self) -> None:
        """Close the connection idle the longest: no request in progress, its headers owed or not
        started (this newcomer when every other one is busy). Connections closed already but not
        yet gone (that takes a loop turn) do not count."""
        open_ = [c for c in self.connections if isinstance(c, _Guarded) and not c.transport.is_closing()]
        if len(open_) <= self.max_connections:
            return
        idle = [c for c in open_ if c.conn.their_state is h11.IDLE]
        min(idle, key=lambda c: c.idle_since, default=self).transport.close()
