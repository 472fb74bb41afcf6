"""What a run shows: host-prefixed lines, a live host x step display on a TTY, a closing summary.

Every text goes through the run's Redactor first, and every line also goes to ``run.log`` (with
diffs, which the terminal shows only in check mode). Worker threads call in concurrently, so all
state sits behind one lock. A results disk that fills up stops ``run.log`` (the terminal says so
once), never the run.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ops.playbook import Playbook, StepSpec
    from ops.redact import Redactor
    from ops.results import HostResult, RunResult, StepResult

STYLES = {"ok": "green", "changed": "yellow", "failed": "bold red", "skipped": "dim"}
STDERR_TAIL = 12


class Reporter:
    """Thread-safe run display; a context manager that owns run.log and the live view."""

    def __init__(
        self,
        playbook: Playbook,
        hosts: list[str],
        *,
        check: bool,
        log_path: Path,
        redactor: Redactor,
        live: bool | None = None,
        stream: IO[str] | None = None,
    ) -> None:
        self.playbook = playbook
        self.check = check
        self.redactor = redactor
        self.console = Console(file=stream or sys.stdout, highlight=False, soft_wrap=True)
        if not self.console.is_terminal:
            self.console.width = 160
        self.live_enabled = self.console.is_terminal if live is None else live
        self.log: IO[str] = open(log_path, "a", encoding="utf-8")  # noqa: SIM115  closed in __exit__
        self.log_path = log_path
        self.log_failed = False
        self.log_console = Console(
            file=self.log, width=160, color_system=None, highlight=False, soft_wrap=True
        )
        self.lock = threading.Lock()
        self.width = max(len(h) for h in hosts)
        self.state: dict[str, dict[str, Any]] = {
            h: {"done": 0, "current": "waiting", "ok": 0, "changed": 0, "failed": 0, "skipped": 0}
            for h in hosts
        }
        self.total = len(playbook.steps)
        self.live: Live | None = None

    def __enter__(self) -> Reporter:
        if self.live_enabled:
            self.live = Live(
                get_renderable=self._progress, console=self.console, refresh_per_second=8, transient=True
            )
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        self._logged(self.log.close)

    def _logged(self, write: Callable[[], object]) -> None:
        """One write to run.log (caller holds the lock); the first failure ends logging to it."""
        if self.log_failed:
            return
        try:
            write()
        except OSError as exc:
            self.log_failed = True
            self.console.print(
                Text(f"warning: cannot write {self.log_path} ({exc.strerror or exc}); going on without it")
            )

    # ------------------------------------------------------------------ lines
    def _emit(self, text: str, style: str | None = None, *, terminal: bool = True) -> None:
        """One (multi-line) text to the terminal and the log; callers hold no lock."""
        text = self.redactor.redact(text)
        stamp = datetime.now(timezone.utc).strftime("%H:%M:%S")
        lines = "".join(f"{stamp} {line}\n" for line in text.splitlines() or [""])
        with self.lock:
            self._logged(lambda: (self.log.write(lines), self.log.flush()))
            if terminal:
                self.console.print(Text(text, style=style or ""))

    def _prefixed(self, host: str, lines: str) -> str:
        pad = host.ljust(self.width)
        return "\n".join(f"{pad} | {line}" for line in lines.splitlines())

    def note(self, text: str) -> None:
        self._emit(text)

    def step_started(self, host: str, spec: StepSpec) -> None:
        with self.lock:
            self.state[host]["current"] = spec.name

    def step_finished(self, host: str, spec: StepSpec | None, result: StepResult) -> None:
        with self.lock:
            state = self.state[host]
            state["done"] += 1
            state[result.status] += 1
        number = f"[{spec.index + 1}/{self.total}] " if spec is not None else ""
        head = f"{result.status:<7} {number}{result.name}: {result.message}"
        self._emit(self._prefixed(host, head), STYLES.get(result.status))
        details = [f"    - {change}" for change in result.changes]
        if result.status == "failed":
            if result.command:
                details.append(f"    command: {result.command}")
            details += [f"    stderr: {line}" for line in _tail(result.stderr)]
        if details:
            self._emit(self._prefixed(host, "\n".join(details)))
        if result.diff:
            self._emit(
                self._prefixed(host, "\n".join("    " + line for line in result.diff.splitlines())),
                terminal=self.check,
            )

    def host_finished(self, host: str, outcome: HostResult) -> None:
        with self.lock:
            self.state[host]["current"] = outcome.status
        self._emit(
            self._prefixed(host, f"{outcome.status.upper()} after {outcome.duration:.1f}s"),
            STYLES.get(outcome.status),
        )

    # ------------------------------------------------------------------ tables
    def _progress(self) -> Table:
        """The live view: one row per host, one column per step count."""
        table = Table(title=f"{self.playbook.name}{' (check)' if self.check else ''}", expand=False)
        for column in ("host", "progress", "step", "ok", "changed", "failed", "skipped"):
            table.add_column(column)
        with self.lock:
            for host, s in self.state.items():
                bar = "#" * s["done"] + "." * max(0, self.total - s["done"])
                table.add_row(
                    host,
                    f"{bar} {s['done']}/{self.total}",
                    s["current"],
                    str(s["ok"]),
                    str(s["changed"]),
                    Text(str(s["failed"]), style="red" if s["failed"] else ""),
                    str(s["skipped"]),
                )
        return table

    def close(self, run: RunResult) -> None:
        """The closing summary table and every failure with host, step, command and stderr tail."""
        if self.live is not None:
            self.live.stop()
            self.live = None
        verb = "would change" if run.check else "changed"
        table = Table(title=f"{run.playbook.name}: run {run.run_id}{' (check mode)' if run.check else ''}")
        for column in ("host", "status", "ok", verb, "failed", "skipped", "time"):
            table.add_column(column)
        for name, host in run.hosts.items():
            table.add_row(
                name,
                Text(host.status, style=STYLES.get(host.status, "")),
                str(host.count("ok")),
                str(host.count("changed")),
                str(host.count("failed")),
                str(host.count("skipped")),
                f"{host.duration:.1f}s",
            )
        with self.lock:
            self.console.print()
            self.console.print(table)
            self._logged(lambda: (self.log_console.print(), self.log_console.print(table), self.log.flush()))
        failures = [
            (name, step) for name, host in run.hosts.items() for step in host.steps if step.status == "failed"
        ]
        for name, step in failures:
            lines = [f"FAILED {name} / {step.name} ({step.step}): {step.message}"]
            if step.command:
                lines.append(f"  command: {step.command}")
            lines += [f"  stderr: {line}" for line in _tail(step.stderr)]
            self._emit("\n".join(lines), STYLES["failed"])
        where = (
            f"error: {run.record_error}" if run.record_error else f"summary {run.run_dir / 'summary.json'}"
        )
        self._emit(f"{len(run.hosts)} host(s): {run.changed} {verb}, {run.failed} failed; {where}")


def _tail(text: str) -> list[str]:
    return text.rstrip().splitlines()[-STDERR_TAIL:] if text and text.strip() else []
