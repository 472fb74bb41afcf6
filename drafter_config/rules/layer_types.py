"""DFL030-DFL034: which drafter layers attend through a sliding window.

Why: sliding layers are causal and windowed, full layers see the whole block; a config that lists
the wrong pattern, or a window the drafter was not trained with, changes every drafted token while
loading without complaint (the Qwen3.6 drafters use [S, S, S, S, F] with a 2048 window).
"""

from __future__ import annotations

from drafter_config.context import LintContext
from drafter_config.drafter import is_int
from drafter_config.findings import Finding, show

KNOWN_TYPES = ("full_attention", "sliding_attention")


def check(ctx: LintContext) -> list[Finding]:
    findings: list[Finding] = []
    field = ctx.drafter.field("layer_types")
    types = field.value
    layers = ctx.drafter.int_value("num_hidden_layers")
    if field.present and not isinstance(types, list):
        return [
            ctx.at(
                "DFL030",
                field.path,
                f"layer_types {show(types)} is not a list",
                f"list one of {', '.join(KNOWN_TYPES)} per drafter layer",
            )
        ]
    types = types or []
    if field.present and layers is not None and len(types) != layers:
        findings.append(
            ctx.at(
                "DFL030",
                field.path,
                f"layer_types has {len(types)} entries but num_hidden_layers is {layers}",
                "list exactly one type per drafter layer (from the model card)",
            )
        )
    for index, kind in enumerate(types):
        if kind not in KNOWN_TYPES:
            hint = f"use {' or '.join(KNOWN_TYPES)}"
            if kind == "linear_attention":
                hint += "; linear_attention is a Qwen3.5 target layer type, not a drafter one"
            findings.append(ctx.at("DFL031", (*field.path, index), f"unknown layer type {show(kind)}", hint))
    sliding = [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    window = ctx.drafter.field("sliding_window")
    use = ctx.drafter.field("use_sliding_window")
    block = ctx.drafter.int_value("block_size")
    if sliding:
        if not (is_int(window.value) and window.value > 0):
            findings.append(
                ctx.at(
                    "DFL032",
                    window.path,
                    f"layers {sliding} are sliding_attention but sliding_window is {show(window.value)}",
                    "set sliding_window to the trained window (the model card's value, e.g. 2048)",
                )
            )
        elif block is not None and window.value < block:
            findings.append(
                ctx.at(
                    "DFL034",
                    window.path,
                    f"sliding_window {window.value} is smaller than block_size "
                    f"{block}: a drafted block would not see its own start",
                    f"set sliding_window to the trained window (>= {block})",
                )
            )
    elif window.value is not None or use.value is True:
        path = window.path if window.value is not None else use.path
        findings.append(
            ctx.at(
                "DFL033",
                path,
                f"sliding_window={show(window.value)}, use_sliding_window={show(use.value)} "
                "but no layer in layer_types is sliding_attention",
                "if the drafter slides, list its sliding layers in layer_types; otherwise set "
                "sliding_window to null and use_sliding_window to false",
            )
        )
    return findings
