"""What one step sees on one host: the host, where controller files are, the template
variables, and the run-wide objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ops.api.changes import StepFailed

if TYPE_CHECKING:
    from ops.hosts import Host
    from ops.output import Reporter


class Progress(Protocol):
    """A run-wide display of long per-host work, shared by every host's steps (thread-safe):
    ``ops.bench.progress.BenchProgress``, which ``fab bench``, ``fab tune`` and ``fab train-drafter``
    open. The steps layer knows only this shape, so it never imports a domain package."""

    def start(self, host: str, total: int, done_before: int) -> None:
        """``total`` units of work on ``host``, ``done_before`` of them done by an earlier attempt."""

    def cell_started(self, host: str, label: str) -> None: ...

    def cell_finished(self, host: str, label: str, ok: bool = True) -> None: ...

    def note(self, host: str, text: str) -> None:
        """One line about ``host`` that is no unit of work (a server starting, a log line)."""


@dataclass
class StepContext:
    """Per host and step: where the step looks for controller files, the template variables, and
    the run-wide objects (never host variables: playbooks stay plain data).

    ``run_dir`` is where the run's results go on the controller (``results/<run-id>``; for
    ``fab bench --resume`` the resumed run's), ``reporter`` the run's output, and ``progress`` the
    display that ``fab bench``/``fab tune``/``fab train-drafter`` open (None otherwise).
    """

    host: Host
    playbook_dir: Path
    templates_dir: Path
    vars: dict[str, Any]
    check: bool = False
    run_dir: Path | None = None
    reporter: Reporter | None = None
    progress: Progress | None = None

    def find_source(self, src: str) -> Path:
        """A controller-side file: absolute, else beside the playbook, else in ``templates/``."""
        candidates = (
            [Path(src).expanduser()]
            if Path(src).expanduser().is_absolute()
            else [
                self.playbook_dir / src,
                self.templates_dir / src,
            ]
        )
        for path in candidates:
            if path.is_file():
                return path
        tried = ", ".join(str(p) for p in candidates)
        raise StepFailed(f"source file '{src}' not found (looked in: {tried})")
