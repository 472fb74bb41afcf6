"""Budgets that follow the load: each round, every ddtree slot's tree size is picked so that the
batch's expected tokens per unit of round cost is highest, and under enough load that size is 0:
no speculation, the root alone (an `ar` row), and no drafter pass when no slot drafts.

At batch 1 a verify pass is bound by reading the weights, so a wide tree is nearly free; with many
slots the pass turns compute-bound and every extra row costs time, and so does the drafter's pass.
Two inputs decide:

- expected tokens of a slot's tree: the drafter's per-position probabilities score each prefix
  (the product of its marginals, the score `build_tree` ranks by); a tree of the best B prefixes
  is expected to yield 1 + (sum of their scores) tokens, the draft standing in for the target
  (B = 0: 1 token). The best-B tree is the first B nodes of the best-B_max tree (nodes come in
  descending score order, parents first), so one tree at the largest budget serves every choice.
  The drafted tokens (past the root's 1) are scaled by what verified trees gave against what
  their curves expected (`credit`, never below 1): at T = 0 the drafter's probabilities
  understate acceptance, and between probes a slot's last curve is one draft's view.
- the round cost (`CostTable`): the target's pass against the verify rows of the batch, plus
  drafting's share against the slots that draft; from a simple model by default, or measured
  (`python -m ddtree_runtime cost-table` writes it, `ddtree_runtime/cost_table.py`; format in
  `CostTable.load`). The
  batched pass pads every slot's rows to the widest slot's for attention (`attention_parts`), so
  the rows asked of the table are slots x the widest slot's rows: one wide tree among roots costs
  nearly what a wide tree in every slot does (demo pair on the CPU, bf16: 4 ddtree/16 slots beside
  12 roots 30 ms a round, 16 ddtree/16 slots 43 ms, 16 roots 7 ms). At one budget for all, as the
  table's rounds are measured, padded and total rows agree. A measured table is timed in a
  process that only decodes; a server's rounds of many slots cost more by about the same time
  each, whatever their rows (streaming, an HTTP thread in the process, clients on the cores),
  which makes speculation's fewer rounds pay more: the engine reports every round's wall time
  but a probe's (`observe`), and what rounds of as many slots cost beyond the table (a running
  mean, never below 0) is added to every round's cost.

The choice maximises (sum of the slots' expected tokens) / cost(padded rows, drafting slots) over
{0} and the served budgets, each slot capped by its request's budget: the best one budget for all,
then coordinate ascent from it (padding and drafting's share are steps in cost, which one slot's
move alone rarely pays for). It is made twice a round:

1. before drafting, from each slot's last drafted round's expected-token curve (a slot that has not
   drafted yet: the latest curve of any slot): the slots that pick 0 do not draft this round
   (when every slot is a greedy ddtree one of the same budget, the best one budget for all instead:
   the batch then runs a tree round of that budget, graphed on CUDA, until the next probe);
2. after drafting, from the fresh curves: each drafted slot's budget. The same rule: a slot that
   takes a tree still pays its share of drafting (most of it on a CPU is the slot's tree: build,
   plan, walk and commit, not the drafter's pass), so a probe (below) whose curves say drafting
   does not pay verifies roots alone.

A slot off speculation keeps its last curve, so it drafts again as soon as the load drops (the
batch shrinks) enough for that curve to pay. Now and then every slot drafts (a probe: one drafter
pass for all), so that a curve gone stale is refreshed: `probe_every` rounds after a probe in
which a slot took a tree, twice the last gap after one in which none did (up to `PROBE_BACKOFF`
times `probe_every`): a probe costs a drafter pass that the load has said does not pay. The first
round with a policy is a probe (no curve yet). Tokens stay exact whatever is picked: a ddtree
slot's `ar` row commits the target's own token, and its features still go to the drafter.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ddtree_runtime.backend import ancestors

# rows at which a verify pass stops being bound by the weight read (compute = memory time): about
# peak FLOP/s over (2 FLOP/weight x memory bandwidth / bytes per weight), ~200-300 on H100/H200 in
# bf16. A guess for the default table; a measured one replaces it.
DEFAULT_KNEE = 256
# the drafter's pass against one target weight read, for the default table: a DFlash drafter is a
# few layers (5 for an 8B target of 36) plus the target's LM head over its block; it drafts a
# block of DRAFT_BLOCK rows per slot, so it turns compute-bound at knee / DRAFT_BLOCK slots
DEFAULT_DRAFT_SHARE = 0.2
DRAFT_BLOCK = 16
PROBE_EVERY = 8  # rounds from a probe to the next while drafting pays (module docstring)
PROBE_BACKOFF = 16  # ... and at most this many times that while it does not
EXCESS_WEIGHT = 0.1  # a served round's weight in the running mean of what rounds cost beyond the table
# ... which moves the overhead the choices count once it is this share of the table's cheapest
# round away from it: under a steady load the choices stay cached (`BudgetPolicy.choose`)
EXCESS_STEP = 0.1
CREDIT_WEIGHT = 0.005  # a verified tree's weight in the running means of drafted tokens promised and got
SCALE_STEP = 0.05  # ... whose ratio moves the curves' scale once it is this share of the scale away
# the scale corrects the curves, it does not replace them; and it never lowers them: trees are what
# it learns from, and a scale that kept every slot off speculation would never be corrected
SCALE_BOUNDS = (1.0, 4.0)
FIX = "rewrite it with `python -m ddtree_runtime cost-table ... --out FILE`"


class CostTableError(ValueError):
    """A cost table file that cannot be used; the message names the file, the field and the fix."""


def interpolate(xs: tuple[int, ...], ys: tuple[float, ...], x: int) -> float:
    """The curve through points (xs, ys) at x: linear between them and along the last segment beyond
    the last point (the first point's value below it), never under the cheapest point."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    i = min(bisect.bisect_left(xs, x), len(xs) - 1)  # segment i-1..i (the last beyond)
    (x0, x1), (y0, y1) = xs[i - 1 : i + 1], ys[i - 1 : i + 1]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), min(ys))


