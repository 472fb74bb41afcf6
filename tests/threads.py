"""One torch thread for a test folder's session: tiny models run fastest on one thread, and the CI
box has only two cores to share. A folder turns it on by importing ``one_thread`` into its conftest
(it is autouse, so only where it is imported)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
