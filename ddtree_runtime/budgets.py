"""Budgets that follow the load: each round, every ddtree slot's tree size is picked so that the
batch's expected tokens per unit of round cost is highest.

At batch 1 a verify pass is bound by reading the weights, so a wide tree is nearly free; with many
slots the pass turns compute-bound and every extra row costs time. Two inputs decide:

- expected tokens of a slot's tree: the drafter's per-position probabilities score each prefix
  (the product of its marginals, the score `build_tree` ranks by); a tree of the best B prefixes
  is expected to yield 1 + (sum of their scores) tokens, the draft standing in for the target.
  The best-B tree is the first B nodes of the best-B_max tree (nodes come in descending score
  order, parents first), so one tree at the largest budget serves every choice.
- the round cost as a function of the total verify rows of the batch (`CostTable`): a small table,
  from a simple model by default, or measured (`fab tune` writes it; format in `CostTable.load`).

The choice maximises (sum of the slots' expected tokens) / cost(total rows) by coordinate ascent
over the served budgets, each slot capped by its request's budget.
"""

from __future__ import annotations

import bisect
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ddtree_runtime.backend import ancestors

# rows at which a verify pass stops being bound by the weight read (compute = memory time): about
# peak FLOP/s over (2 FLOP/weight x memory bandwidth / bytes per weight), ~200-300 on H100/H200 in
# bf16. A guess for the default table; a measured one replaces it.
DEFAULT_KNEE = 256


class CostTableError(ValueError):
    """A cost table file that cannot be used; the message names the file, the field and the fix."""


@dataclass(frozen=True)
class CostTable:
    """Round cost against the total verify rows of the batch: points, linear between them and
    along the last segment beyond the last point (the first point's cost below it)."""

    rows: tuple[int, ...]
    cost: tuple[float, ...]

    @classmethod
    def model(cls, knee: int = DEFAULT_KNEE) -> CostTable:
        """The simple model: one weight read per round (cost 1) until `knee` rows, then compute-bound
        (cost rows / knee)."""
        points = [1, knee, 4 * knee]
        return cls(tuple(points), tuple(max(1.0, r / knee) for r in points))

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        """A JSON file `{"rows": [1, 16, 64, ...], "seconds": [...]}`: the measured time of a
        batched round (drafting, verifying and committing) against its total verify rows, rows
        strictly increasing, seconds positive (only ratios matter)."""
        try:
            doc = json.loads(Path(path).read_text())
            rows, seconds = doc["rows"], doc["seconds"]
        except OSError as e:
            raise CostTableError(
                f"{path}: cannot read it ({e.strerror}) (fix: pass a readable file)"
            ) from None
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CostTableError(
                f'{path}: not a cost table ({type(e).__name__}: {e}) (fix: {{"rows": [...], "seconds": [...]}})'
            ) from None
        ok = (
            isinstance(rows, list)
            and isinstance(seconds, list)
            and len(rows) == len(seconds) >= 1
            and all(isinstance(r, int) and r >= 1 for r in rows)
            and all(isinstance(s, (int, float)) and s > 0 for s in seconds)
            and all(a < b for a, b in itertools.pairwise(rows))
        )
        if not ok:
            raise CostTableError(
                f"{path}: rows must be increasing positive integers and seconds positive numbers, one "
                "per row count (fix: rewrite it with `fab tune`)"
            )
        return cls(tuple(rows), tuple(float(s) for s in seconds))

    def __call__(self, rows: int) -> float:
        if len(self.rows) == 1 or rows <= self.rows[0]:
            return self.cost[0]
        i = min(bisect.bisect_left(self.rows, rows), len(self.rows) - 1)  # segment i-1..i (the last beyond)
        (r0, r1), (c0, c1) = self.rows[i - 1 : i + 1], self.cost[i - 1 : i + 1]
        return max(c0 + (c1 - c0) * (rows - r0) / (r1 - r0), min(self.cost))


def expected_gains(draft_logits: Tensor, tokens: Tensor, parents: Tensor, depth: Tensor) -> list[float]:
    """Expected tokens of the best-B tree for B = 0 .. N - 1, from a tree of N nodes in descending
    score order (as `build_tree` makes it, or a chain): 1 + the sum of the first B nodes' scores."""
    logp = torch.log_softmax(draft_logits.float(), dim=-1)
    node_logp = logp[(depth - 1).clamp(min=0), tokens].masked_fill(depth == 0, 0.0)
    scores = (ancestors(parents).float() @ node_logp).exp()  # each node: its prefix's probability
    scores[0] = 0.0  # the root is no draft
    return (1.0 + scores.cumsum(0)).tolist()


class BudgetPolicy:
    """Picks every ddtree slot's budget each round from the served `budgets` (see the module)."""

    def __init__(self, budgets: tuple[int, ...], costs: CostTable | None = None) -> None:
        self.budgets = tuple(sorted(set(budgets)))
        self.costs = costs or CostTable.model()

    def choose(
        self, gains: list[list[float]], caps: list[int], fixed_rows: int, fixed_tokens: float
    ) -> list[int]:
        """Budgets for slots with expected-token curves `gains` (gains[s][B]) and caps, beside
        slots whose rows and expected tokens are set (`ar`, `dflash`). Rows per slot: B + 1."""
        options = [sorted({b for b in self.budgets if b < cap} | {cap}) for cap in caps]
        pick = [opts[0] for opts in options]

        def rate(choice: list[int]) -> float:
            rows = fixed_rows + sum(b + 1 for b in choice)
            return (fixed_tokens + sum(g[b] for g, b in zip(gains, choice, strict=True))) / self.costs(rows)

        for _ in range(2):  # coordinate ascent; two sweeps settle it in practice
            for s, opts in enumerate(options):
                pick[s] = max(opts, key=lambda b, s=s: rate([*pick[:s], b, *pick[s + 1 :]]))
        return pick
