"""What one step sees on one host: the host, where controller files are, the template
variables, and the run-wide objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.api.changes import StepFailed

if TYPE_CHECKING:
    from ops.bench.progress import BenchProgress
    from ops.hosts import Host
    from ops.output import Reporter


@dataclass
class StepContext:
    """Per host and step: where the step looks for controller files, the template variables, and
    the run-wide objects (never host variables: playbooks stay plain data).

    ``run_dir`` is where the run's results go on the controller (``results/<run-id>``; for
    ``fab bench --resume`` the resumed run's), ``reporter`` the run's output, and ``progress`` the
    benchmark display that ``fab bench``/``fab tune`` open (None otherwise).
    """

    host: Host
    playbook_dir: Path
    templates_dir: Path
    vars: dict[str, Any]
    check: bool = False
    run_dir: Path | None = None
    reporter: Reporter | None = None
    progress: BenchProgress | None = None

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
