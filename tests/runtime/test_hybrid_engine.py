"""Decoding a Qwen3.5 hybrid target: every mode gives the `ar` tokens at T = 0, and verifying the
tree in flattened order through the recurrence (the naive port) does not."""

from __future__ import annotations

import random

import pytest
import torch
from torch import Tensor

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.engine import Engine
from ddtree_runtime.gated_delta import TreeAncestry
from ddtree_runtime.loader import load_pair
from ddtree_runtime.models.qwen3_5 import Qwen3_5
from ddtree_runtime.tiny import SPECIALS, TinyPair
from tests.runtime.helpers import assert_same_tokens, engine_for

BUDGETS = (1, 2, 7, 64, 256)


def prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[len(SPECIALS) + rng.randrange(64) for _ in range(rng.randint(1, 12))] for _ in range(count)]


class FlattenedRecurrence(TorchBackend):
    """The naive port: the tree's nodes go through the DeltaNet layers (recurrence and conv) in
    flattened order, as if the tree were a chain."""

    def gdn_plan(self, parents: Tensor, depth: Tensor, kernel: int) -> TreeAncestry:
        chain = torch.arange(-1, parents.shape[0] - 1, device=parents.device)
        return super().gdn_plan(chain, depth, kernel)


@pytest.fixture(scope="module")
def engine(hybrid_pair: TinyPair, device: torch.device, dtype: torch.dtype) -> Engine:
    return engine_for(hybrid_pair, device, dtype)


def test_the_pair_is_a_hybrid_with_a_sliding_drafter(engine: Engine) -> None:
    assert isinstance(engine.target, Qwen3_5)
    assert set(engine.target.config.layer_types) == {"linear_attention", "full_attention"}
    assert engine.drafter is not None
    assert engine.drafter.config.windows[0] is not None and engine.drafter.config.windows[-1] is None


@pytest.mark.parametrize("seed", [0, 1])
def test_speculative_modes_give_the_ar_tokens(engine: Engine, seed: int, dtype: torch.dtype) -> None:
    accepted = 0.0
    for prompt in prompts(seed, 4):
        want = engine.generate(prompt, mode="ar", max_new_tokens=32).output_ids
        got = engine.generate(prompt, mode="dflash", max_new_tokens=32)
        assert_same_tokens(engine, prompt, want, got.output_ids, dtype)
        for budget in BUDGETS:
            got = engine.generate(prompt, mode="ddtree", budget=budget, max_new_tokens=32)
            assert_same_tokens(engine, prompt, want, got.output_ids, dtype)
            accepted = max(accepted, got.mean_accepted)
    assert accepted > 2.0  # drafts are accepted: the states are advanced along multi-token paths


def test_dflash_with_other_block_sizes(engine: Engine, dtype: torch.dtype) -> None:
    for block_size, prompt in zip((2, 4, 9), prompts(5, 3), strict=True):
        want = engine.generate(prompt, mode="ar", max_new_tokens=24).output_ids
        got = engine.generate(prompt, mode="dflash", max_new_tokens=24, block_size=block_size)
        assert_same_tokens(engine, prompt, want, got.output_ids, dtype)


def test_flattened_order_verification_gives_wrong_tokens(
    hybrid_pair: TinyPair, engine: Engine, device: torch.device, dtype: torch.dtype
) -> None:
    """The regression this guards against: the same checkpoint, trees through the recurrence in
    node order, loses exactness (and the correct backend does not, on the same prompts)."""
    target, drafter = load_pair(hybrid_pair.target, hybrid_pair.drafter, device, dtype)
    naive = Engine(target, drafter, 512, FlattenedRecurrence())
    wrong = 0
    for prompt in prompts(2, 4):
        want = engine.generate(prompt, mode="ar", max_new_tokens=32).output_ids
        got = engine.generate(prompt, mode="ddtree", budget=64, max_new_tokens=32).output_ids
        assert_same_tokens(engine, prompt, want, got, dtype)
        wrong += naive.generate(prompt, mode="ddtree", budget=64, max_new_tokens=32).output_ids != want
    assert wrong >= 2
