"""Budgets that follow the load: the cost table (model, file, errors), the expected tokens of a
tree, the policy's choice, and a batched engine under it: still lossless, narrower trees when the
batch makes rows expensive, no speculation (and no drafter pass) when it makes drafting lose, and
drafting again, with the drafter's cache complete, once the load drops."""

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
    model = CostTable.model(knee=32, draft_share=0.25)
    assert model(1) == model(32) == 1.0 and model(64) == 2.0 and model(512) == 16.0
    # the drafter: a quarter of a weight read until its 16-row blocks reach the knee (2 slots)
    assert model(1, drafting=1) == model(1, drafting=2) == 1.25 and model(1, drafting=8) == 2.0
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"rows": [1, 10, 20], "seconds": [1.0, 1.0, 3.0]}))
    table = CostTable.load(path)  # a table without the drafter's share: its pass counts as free
    assert (table(0), table(5), table(15), table(30)) == (1.0, 1.0, 2.0, 5.0)
    assert table(15, drafting=4) == 2.0
    path.write_text(
        json.dumps(
            {"rows": [1, 10, 20], "seconds": [1, 1, 3], "draft_slots": [1, 4], "draft_seconds": [0.5, 2]}
        )
    )
    table = CostTable.load(path)
    assert (table(15), table(15, drafting=1), table(15, drafting=2), table(15, drafting=8)) == (2, 2.5, 3, 6)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not a cost table"),
        ('{"rows": [1, 2]}', "not a cost table"),
        ('{"rows": [2, 1], "seconds": [1, 1]}', "increasing"),
        ('{"rows": [1, 2], "seconds": [1, 0]}', "seconds positive"),
        ('{"rows": [1], "seconds": [1], "draft_slots": [1, 2]}', "draft_slots must be"),
        ('{"rows": [1], "seconds": [1], "draft_slots": [0], "draft_seconds": [1]}', "draft_slots must be"),
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
    for fixed in ([1], [65]):  # beside an `ar` slot, beside a slot as wide as the widest tree
        picked = policy.choose(gains, [64, 64], fixed_rows=fixed, fixed_tokens=1.0)

        def rate(choice: tuple[int, ...], fixed: list[int] = fixed) -> float:
            rows = 3 * max(fixed[0], *(b + 1 for b in choice))  # every slot padded to the widest
            tokens = 1.0 + sum(g[b] for g, b in zip(gains, choice, strict=True))
            return tokens / costs(rows, drafting=sum(b > 0 for b in choice))

        assert tuple(picked) == max(itertools.product((0, *BUDGETS), repeat=2), key=rate)
    hopeless = [1.0] * 65  # a draft that never gets accepted: its slot verifies its root alone
    assert policy.choose([gains[0], hopeless], [64, 64], [65], 1.0) == [64, 0]
    assert BudgetPolicy(BUDGETS, CostTable.model(knee=10**6)).choose(gains, [64, 16], [1], 1.0) == [64, 16]


def test_the_policy_turns_speculation_off_when_the_drafter_and_the_rows_cost_more_than_they_give() -> None:
    """Sixteen slots whose drafts give 3 tokens at budget 4: with rows nearly free and a dear drafter
    pass, no single slot's draft pays for the pass but all of them together do; with rows dear,
    none drafts."""
    gains = [[1.0, 2.0, 2.5, 2.8, 3.0]] * 16
    policy = BudgetPolicy((4,), CostTable((1, 1000), (1.0, 1.1), (1, 16), (1.0, 1.0)))
    assert policy.choose(gains, [4] * 16, fixed_rows=[], fixed_tokens=0.0) == [4] * 16
    dear_rows = BudgetPolicy((4,), CostTable((1, 16, 80), (1.0, 1.0, 5.0), (1, 16), (0.5, 1.0)))
    assert dear_rows.choose(gains, [4] * 16, fixed_rows=[], fixed_tokens=0.0) == [0] * 16
    assert dear_rows.choose(gains[:1], [4], fixed_rows=[], fixed_tokens=0.0) == [4]  # alone, drafting pays
    assert policy.choose(gains[:1], [4], fixed_rows=[1] * 15, fixed_tokens=15.0) == [0]
    beside_drafters = policy.choose(gains[:1], [4], fixed_rows=[1] * 15, fixed_tokens=15.0, drafting=15)
    assert beside_drafters == [4]


