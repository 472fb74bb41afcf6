"""Where checkpoint files are read from and written to: the local disk or a host over SFTP.

Why: the same lint and patch code must run on the controller's disk and on a GPU host without
copying checkpoints home. Everything goes through the calls that ``ops.connection.Connection``
already provides (``read_bytes`` with offset and length, ``listdir``, ``stat``, ``realpath``,
atomic ``write_bytes``), so a connection is a store as it is, and ``LocalStore`` is the local twin.
Ranged reads are what let a 50 GB safetensors file be checked by its header alone.
"""

from __future__ import annotations

import os
import posixpath
import stat as stat_module
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class FileStat:
    """The part of stat(2) that lint needs; same fields as ops.connection.FileStat."""

    size: int
    mode: int
    is_dir: bool
    is_file: bool  # a regular file (after following links): the only kind lint reads


class Store(Protocol):
    """The file operations lint and patch use; ops.connection.Connection satisfies it."""

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes: ...

    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None: ...

    def stat(self, path: str) -> FileStat | None: ...

    def listdir(self, path: str) -> list[str]: ...

    def realpath(self, path: str) -> str: ...


class LocalStore:
    """The controller's own filesystem."""

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read() if length is None else handle.read(length)

    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Write atomically: a temp file in the same directory, fsync, then rename over ``path``."""
        target = Path(path)
        if mode is None and target.exists():
            mode = stat_module.S_IMODE(target.stat().st_mode)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644 if mode is None else mode)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def stat(self, path: str) -> FileStat | None:
        try:
            result = os.stat(path)
        except FileNotFoundError:
            return None
        return FileStat(
            result.st_size,
            result.st_mode,
            stat_module.S_ISDIR(result.st_mode),
            stat_module.S_ISREG(result.st_mode),
        )

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)


def join(directory: str, name: str) -> str:
    """Join with '/' so remote POSIX paths stay POSIX whatever the controller runs on."""
    return posixpath.join(directory, name)
