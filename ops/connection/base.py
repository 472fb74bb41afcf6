"""The backend-neutral half of a connection: the result types, sudo wrapping and the shared `run`.

`Connection.run` registers the host's secrets with the redactor, wraps sudo (the password goes on
stdin, never argv) and redacts what comes back; a backend only moves bytes (`_execute`, `_atomic`,
and the file calls). The backends live in `ops.connection.local` and `ops.connection.ssh`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat as stat_mod
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ops.errors import SpecopsError
from ops.hosts import SUDO_PASSWORD, Host
from ops.redact import Redactor
from ops.shell import join

log = logging.getLogger("specops.connection")

TIMEOUT_EXIT = 124
CHUNK = 1 << 16
_NEW_FILE_MODE = 0o644


class Abandoned(SpecopsError):
    """The run gave up on this host (a second Ctrl-C) while it was busy or before its next call."""

    def __init__(self, host: str, reason: str):
        super().__init__(f"host '{host}': {reason}")


@dataclass(frozen=True)
class CommandResult:
    """What a command did, already redacted."""

    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class FileStat:
    """The few stat fields steps compare; `mode` holds permission bits only (0o755)."""

    size: int
    mode: int
    is_dir: bool
    is_file: bool  # a regular file, after following links


def sudo_wrap(command: str, password: str | None) -> str:
    """The command line that runs `command` as root; the password, if any, goes on stdin.

    With a password, ``-k`` makes sudo ignore cached credentials, so it always reads the password
    line (on a NOPASSWD rule the line reaches the command's stdin instead; output stays redacted).
    """
    inner = join(["/bin/sh", "-c", command])
    if password is None:
        return f"sudo -n -- {inner}"
    return f"sudo -k -S -p '' -- {inner}"


def _as_bytes(data: bytes | str | None) -> bytes:
    if data is None:
        return b""
    return data.encode() if isinstance(data, str) else bytes(data)


class Connection:
    """Base class: the shared run/sudo/redaction logic; subclasses move bytes."""

    host: Host

    def __init__(self, host: Host, redactor: Redactor | None = None):
        self.host = host
        self.redactor = redactor if redactor is not None else Redactor()
        self._secrets: dict[str, str] | None = None
        # what a command given no timeout gets: the runner sets it per step, so nothing waits forever
        self.default_timeout: float | None = None
        self._abandoned: str | None = None

    # -- public API

    def run(
        self,
        command: str | Sequence[str],
        *,
        sudo: bool = False,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run a shell command line (a sequence is quoted through ops.shell.join)."""
        line = command if isinstance(command, str) else join(command)
        timeout = self.default_timeout if timeout is None else timeout
        if self._abandoned is not None:
            raise Abandoned(self.host.name, self._abandoned)
        self._load_secrets()
        feed = _as_bytes(stdin)
        wire = line
        if sudo and self.host.sudo:
            password = None
            if SUDO_PASSWORD in self.host.secrets:  # resolved again here to raise the precise reason
                password = (self._secrets or {}).get(SUDO_PASSWORD) or self.host.secrets[
                    SUDO_PASSWORD
                ].resolve(self.host.name)
            wire = sudo_wrap(line, password)
            if password is not None:
                feed = password.encode() + b"\n" + feed
        shown = self.redactor.redact(line)
        log.debug("%s: run %s", self.host.name, shown)
        code, out, err = self._execute(wire, feed, timeout)
        return CommandResult(
            command=shown,
            exit_code=code,
            stdout=self.redactor.redact(out.decode("utf-8", "replace")),
            stderr=self.redactor.redact(err.decode("utf-8", "replace")),
        )

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """Read `length` bytes (None: to the end) from `offset`, without reading the rest."""
        raise NotImplementedError

    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None:
        self._atomic(path, lambda fh: fh.write(data), mode, _NEW_FILE_MODE)

    def put_file(self, local_path: str | Path, remote_path: str, mode: int | None = None) -> None:
        """Upload atomically; without `mode` the file keeps the local file's permission bits."""
        src = Path(local_path)
        src_mode = stat_mod.S_IMODE(src.stat().st_mode)
        with open(src, "rb") as source:
            self._atomic(remote_path, lambda fh: copy_stream(source, fh), mode, src_mode)

    def get_file(self, remote_path: str, local_path: str | Path) -> None:
        raise NotImplementedError

    def stat(self, path: str) -> FileStat | None:
        raise NotImplementedError

    def listdir(self, path: str) -> list[str]:
        raise NotImplementedError

    def realpath(self, path: str) -> str:
        """`path` with every symlink resolved (the file a write through the link should replace)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def abandon(self, reason: str) -> None:
        """From another thread: end what runs now and refuse everything after it with ``reason``
        (`Abandoned`), so a run can give up on a stuck host (a second Ctrl-C)."""
        self._abandoned = reason
        self._interrupt()

    def _interrupt(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- shared helpers

    def _load_secrets(self) -> None:
        if self._secrets is None:
            self._secrets = self.host.resolve_secrets(self.redactor, strict=False)

    def _execute(self, command: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes]:
        raise NotImplementedError

    def _atomic(
        self, path: str, write: Callable[[IO[bytes]], object], mode: int | None, default_mode: int
    ) -> None:
        """Write through `write` into a temp file beside `path`, then rename it over `path`."""
        raise NotImplementedError

    @staticmethod
    def _check_range(offset: int, length: int | None) -> None:
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"offset and length must be >= 0, got offset={offset} length={length}")

    @staticmethod
    def _timeout_note(timeout: float) -> bytes:
        return f"\n[specops] command timed out after {timeout:g}s\n".encode()


def copy_stream(source: IO[bytes], dest: IO[bytes]) -> None:
    while chunk := source.read(CHUNK):
        dest.write(chunk)


def write_local_atomically(target: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write a controller-side file through a temp file beside it and a rename."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.specops-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
