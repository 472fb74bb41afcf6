"""Fixtures for the training tests: one thread, and an unfitted tiny pair (the target is the same
random Qwen3 as the fitted `tiny_pair`; the drafter starts untrained)."""

from __future__ import annotations

import pytest

from ddtree_runtime.tiny import TinyPair, write_tiny_pair
from tests.threads import one_thread  # noqa: F401 (autouse: one torch thread in this folder)


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
