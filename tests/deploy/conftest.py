"""Fixtures for the deploy tests: a throw-away git checkout to deploy, and clean-up of every server a test started (they run in their own sessions, outside sshd's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.deploy.helpers import Checkout, stop_servers


@pytest.fixture
def checkout(tmp_path: Path) -> Checkout:
    """A git repository holding this checkout's packaged files, committed once."""
    return Checkout.create(tmp_path / "checkout")


@pytest.fixture
def servers() -> Iterator[Callable[[Path], Path]]:
    """Register a host base directory; its servers are stopped after the test."""
    bases: list[Path] = []

    def track(base: Path) -> Path:
        bases.append(Path(base))
        return Path(base)

    yield track
    for base in bases:
        stop_servers(base)
