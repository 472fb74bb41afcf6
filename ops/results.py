"""What a run produced: one record per step and host, the per-host map, and the run's folder.

A run writes ``results/<run-id>/summary.json``, the per-host map (Fabric's GroupResult)::

    {"run_id", "playbook", "check": bool,
     "hosts": {NAME: {"status": "ok|changed|failed",
                      "steps": [{"name", "step", "status": "ok|changed|failed|skipped",
                                 "changed": bool, "message"}]}},
     "changed": <hosts with at least one change>, "failed": <hosts that failed>}

After Ctrl-C the summary also says ``"interrupted": true`` (the interrupted hosts' status is
``interrupted``). ``results/latest`` is swapped atomically to the newest run. The summary passes
through the run's Redactor before it is encoded, so no JSON escape can hide a secret.
"""

from __future__ import annotations

import json
import os
import secrets as _random
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ops.errors import SpecopsError
from ops.playbook import Playbook
from ops.redact import Redactor

INTERRUPTED = "not run: interrupted (Ctrl-C)"


@dataclass
class StepResult:
    """One step on one host; the first five fields are the summary.json record."""

    name: str
    step: str
    status: str  # ok | changed | failed | skipped
    changed: bool
    message: str
    changes: list[str] = field(default_factory=list)
    diff: str = ""
    command: str | None = None
    stderr: str = ""
    ignored: bool = False
    duration: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)  # what ``register`` exposes; not in the record

    def redact(self, redactor: Redactor) -> None:
        """Mask secrets in every text a caller may show (connection output is masked already)."""
        self.message, self.stderr, self.diff = map(redactor.redact, (self.message, self.stderr, self.diff))
        self.changes = [redactor.redact(c) for c in self.changes]
        if self.command:
            self.command = redactor.redact(self.command)

    def registered(self) -> dict[str, Any]:
        return {**self.data, "status": self.status, "changed": self.changed, "message": self.message}

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "step": self.step,
            "status": self.status,
            "changed": self.changed,
            "message": self.message,
        }


@dataclass
class HostResult:
    host: str
    steps: list[StepResult] = field(default_factory=list)
    registered: dict[str, Any] = field(default_factory=dict)
    duration: float = 0.0

    @property
    def failed(self) -> bool:
        return any(s.status == "failed" and not s.ignored for s in self.steps)

    @property
    def status(self) -> str:
        if self.failed:
            return "failed"
        if self.interrupted:
            return "interrupted"
        return "changed" if any(s.changed for s in self.steps) else "ok"

    interrupted: bool = False

    def count(self, status: str) -> int:
        return sum(1 for s in self.steps if s.status == status)


@dataclass
class RunResult:
    """The per-host map of one run, and where its files are."""

    run_id: str
    playbook: Playbook
    check: bool
    hosts: dict[str, HostResult]
    run_dir: Path
    interrupted: bool = False
    record_error: str | None = None  # why summary.json could not be written (a full results disk)

    @property
    def changed(self) -> int:
        return sum(1 for h in self.hosts.values() if h.status == "changed")

    @property
    def failed(self) -> int:
        return sum(1 for h in self.hosts.values() if h.failed)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and not self.interrupted and self.record_error is None

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "playbook": self.playbook.name,
            "check": self.check,
            "hosts": {
                name: {"status": h.status, "steps": [s.record() for s in h.steps]}
                for name, h in self.hosts.items()
            },
            "changed": self.changed,
            "failed": self.failed,
            **({"interrupted": True} if self.interrupted else {}),  # the key only appears after Ctrl-C
        }


def new_run_id(playbook: Playbook) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    slug = "".join(c if c.isalnum() else "-" for c in playbook.path.stem).strip("-") or "play"
    return f"{stamp}-{slug}-{_random.token_hex(2)}"


