"""pytest plugin: a full disk on demand, as a real tmpfs mount (root only; CI runs as root).

Fixtures:
    small_fs(path, size="256k") -> Path   mount a fresh tmpfs of that size on `path`
Helpers:
    fill(folder)                          write a filler file until the filesystem is full (ENOSPC)

Every mount is undone at teardown. Where mounting is impossible (not root, no CAP_SYS_ADMIN)
the test is skipped and says why.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_fs() -> Iterator[Callable[..., Path]]:
    mounted: list[Path] = []

    def mount(path: Path, size: str = "256k") -> Path:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "specops-test", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs on {path} ({done.stderr.strip() or 'mount failed'}): "
                "the full-disk tests need root"
            )
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> None:
    """Write `folder`/filler until the filesystem that holds it has no page left."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
