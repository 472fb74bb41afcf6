"""DFL050-DFL051: the block size, and the deployment's matching draft length.

Why: the drafter denoises ``[bonus, MASK x (block_size-1)]``; the engine must ask for exactly
block_size-1 speculative tokens or it wastes or truncates every round.
"""

from __future__ import annotations

from drafter_config.context import LintContext
from drafter_config.drafter import is_int
from drafter_config.findings import Finding, show


def check(ctx: LintContext) -> list[Finding]:
    field = ctx.drafter.field("block_size")
    spec = ctx.spec.values.get("block_size") if ctx.spec else None
    hint = (
        f"set block_size to {spec} ({ctx.spec.cite('block_size')})"
        if spec and ctx.spec
        else "set block_size to the trained block (the b16 in a model name means 16)"
    )
    if not field.present or not is_int(field.value) or field.value < 2:
        what = "missing" if not field.present else f"{show(field.value)}"
        return [ctx.at("DFL050", field.path, f"block_size is {what}; it must be an integer >= 2", hint)]
    serve = ctx.serve
    if serve is not None and serve.value != field.value - 1:
        return [
            ctx.in_file(
                "DFL051",
                serve.file,
                f"num_speculative_tokens is {show(serve.value)} but block_size "
                f"{field.value} drafts {field.value - 1} tokens per round",
                f"set num_speculative_tokens to {field.value - 1}",
                path="num_speculative_tokens",
                line=serve.line,
            )
        ]
    return []
