"""Fixtures for the training tests: one thread, and unfitted tiny pairs (the targets are the same
random models as the fitted `tiny_pair` and `hybrid_pair`; the drafters start untrained)."""

from __future__ import annotations

import pytest

from ddtree_runtime.tiny import TinyPair, write_tiny_pair
from ddtree_runtime.tiny_hybrid import write_tiny_hybrid_pair
from tests.threads import one_thread  # noqa: F401 (autouse: one torch thread in this folder)
from tests.train.test_pipeline import Reference, run_reference


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


@pytest.fixture(scope="session")
def hybrid_raw_pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    """The tiny hybrid target of `hybrid_pair` (3 Gated DeltaNet + 1 full attention) with an
    untrained sliding + full drafter."""
    return write_tiny_hybrid_pair(tmp_path_factory.mktemp("hybrid-raw") / "pair", fit_steps=0)


@pytest.fixture(scope="session")
def reference(raw_pair: TinyPair, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The tiny chain run once under torchrun on one host (world size 2): the pipeline test checks
    it, and the two-host job must reproduce its loss curve."""
    return run_reference(raw_pair.target, tmp_path_factory.mktemp("reference"))
