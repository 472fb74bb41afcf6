"""Lint rules, one module per group of codes; run in this order by drafter_config.lint.

Each module exposes ``check(ctx: LintContext) -> list[Finding]`` and reads nothing itself.
"""

from __future__ import annotations

from drafter_config.rules import (
    block,
    identity,
    layer_ids,
    layer_types,
    mask,
    quantization,
    shapes,
    spec,
    weights,
)

IDENTITY = identity.check
RULES = (
    mask.check,
    layer_ids.check,
    layer_types.check,
    shapes.check,
    quantization.check,
    block.check,
    weights.check,
    spec.check,
)