def make_run_dir(run_dir: Path) -> Path:
    """Create ``results/<run-id>``; a results path that is a file (or unwritable) is an input error."""
    try:
        run_dir.mkdir(parents=True)
    except OSError as exc:
        raise SpecopsError(
            f"cannot create the run folder {run_dir}: {exc.strerror} (fix: --results must name a "
            "folder, or a path where one can be created)"
        ) from None
    return run_dir


def resume_dir(results_root: Path, run_id: str) -> Path:
    """The run folder ``run_id`` (or ``latest``) names: a folder right under ``results_root``,
    never a path elsewhere (``../x``, ``/etc``, or a ``latest`` link pointing out), which a resumed
    run would write into."""
    root = results_root.resolve()
    run_dir = (results_root / run_id).resolve()
    if "/" in run_id or run_dir.parent != root:
        raise SpecopsError(
            f"--resume {run_id}: not a run of {results_root} (fix: pass a run id, a folder name from "
            f"{results_root}, or latest)"
        )
    if not run_dir.is_dir():
        raise SpecopsError(
            f"--resume {run_id}: no run directory {results_root / run_id} (fix: pass a run id from "
            f"{results_root}, or leave --resume out to start a new run)"
        )
    return run_dir


def point_latest(results_root: Path, run_id: str) -> None:
    """Swap ``results/latest`` to ``run_id`` atomically (a new symlink renamed over the old)."""
    tmp = results_root / f".latest-{run_id}"
    tmp.unlink(missing_ok=True)
    os.symlink(run_id, tmp)
    os.replace(tmp, results_root / "latest")


def interrupted_message(result: RunResult) -> str:
    """Where each host stopped after Ctrl-C, and how to continue."""
    lines = [f"interrupted: run {result.run_id} stopped early (summary {result.run_dir / 'summary.json'})"]
    for name, host in result.hosts.items():
        done = [s for s in host.steps if s.message != INTERRUPTED]
        left = [s.name for s in host.steps if s.message == INTERRUPTED]
        last = f"after '{done[-1].name}' ({done[-1].status})" if done else "before its first step"
        lines.append(
            f"  {name}: stopped {last}" + (f"; not run: {', '.join(left)}" if left else "; finished")
        )
    lines.append(
        f"The hosts are as those steps left them. To continue, run the same command again "
        f"(playbook {result.playbook.name}): steps already done change nothing."
    )
    return "\n".join(lines)


def record_run(result: RunResult, redactor: Redactor, root: Path) -> str | None:
    """Write summary.json and point ``results/latest`` at the run; the one-line reason when the
    controller's disk refuses (the run is over either way: the hosts' work is done)."""
    try:
        write_summary(result, redactor)
        point_latest(root, result.run_id)
    except OSError as exc:
        return _refused(result.run_dir / "summary.json", root, exc)
    return None


def publish_summary(result: RunResult, run_dir: Path) -> str | None:
    """Copy a recorded summary into ``run_dir`` (a benchmark run's own folder) and point latest at
    it; the one-line reason when that fails (as :func:`record_run`)."""
    if result.record_error is not None:
        return result.record_error
    try:
        shutil.copyfile(result.run_dir / "summary.json", run_dir / "summary.json")
        point_latest(run_dir.parent, run_dir.name)
    except OSError as exc:
        return _refused(run_dir / "summary.json", run_dir.parent, exc)
    return None


def _refused(path: Path, root: Path, exc: OSError) -> str:
    return (
        f"cannot write {path}: {exc.strerror or exc} (fix: free space in {root}, or pass --results "
        "a folder with room)"
    )


def write_summary(result: RunResult, redactor: Redactor) -> None:
    """Write ``summary.json`` into the run's folder, every string redacted."""
    summary = _redacted(result.summary(), redactor)  # before encoding: JSON escapes could hide a secret
    (result.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _redacted(value: Any, redactor: Redactor) -> Any:
    if isinstance(value, str):
        return redactor.redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v, redactor) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v, redactor) for v in value]
    return value
