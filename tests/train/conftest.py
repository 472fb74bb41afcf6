"""Fixtures for the training tests: one thread, and an unfitted tiny pair (the target is the same
random Qwen3 as the fitted `tiny_pair`; the drafter starts untrained)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from ddtree_runtime.tiny import TinyPair, write_tiny_pair


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def raw_pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    return write_tiny_pair(tmp_path_factory.mktemp("raw") / "pair", fit_steps=0)


@pytest.fixture(scope="session")
def mixed_raw_pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    return write_tiny_pair(
        tmp_path_factory.mktemp("mixed") / "pair",
        block_size=5,
        layer_types=["sliding_attention", "full_attention"],
        fit_steps=0,
        seed=3,
    )
