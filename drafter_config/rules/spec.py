"""Spec comparison: any drafter field that differs from the known-good spec.

Why: consistent-but-wrong values (a plausible mask id, a plausible window) pass every structural
rule; only the published values catch them. Each field reports under the code that owns it (see
SPEC_FIELDS), with the spec's value as the fix. target_layer_ids are compared in layer_ids.py,
which can also explain an off-by-one.
"""

from __future__ import annotations

from drafter_config.context import LintContext
from drafter_config.drafter import same_value
from drafter_config.findings import Finding, show
from drafter_config.spec import SPEC_FIELDS


def check(ctx: LintContext) -> list[Finding]:
    if ctx.spec is None:
        return []
    findings = []
    for name, want in ctx.spec.values.items():
        if name == "target_layer_ids":
            continue
        field = ctx.drafter.dtype if name == "dtype" else ctx.drafter.field(name)
        if field.present and same_value(field.value, want):
            continue
        if not field.present and want is None:
            continue
        code = SPEC_FIELDS[name][0]
        have = show(field.value) if field.present or ctx.drafter.locations(name) else "missing"
        findings.append(
            ctx.at(
                code,
                field.path,
                f"{name} is {have}; {ctx.spec.cite(name)} says {show(want)}",
                f"set {name} to {show(want)}",
            )
        )
    return findings