@dataclass(frozen=True)
class CostTable:
    """Round cost: the target's pass (verify, walk, commit) against the total verify rows of the
    batch, plus the drafter's pass against the slots that draft (nothing when none does), each a
    curve of points (`interpolate`). No drafter points: its pass counts as free."""

    rows: tuple[int, ...]
    cost: tuple[float, ...]
    draft_slots: tuple[int, ...] = ()
    draft_cost: tuple[float, ...] = ()
    # its costs are wall seconds (a measured table, `load`), which the rounds served can correct
    # (`BudgetPolicy.observe`); the model's are weight reads
    seconds: bool = False

    @classmethod
    def model(cls, knee: int = DEFAULT_KNEE, draft_share: float = DEFAULT_DRAFT_SHARE) -> CostTable:
        """The simple model: one weight read per round (cost 1) until `knee` rows, then compute-bound
        (cost rows / knee); the drafter's pass `draft_share` of that, its rows `DRAFT_BLOCK` a slot."""
        points = [1, knee, 4 * knee]
        slots = sorted({1, max(2, knee // DRAFT_BLOCK), 4 * max(2, knee // DRAFT_BLOCK)})
        return cls(
            tuple(points),
            tuple(max(1.0, r / knee) for r in points),
            tuple(slots),
            tuple(draft_share * max(1.0, s * DRAFT_BLOCK / knee) for s in slots),
        )

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        """A JSON file `{"rows": [1, 16, 64, ...], "seconds": [...], "draft_slots": [1, 4, 16, ...],
        "draft_seconds": [...]}`: the measured time of a batched round without its drafter pass
        (verifying and committing) against its total verify rows, and of the drafter's pass against
        the slots that draft; counts strictly increasing, seconds positive (only ratios matter).
        The drafter's two fields are optional (a table without them, as older ones, timed whole
        rounds: skipping the drafter then saves nothing)."""
        try:
            doc = json.loads(Path(path).read_text())
            rows, seconds = doc["rows"], doc["seconds"]
            draft_slots, draft_seconds = doc.get("draft_slots"), doc.get("draft_seconds")
        except OSError as e:
            raise CostTableError(
                f"{path}: cannot read it ({e.strerror}) (fix: pass a readable file)"
            ) from None
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise CostTableError(
                f'{path}: not a cost table ({type(e).__name__}: {e}) (fix: {{"rows": [...], "seconds": [...]}})'
            ) from None
        if not curve(rows, seconds):
            raise CostTableError(
                f"{path}: rows must be increasing positive integers and seconds positive numbers, one "
                f"per row count (fix: {FIX})"
            )
        if (draft_slots, draft_seconds) == (None, None):
            return cls(tuple(rows), tuple(float(s) for s in seconds), seconds=True)
        if not curve(draft_slots, draft_seconds):
            raise CostTableError(
                f"{path}: draft_slots must be increasing positive integers and draft_seconds positive "
                f"numbers, one per slot count, or both left out (fix: {FIX})"
            )
        return cls(
            tuple(rows),
            tuple(float(s) for s in seconds),
            tuple(draft_slots),
            tuple(float(s) for s in draft_seconds),
            seconds=True,
        )

    def __call__(self, rows: int, drafting: int = 0) -> float:
        """The cost of a round of `rows` verify rows in which `drafting` slots draft."""
        verify = interpolate(self.rows, self.cost, rows)
        if drafting == 0 or not self.draft_slots:
            return verify
        return verify + interpolate(self.draft_slots, self.draft_cost, drafting)


def curve(xs: object, ys: object) -> bool:
    """Whether (xs, ys) from a JSON file make a cost curve: increasing positive integer counts, one
    positive number each."""
    return (
        isinstance(xs, list)
        and isinstance(ys, list)
        and len(xs) == len(ys) >= 1
        and all(isinstance(x, int) and x >= 1 for x in xs)
        and all(isinstance(y, (int, float)) and y > 0 for y in ys)
        and all(a < b for a, b in itertools.pairwise(xs))
    )


def expected_gains(draft_logits: Tensor, tokens: Tensor, parents: Tensor, depth: Tensor) -> list[float]:
    """Expected tokens of the best-B tree for B = 0 .. N - 1, from a tree of N nodes in descending
    score order (as `build_tree` makes it, or a chain): 1 + the sum of the first B nodes' scores."""
    logp = torch.log_softmax(draft_logits.float(), dim=-1)
    node_logp = logp[(depth - 1).clamp(min=0), tokens].masked_fill(depth == 0, 0.0)
    scores = (ancestors(parents).float() @ node_logp).exp()  # each node: its prefix's probability
    scores[0] = 0.0  # the root is no draft
    return (1.0 + scores.cumsum(0)).tolist()


class BudgetPolicy:
    """Picks every ddtree slot's budget each round from 0 and the served `budgets` (see the module)."""

    def __init__(
        self, budgets: tuple[int, ...], costs: CostTable | None = None, probe_every: int = PROBE_EVERY
    ) -> None:
        self.budgets = tuple(sorted(set(budgets)))
        self.costs = costs or CostTable.model()
        self.probe_every = probe_every
        # by the round's slots: rounds served, the seconds they cost beyond the table (a running
        # mean) and that as the choices count it, added to every round of as many slots (`observe`)
        self.observed: Counter[int] = Counter()
        self.excess: dict[int, float] = {}
        self.overhead: dict[int, float] = {}
        self.credited = 0  # trees verified (`credit`)
        self.promised = 0.0  # drafted tokens their curves expected of them: a running mean
        self.verified = 0.0  # ... and drafted tokens they gave
        self.scale = 1.0  # what the choices count of a curve's drafted tokens (`credit`)
        # the last choice and what it was asked: slots off speculation keep their curves, so under
        # a steady load most rounds ask the same again
        self.last: tuple[tuple[object, ...], list[int]] | None = None

    def observe(self, slots: int, rows: int, drafting: int, seconds: float) -> None:
        """A served round's wall time (not a probe's), its `slots`, its rows padded as the table
        counts them and `drafting` slots drafting: what it cost beyond the table goes into the
        running mean `excess` of rounds of as many slots (a table in seconds only; rounds of fewer
        slots than the table's cost less at the same rows), and that into the `overhead` the
        choices count once it has moved by `EXCESS_STEP` of the cheapest round. The table is
        timed in a process that only decodes; a server's rounds also stream every slot's tokens,
        beside an HTTP thread in the process and clients on the cores, a cost per round whatever its
        rows that grows with its slots (demo pair on the CPU: ~4-6 ms on a 6 ms `ar` round of 16
        slots, none at 1),
        which makes the fewer rounds of speculation pay more. The overhead is never below 0: a
        table slower than the rounds served is one to measure again, and a round cost at or below
        0 would rank nothing."""
        if not self.costs.seconds:
            return
        self.observed[slots] += 1
        weight = max(EXCESS_WEIGHT, 1 / self.observed[slots])  # the plain mean of the first rounds
        excess = self.excess.get(slots, 0.0)
        self.excess[slots] = excess = excess + weight * (seconds - self.costs(rows, drafting) - excess)
        counted = self.overhead.get(slots)
        if counted is None or abs(max(excess, 0.0) - counted) > EXCESS_STEP * min(self.costs.cost):
            self.overhead[slots] = max(excess, 0.0)

    def overhead_at(self, slots: int) -> float:
        """The overhead the choices count for a round of `slots`: that of rounds of as many, else of
        the nearest count served (the larger at a tie), else none."""
        if not self.overhead:
            return 0.0
        return self.overhead[min(self.overhead, key=lambda n: (abs(n - slots), -n))]

    def credit(self, expected: float, got: int) -> None:
        """A verified tree's expected tokens (its slot's curve that its budget was chosen by, at
        that budget) and the tokens it gave. Their drafted tokens (the root's one aside) go into
        running means, whose ratio scales every curve's drafted tokens once it has moved by
        `SCALE_STEP` (within `SCALE_BOUNDS`). At T = 0 a draft is accepted when it is the target's
        argmax, which the drafter's probability (a soft copy of the target's) understates, and a
        slot's last curve (between probes the only one) is one draft's view: demo pair at 16
        slots, trees picked from those curves expected 2.2 tokens at budget 4 and 3.0-3.3 at 8
        and gave 2.8 and 3.9-4.2, so slots stayed off speculation and trees narrow where wider
        ones paid."""
        self.credited += 1
        weight = max(CREDIT_WEIGHT, 1 / self.credited)  # the plain mean of the first trees
        self.promised += weight * (expected - 1.0 - self.promised)
        self.verified += weight * (got - 1 - self.verified)
        if self.promised > 0:
            ratio = min(max(self.verified / self.promised, SCALE_BOUNDS[0]), SCALE_BOUNDS[1])
            if abs(ratio - self.scale) > SCALE_STEP * self.scale:
                self.scale = ratio

    def calibrated(self, gains: list[list[float]]) -> list[list[float]]:
        """The curves with their drafted tokens scaled as verified trees say (`credit`)."""
        if self.scale == 1.0:
            return gains
        return [[1.0 + self.scale * (x - 1.0) for x in g] for g in gains]

    def cost(self, slots: int, rows: int, drafting: int) -> float:
        """A round's cost as the choices count it: the table's and the observed overhead."""
        return self.costs(rows, drafting) + self.overhead_at(slots)

    def choose(
        self,
        gains: list[list[float]],
        caps: list[int],
        fixed_rows: list[int],
        fixed_tokens: float,
        drafting: int = 0,
    ) -> list[int]:
        """Budgets (0: the root alone) for slots with expected-token curves `gains` (gains[s][B]; a
        shorter curve stays flat past its end) and caps, beside slots whose rows (`fixed_rows`, one
        per slot) and expected tokens in all are set (`ar`, `dflash`, slots off speculation),
        `drafting` of which draft. A slot verifies B + 1 rows and pays its share of drafting if
        B > 0; the round costs as if every slot had the widest slot's rows (see the module)."""
        slots = len(fixed_rows) + len(caps)
        asked = (gains, caps, fixed_rows, fixed_tokens, drafting, self.overhead_at(slots), self.scale)
        if self.last is not None and self.last[0] == asked:
            return list(self.last[1])
        gains = self.calibrated(gains)
        options = self._options(caps)
        fixed_widest = max(fixed_rows, default=1)
        pick = self._uniform(gains, caps, options, fixed_rows, fixed_tokens, drafting)
        # then coordinate ascent, the batch's totals kept up to date: each candidate costs O(budgets)
        tokens = fixed_tokens + sum(gain(g, b) for g, b in zip(gains, pick, strict=True))
        drafts = drafting + sum(b > 0 for b in pick)
        counts = Counter(pick)
        for _ in range(2):  # two sweeps settle it in practice
            for s, (g, opts) in enumerate(zip(gains, options, strict=True)):
                counts[pick[s]] -= 1
                tokens, drafts = tokens - gain(g, pick[s]), drafts - (pick[s] > 0)
                widest = max([fixed_widest] + [b + 1 for b, n in counts.items() if n])
                pick[s] = b = max(
                    opts,
                    key=lambda b, g=g, w=widest, t=tokens, d=drafts: (
                        (t + gain(g, b)) / self.cost(slots, slots * max(w, b + 1), d + (b > 0))
                    ),
                )
                counts[b] += 1
                tokens, drafts = tokens + gain(g, b), drafts + (b > 0)
        self.last = (asked, pick)
        return list(pick)

    def _options(self, caps: list[int]) -> list[list[int]]:
        """Each slot's budgets to pick from: 0, the served ones under its cap, and its cap."""
        return [[0, *sorted({b for b in self.budgets if b < cap} | {cap})] for cap in caps]

    def _uniform(
        self,
        gains: list[list[float]],
        caps: list[int],
        options: list[list[int]],
        fixed_rows: list[int],
        fixed_tokens: float,
        drafting: int,
    ) -> list[int]:
        """The best one budget for all (each slot's largest of its `options` up to it), as `choose`
        asks it: with rows padded to the widest, one slot's move alone rarely pays, so uniform
        levels come first."""
        slots, fixed_widest = len(fixed_rows) + len(caps), max(fixed_rows, default=1)

        def rate(pick: list[int]) -> float:
            tokens = fixed_tokens + sum(gain(g, b) for g, b in zip(gains, pick, strict=True))
            rows = slots * max([fixed_widest] + [b + 1 for b in pick])
            return tokens / self.cost(slots, rows, drafting + sum(b > 0 for b in pick))

        levels = sorted({0, *self.budgets, *caps})
        return max(([max(b for b in opts if b <= level) for opts in options] for level in levels), key=rate)

    def shared(self, gains: list[list[float]], cap: int) -> int:
        """The best one budget for slots with curves `gains`, each capped at `cap` and none beside
        them: what a round of one budget for all (`BatchEngine`'s tree round) verifies."""
        caps = [cap] * len(gains)
        return self._uniform(self.calibrated(gains), caps, self._options(caps), [], 0.0, 0)[0]

    def next_gap(self, gap: int, speculating: bool) -> int:
        """Rounds to the next probe after one with `gap` before it: `probe_every` if a slot took a
        tree, else twice the gap (at most `PROBE_BACKOFF` times `probe_every`): under a steady load
        that turns speculation off, probes grow rare."""
        if speculating:
            return self.probe_every
        return min(max(2 * gap, self.probe_every), PROBE_BACKOFF * self.probe_every)


def gain(curve: list[float], budget: int) -> float:
    """Expected tokens at `budget` from a curve by budget, flat past its end."""
    return curve[min(budget, len(curve) - 1)]
