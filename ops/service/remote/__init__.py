"""Scripts that run ON a host, standard library only: the controller reads their text and runs it
with the host's ``python3 -c TEXT JSON`` (``supervisor.py`` is copied to ``<base>/bin/`` instead).

- ``probe.py``: the service facts (read-only): pid, systemd unit, state file, health, metrics.
- ``wait.py``: poll ``/health``, ``/v1/models`` and one completion until the server answers.
- ``models.py``: the model ids a server already running on a URL lists (``fab bench`` reuse).
- ``port.py``: before a running server stops, the port the new one binds is free or its own.
- ``sockets.py``: which processes hold a port (a helper prepended to ``wait.py`` and ``port.py``).
- ``supervisor.py``: the built-in process supervisor (setsid, pidfile, log, TERM then KILL).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def script(name: str) -> str:
    """The text of ``<name>.py`` in this folder."""
    return (HERE / f"{name}.py").read_text()
