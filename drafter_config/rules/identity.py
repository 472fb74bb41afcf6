"""DFL002: is this a DFlash drafter at all?

Why: every other rule assumes the z-lab layout; linting a target or an EAGLE head as a drafter
would bury the one real problem under dozens of meaningless findings, so the orchestrator stops
after an identity error.
"""

from __future__ import annotations

from drafter_config.context import LintContext
from drafter_config.drafter import ARCHITECTURE
from drafter_config.findings import Finding, show


def check(ctx: LintContext) -> list[Finding]:
    doc = ctx.drafter.doc
    if not isinstance(doc.data, dict):
        return [
            ctx.at(
                "DFL002",
                (),
                f"config is a JSON {type(doc.data).__name__}, not an object",
                "point at the drafter's config.json",
            )
        ]
    archs = doc.data.get("architectures")
    if isinstance(archs, list) and ARCHITECTURE in archs:
        return []
    hint = f'set "architectures": ["{ARCHITECTURE}"] if this is a z-lab DFlash drafter'
    if doc.data.get("model_type") and "dflash_config" not in doc.data and "block_size" not in doc.data:
        hint = (
            "this looks like a target model's config; pass the drafter as DRAFTER and the model as --target"
        )
    return [
        ctx.at("DFL002", ("architectures",), f'architectures is {show(archs)}, not ["{ARCHITECTURE}"]', hint)
    ]
