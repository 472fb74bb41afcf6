"""Fixtures for the runtime tests: device/dtype from the environment, tiny checkpoint pairs.

`SPECOPS_TEST_DEVICE` (cpu | cuda) and `SPECOPS_TEST_DTYPE` (float32 | bfloat16) run the same suite
on the GPU in bf16; exactness assertions that bf16 near-ties can break are relaxed there to
"every divergence is at a near-tie" (see `tests/runtime/helpers.py`).
"""

from __future__ import annotations

import os

import pytest
import torch

from ddtree_runtime.tiny import TinyPair, write_tiny_pair
from ddtree_runtime.tiny_hybrid import write_tiny_hybrid_pair
from tests.threads import one_thread  # noqa: F401 (autouse: one torch thread in this folder)


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device(os.environ.get("SPECOPS_TEST_DEVICE", "cpu"))


@pytest.fixture(scope="session")
def dtype() -> torch.dtype:
    return getattr(torch, os.environ.get("SPECOPS_TEST_DTYPE", "float32"))


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    """A 12-word pair with a broad target distribution, for the chi-square test."""
    return write_tiny_pair(
        tmp_path_factory.mktemp("small") / "pair", n_words=12, block_size=4, fit_steps=150, logit_scale=0.35
    )


@pytest.fixture(scope="session")
def mixed_pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    """An unfitted drafter with sliding + full layers (block 5): exactness must not need good drafts."""
    return write_tiny_pair(
        tmp_path_factory.mktemp("mixed") / "pair",
        block_size=5,
        layer_types=["sliding_attention", "full_attention"],
        fit_steps=0,
        seed=3,
    )


@pytest.fixture(scope="session")
def small_vocab_hybrid_pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    """The hybrid twin of `small_vocab_pair`, for the chi-square test."""
    return write_tiny_hybrid_pair(
        tmp_path_factory.mktemp("small_hybrid") / "pair",
        n_words=12,
        block_size=4,
        fit_steps=150,
        logit_scale=0.35,
    )
