"""τ of a drafter measured with the runtime itself: `Engine.generate` at T=0 on held-out prompts,
for `dflash` and for `ddtree` at a few budgets (no proxy metric)."""

from __future__ import annotations

from collections.abc import Sequence

from ddtree_runtime.engine import Engine
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.target import Target


def measure_tau(
    target: Target,
    drafter: DFlashDrafter,
    prompts: Sequence[list[int]],
    budgets: Sequence[int] = (16, 64),
    max_new_tokens: int = 64,
) -> dict[str, float]:
    """{"dflash": τ, "ddtree@B": τ, ...}: accepted tokens per round over all rounds of all prompts."""
    rows = max([drafter.config.block_size, *(b + 1 for b in budgets)])
    longest = max(len(p) for p in prompts)
    engine = Engine(target, drafter, max_context=longest + max_new_tokens + rows)
    out: dict[str, float] = {}
    for mode, budget in [("dflash", 1), *(("ddtree", b) for b in budgets)]:
        accepted: list[int] = []
        for p in prompts:
            result = engine.generate(p, mode=mode, budget=budget, max_new_tokens=max_new_tokens, eos_ids=())
            accepted.extend(result.accepted_per_round)
        key = mode if mode == "dflash" else f"ddtree@{budget}"
        out[key] = sum(a + 1 for a in accepted) / len(accepted) if accepted else 0.0
    return out
