"""Budgets that follow the load: the cost table (model, file, errors), the expected tokens of a
tree, the policy's choice, and a batched engine under it: still lossless, narrower trees when the
batch makes rows expensive."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.batching import BatchEngine, Live
from ddtree_runtime.budgets import BudgetPolicy, CostTable, CostTableError, expected_gains
from ddtree_runtime.engine import Engine
from ddtree_runtime.loader import load_pair
from ddtree_runtime.tiny import TinyPair
from tests.runtime.helpers import assert_same_tokens, engine_for

BUDGETS = (4, 16, 64)


def test_the_cost_table_interpolates_and_the_model_has_a_knee(tmp_path: Path) -> None:
    model = CostTable.model(knee=32)
    assert model(1) == model(32) == 1.0 and model(64) == 2.0 and model(512) == 16.0
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"rows": [1, 10, 20], "seconds": [1.0, 1.0, 3.0]}))
    table = CostTable.load(path)
    assert (table(0), table(5), table(15), table(30)) == (1.0, 1.0, 2.0, 5.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not a cost table"),
        ('{"rows": [1, 2]}', "not a cost table"),
        ('{"rows": [2, 1], "seconds": [1, 1]}', "increasing"),
        ('{"rows": [1, 2], "seconds": [1, 0]}', "seconds positive"),
    ],
)
def test_a_bad_cost_table_names_the_file_and_the_fix(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "costs.json"
    path.write_text(text)
    with pytest.raises(CostTableError, match=message) as e:
        CostTable.load(path)
    assert str(path) in str(e.value) and "fix:" in str(e.value)
    with pytest.raises(CostTableError, match="cannot read"):
        CostTable.load(tmp_path / "missing.json")


def test_expected_gains_sum_the_prefix_probabilities() -> None:
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.25, 0.25]])
    tokens, parents, depth = TorchBackend().build_tree(probs.log(), 4, torch.tensor(2))
    gains = expected_gains(probs.log(), tokens, parents, depth)
    # best prefixes: (0) .6, (1) .3, (0,0) .3, (0,1) .15
    assert gains == pytest.approx([1.0, 1.6, 1.9, 2.2, 2.35])


def test_the_policy_maximises_tokens_per_cost() -> None:
    gains = [[1.0 + 3 * (1 - 0.9**b) for b in range(65)], [1.0 + 1 - 0.5**b for b in range(65)]]
    costs = CostTable.model(knee=20)
    policy = BudgetPolicy(BUDGETS, costs)
    picked = policy.choose(gains, [64, 64], fixed_rows=1, fixed_tokens=1.0)

    def rate(choice: tuple[int, ...]) -> float:
        rows = 1 + sum(b + 1 for b in choice)
        return (1.0 + sum(g[b] for g, b in zip(gains, choice, strict=True))) / costs(rows)

    best = max(itertools.product(BUDGETS, repeat=2), key=rate)
    assert tuple(picked) == best and picked[0] > picked[1]  # the confident slot gets the wider tree
    assert BudgetPolicy(BUDGETS, CostTable.model(knee=10**6)).choose(gains, [64, 16], 1, 1.0) == [64, 16]


def decode_together(engine: BatchEngine, reqs: list[dict[str, Any]]) -> list[Live]:
    live = [engine.add(**req) for req in reqs]
    while engine.live:
        engine.step()
    return live


def test_budgets_narrow_under_load_and_tokens_stay_exact(
    tiny_pair: TinyPair, device: torch.device, dtype: torch.dtype
) -> None:
    alone: Engine = engine_for(tiny_pair, device, dtype, max_context=256)
    target, drafter = load_pair(tiny_pair.target, tiny_pair.drafter, device, dtype)
    # rows cost from 24 on: 1 slot of 65 rows costs 2.7 rounds, 4 slots of 65 cost 10.8
    engine = BatchEngine(target, drafter, 256, 4, policy=BudgetPolicy(BUDGETS, CostTable.model(knee=24)))
    reqs: list[dict[str, Any]] = [
        {
            "prompt_ids": [7 + i, 20 + 3 * i, 11],
            "mode": "ddtree",
            "budget": 64,
            "max_new_tokens": 24,
            "eos_ids": (),
        }
        for i in range(4)
    ]
    single = [decode_together(engine, [req])[0] for req in reqs]
    batched = decode_together(engine, reqs)
    for req, one, many in zip(reqs, single, batched, strict=True):
        want = alone.generate(**req).output_ids
        for s in (one, many):
            assert s.result is not None and set(s.budgets) <= set(BUDGETS)
            assert_same_tokens(alone, req["prompt_ids"], want, s.result.output_ids, dtype)

    def mean(lives: list[Live]) -> float:
        budgets = [b for s in lives for b in s.budgets[:3]]  # the rounds all four share
        return sum(budgets) / len(budgets)

    assert mean(batched) < mean(single)
