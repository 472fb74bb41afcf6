"""Progress of a benchmark run: one bar per host with the current cell and an ETA.

Why: a matrix on a GPU box runs for an hour; the user must see which cell each host is on and
when it will end. On a terminal this is a rich progress display (the run's live step table is
off during ``fab bench``); otherwise, one plain line per finished cell, which logs and CI keep.
The ETA is the mean time of the cells finished so far times the cells left. Hosts report from
worker threads, so every method is thread-safe.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class BenchProgress:
    """Per-host cell counters, shown as bars (TTY) or lines (anything else)."""

    def __init__(self, stream: IO[str] | None = None, live: bool | None = None) -> None:
        self.console = Console(file=stream or sys.stdout, highlight=False)
        self.live = self.console.is_terminal if live is None else live
        self.lock = threading.Lock()
        self.hosts: dict[str, dict[str, float]] = {}
        self.bars: Progress | None = None
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> BenchProgress:
        if self.live:
            self.bars = Progress(
                TextColumn("{task.fields[host]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bars is not None:
            self.bars.stop()
            self.bars = None

    def start(self, host: str, total: int, done_before: int) -> None:
        """``total`` cells in the matrix, ``done_before`` of them complete from an earlier attempt."""
        with self.lock:
            self.hosts[host] = {
                "total": total,
                "done": done_before,
                "ran": 0,
                "spent": 0.0,
                "t": time.monotonic(),
            }
            if self.bars is not None:
                self.tasks[host] = self.bars.add_task(
                    "starting", total=total, completed=done_before, host=host
                )
        if self.bars is None:
            self._line(
                f"bench {host} | {total} cells, {done_before} done before, {total - done_before} to run"
            )

    def cell_started(self, host: str, label: str) -> None:
        with self.lock:
            self.hosts[host]["t"] = time.monotonic()
            if self.bars is not None:
                self.bars.update(self.tasks[host], description=label)

    def cell_finished(self, host: str, label: str, ok: bool = True) -> None:
        with self.lock:
            state = self.hosts[host]
            took = time.monotonic() - state["t"]
            state["done"] += 1
            state["ran"] += 1
            state["spent"] += took
            left = state["total"] - state["done"]
            eta = state["spent"] / state["ran"] * left
            if self.bars is not None:
                self.bars.update(self.tasks[host], advance=1, description=label)
        if self.bars is None:
            self._line(
                f"bench {host} | [{state['done']:.0f}/{state['total']:.0f}] {label} "
                f"{'done' if ok else 'FAILED'} in {took:.1f}s; ETA {_clock(eta)}"
            )

    def note(self, host: str, text: str) -> None:
        """A line from the host (a log line: printed as it is, brackets and all)."""
        if self.bars is not None:
            self.bars.console.print(f"bench {host} | {text}", markup=False)
        else:
            self._line(f"bench {host} | {text}")

    def _line(self, text: str) -> None:
        with self.lock:
            self.console.print(text, soft_wrap=True, markup=False)


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