def test_rounds_served_dearer_than_the_table_make_speculation_pay(tmp_path: Path) -> None:
    """The demo pair's table at 16 slots (seconds): drafts worth 3 tokens at budget 4 do not pay
    (16 tokens in 6 ms against 48 in 21 ms). Served rounds of 16 slots that take 4 ms more than
    the table says, whatever their rows, do: 16 in 10 ms against 48 in 25. The overhead is kept
    by the rounds' slots (rounds of one slot cost less than the table's rows say), counted for
    the nearest count served where none was, and moves in steps (a tenth of the cheapest round),
    so a steady load keeps its cached choice; each count's mean starts plain (its first rounds
    count whole). A model table (weight reads, not seconds) and rounds faster than the table
    leave it at 0."""
    path = tmp_path / "costs.json"
    path.write_text(
        json.dumps(
            {
                "rows": [16, 80],
                "seconds": [0.006, 0.016],
                "draft_slots": [1, 16],
                "draft_seconds": [0.0025, 0.005],
            }
        )
    )
    table = CostTable.load(path)
    assert table.seconds and not CostTable.model().seconds
    gains = [[1.0, 2.0, 2.5, 2.8, 3.0]] * 16
    policy, model = BudgetPolicy((4,), table), BudgetPolicy((4,), CostTable.model(knee=16))
    assert policy.choose(gains, [4] * 16, fixed_rows=[], fixed_tokens=0.0) == [0] * 16
    policy.observe(16, 16, 0, 0.0065)  # 0.5 ms over
    policy.observe(16, 16, 0, 0.0070)  # 1 ms over: the mean moves to 0.75 ms, under a step of 0.6
    assert policy.excess == {16: pytest.approx(7.5e-4)} and policy.overhead == {16: pytest.approx(5e-4)}
    assert policy.choose(gains, [4] * 16, fixed_rows=[], fixed_tokens=0.0) == [0] * 16
    for p in (policy, model):
        for _ in range(50):
            p.observe(16, 16, 0, 0.010)  # `ar` rounds, 4 ms over the table's 6
            p.observe(16, 80, 16, 0.025)  # tree rounds, 4 ms over its 21
            p.observe(1, 5, 1, 0.007)  # a slot alone: 1.5 ms under the table's 8.5
    assert policy.excess[16] == pytest.approx(0.004, abs=1e-4) and policy.excess[1] < 0
    assert model.excess == model.overhead == {}
    assert policy.overhead[16] == pytest.approx(0.004, abs=6e-4) and policy.overhead[1] == 0.0
    assert policy.choose(gains, [4] * 16, fixed_rows=[], fixed_tokens=0.0) == [4] * 16
    assert policy.shared(gains, 4) == 4
    assert policy.overhead_at(12) == policy.overhead[16] and policy.overhead_at(3) == 0.0
    fast = BudgetPolicy((4,), table)
    fast.observe(16, 16, 0, 0.003)
    assert fast.excess[16] < 0 and fast.overhead_at(16) == 0.0


