"""The controller itself as a host: subprocess for commands, the os module for files (the demo host)."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import stat as stat_mod
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ops.connection.base import (
    TIMEOUT_EXIT,
    Abandoned,
    Connection,
    FileStat,
    copy_stream,
    write_local_atomically,
)
from ops.hosts import Host
from ops.redact import Redactor


class LocalConnection(Connection):
    """The controller itself, through subprocess and the os module (the demo host)."""

    def __init__(self, host: Host, redactor: Redactor | None = None):
        super().__init__(host, redactor)
        entry = pwd.getpwuid(os.getuid())
        self._home = Path(entry.pw_dir)
        self._shell = entry.pw_shell if os.access(entry.pw_shell or "", os.X_OK) else "/bin/sh"
        self._running: subprocess.Popen[bytes] | None = None

    def _path(self, path: str | Path) -> Path:
        p = Path(path)
        return p if p.is_absolute() else self._home / p

    def _execute(self, command: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes]:
        # Same shell and start directory as sshd would use, so steps behave alike on both backends.
        proc = subprocess.Popen(
            [self._shell, "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self._home,
            start_new_session=True,
        )
        self._running = proc
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = _stop(proc)
            assert timeout is not None
            return TIMEOUT_EXIT, out, err + self._timeout_note(timeout)
        finally:
            self._running = None
        if self._abandoned is not None:  # killed by abandon(), not a failure of its own
            raise Abandoned(self.host.name, self._abandoned)
        return proc.returncode, out, err

    def _interrupt(self) -> None:
        proc = self._running
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        self._check_range(offset, length)
        with open(self._path(path), "rb") as fh:
            fh.seek(offset)
            return fh.read() if length is None else fh.read(length)

    def _atomic(
        self, path: str, write: Callable[[IO[bytes]], object], mode: int | None, default_mode: int
    ) -> None:
        target = self._path(path)
        try:
            final_mode = stat_mod.S_IMODE(target.stat().st_mode) if mode is None else mode
        except FileNotFoundError:
            final_mode = default_mode
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.specops-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
            os.chmod(tmp, final_mode)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def get_file(self, remote_path: str, local_path: str | Path) -> None:
        with open(self._path(remote_path), "rb") as source:
            write_local_atomically(Path(local_path), lambda fh: copy_stream(source, fh))

    def stat(self, path: str) -> FileStat | None:
        try:
            st = os.stat(self._path(path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return FileStat(
            size=st.st_size,
            mode=stat_mod.S_IMODE(st.st_mode),
            is_dir=stat_mod.S_ISDIR(st.st_mode),
            is_file=stat_mod.S_ISREG(st.st_mode),
        )

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(self._path(path)))

    def realpath(self, path: str) -> str:
        return os.path.realpath(self._path(path))

    def close(self) -> None:
        """Nothing to release; present so both backends are used the same way."""


def _stop(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """TERM, then KILL, the command's process group; what it printed until then."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            continue
    return b"", b""