def test_verified_trees_scale_the_curves_they_were_picked_by() -> None:
    """Curves that expect 1 drafted token at budget 4 where trees give 2 (a drafter that
    understates acceptance at T = 0): with 16 slots and rows dear, such drafts do not pay; once
    verified trees have shown it (the plain mean of the first, then a running one), every curve's
    drafted tokens count twice and they do. Trees that give less than expected never scale the
    curves down (that could keep every slot off speculation, with no tree left to correct it)."""
    table = CostTable((16, 80), (1.0, 2.0), (1, 16), (0.1, 0.5))  # 16 tokens for 1; 32 or 48 for 2.5
    gains = [[1.0, 1.5, 1.8, 1.9, 2.0]] * 16
    policy = BudgetPolicy((4,), table)
    assert policy.choose(gains, [4] * 16, fixed_rows=[], fixed_tokens=0.0) == [0] * 16
    policy.credit(2.0, 3)
    policy.credit(2.0, 3)
    assert (policy.promised, policy.verified, policy.scale) == (1.0, 2.0, 2.0)
    assert policy.calibrated(gains)[0] == [1.0, 2.0, 2.6, 2.8, 3.0]
    assert policy.choose(gains, [4] * 16, fixed_rows=[], fixed_tokens=0.0) == [4] * 16
    assert policy.shared(gains, 4) == 4
    policy.credit(2.0, 2)  # the mean drafted: 1 expected, 5/3 verified; the scale moves (5% steps)
    assert policy.scale == pytest.approx(5 / 3)
    policy.credit(2.0, 2)
    assert policy.scale == pytest.approx(1.5)
    policy.credit(2.6, 3)  # 1.12 expected, 1.6 verified: 1.43, within a step of 1.5
    assert policy.verified / policy.promised == pytest.approx(1.6 / 1.12) and policy.scale == pytest.approx(
        1.5
    )
    low = BudgetPolicy((4,), table)
    for _ in range(10):
        low.credit(3.0, 1)
    assert low.verified == 0.0 and low.scale == 1.0


def test_probes_grow_rare_while_speculation_does_not_pay() -> None:
    policy = BudgetPolicy((4,), probe_every=8)
    gaps = [0]
    for _ in range(7):
        gaps.append(policy.next_gap(gaps[-1], speculating=False))
    assert gaps == [0, 8, 16, 32, 64, 128, 128, 128]  # at most 16 x probe_every
    assert policy.next_gap(128, speculating=True) == 8


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
            assert s.result is not None and set(s.budgets) <= {0, *BUDGETS}
            assert_same_tokens(alone, req["prompt_ids"], want, s.result.output_ids, dtype)

    def mean(lives: list[Live]) -> float:
        budgets = [b for s in lives for b in s.budgets[:3]]  # the rounds all four share
        return sum(budgets) / len(budgets)

    assert mean(batched) < mean(single)
    # every tree verified went to the policy's calibration (the first 200: their plain mean)
    drafted = [a for s in single + batched for a, b in zip(s.accepted, s.budgets, strict=True) if b > 0]
    assert engine.policy is not None and engine.policy.credited == len(drafted) <= 200
    assert engine.policy.verified == pytest.approx(sum(drafted) / len(drafted))
    # between probes the four ran tree rounds (graphed on CUDA) at the policy's one budget for all
    assert any(n == 4 and 0 < b < 64 for _, n, b, _ in engine.tree_rounds), engine.tree_rounds.keys()


@pytest.mark.parametrize("pair_name", ["tiny_pair", "hybrid_pair"])
def test_under_load_slots_stop_drafting_then_resume_with_the_drafters_cache_complete(
    request: pytest.FixtureRequest, pair_name: str, device: torch.device, dtype: torch.dtype
) -> None:
    """A cost table on which a slot's draft pays alone but not beside others (rows dear beyond a
    9-row pass): while four sequences decode, the ddtree slots verify their roots alone (`ar` rows)
    and the drafter runs only on probe rounds, which grow rarer; once the short ones leave, the long
    one drafts again.
    Every request gets its tokens alone, and after the switch the long one's rounds accept exactly
    what `Engine.generate` accepts from the same context: the drafter read the features of the rows
    committed while it was off (a hybrid target's DeltaNet states too)."""
    pair: TinyPair = request.getfixturevalue(pair_name)
    alone: Engine = engine_for(pair, device, dtype, max_context=256)
    target, drafter = load_pair(pair.target, pair.drafter, device, dtype)
    costs = CostTable((1, 9, 40), (1.0, 1.0, 20.0), (1, 4), (0.01, 0.04))
    engine = BatchEngine(target, drafter, 256, 4, policy=BudgetPolicy((8,), costs, probe_every=4))
    reqs: list[dict[str, Any]] = [
        {"prompt_ids": [7 + i, 20 + 3 * i, 11], "mode": mode, "budget": 8, "max_new_tokens": n, "eos_ids": ()}
        for i, (mode, n) in enumerate([("ddtree", 48), ("ddtree", 18), ("ar", 20), ("ddtree", 18)])
    ]
    live = [engine.add(**req) for req in reqs]
    loaded: list[tuple[int, bool]] = []  # rounds with all four decoding: (round, drafter ran)
    while engine.live:
        drafts, full, probe = engine.drafts, sum(s.decoding for s in engine.live) == 4, engine.probe_at
        engine.step()
        if full and len(engine.live) == 4:
            loaded.append((engine.rounds, engine.drafts > drafts))
            assert (engine.drafts > drafts) == (engine.rounds >= probe)  # the drafter ran for probes only
    probes = [r for r, ran in loaded if ran]
    assert len(loaded) >= 8 and len(probes) == 2 and probes[1] - probes[0] == 2 * 4  # off: the gap doubles
    if engine.step_graphs is not None:  # CUDA: the rounds off speculation replayed the step of every root
        assert any(kind == "roots" for kind, *_ in engine.step_graphs.graphs)
    for req, s in zip(reqs, live, strict=True):
        assert s.result is not None
        assert_same_tokens(
            alone, req["prompt_ids"], alone.generate(**req).output_ids, s.result.output_ids, dtype
        )
    long = live[0]
    assert long.result is not None and 0 in long.budgets
    switch = len(long.budgets) - next(i for i, b in enumerate(reversed(long.budgets)) if b == 0)
    assert switch < len(long.budgets) - 2, f"it never drafted again alone: {long.budgets}"
    assert set(long.budgets[switch:]) == {8}
    # tokens before the switch round: the prefill's, then each round's accepted drafts + 1
    before = 1 + sum(a + 1 for a in long.accepted[:switch])
    out = long.result.output_ids
    resumed = alone.generate(
        **{
            **reqs[0],
            "prompt_ids": reqs[0]["prompt_ids"] + out[: before - 1],
            "max_new_tokens": len(out) - before + 1,
        }
    )
    assert resumed.output_ids == out[before - 1 :]
    assert resumed.accepted_per_round == long.accepted[switch:]


def test_a_served_rounds_cost_beyond_a_table_in_seconds_turns_speculation_on(
    tiny_pair: TinyPair, device: torch.device, dtype: torch.dtype
) -> None:
    """A table in seconds, a millionth of what rounds take here, on which drafting does not pay at
    four slots (rows dear beyond 9): the first probe keeps every slot off speculation, and so does
    the next round (a probe's cost is not observed); that round costs far more than the table
    says, a cost per round that rows barely change, so from the next on (no probe yet) all four
    draft at their budget. Tokens stay each request's own."""
    alone: Engine = engine_for(tiny_pair, device, dtype, max_context=256)
    target, drafter = load_pair(tiny_pair.target, tiny_pair.drafter, device, dtype)
    costs = CostTable((1, 9, 40), (1e-6, 1e-6, 2e-5), (1, 4), (1e-8, 4e-8), seconds=True)
    policy = BudgetPolicy((8,), costs)
    engine = BatchEngine(target, drafter, 256, 4, policy=policy)
    reqs: list[dict[str, Any]] = [
        {
            "prompt_ids": [7 + i, 20 + 3 * i, 11],
            "mode": "ddtree",
            "budget": 8,
            "max_new_tokens": 32,
            "eos_ids": (),
        }
        for i in range(4)
    ]
    live = decode_together(engine, reqs)
    assert policy.overhead[4] > 1e-5  # the table's dearest round is 2e-5 s
    for req, s in zip(reqs, live, strict=True):
        assert s.result is not None and s.budgets[:2] == [0, 0] and set(s.budgets[2:]) == {8}, s.budgets
        assert_same_tokens(
            alone, req["prompt_ids"], alone.generate(**req).output_ids, s.result.output_ids, dtype
        )
