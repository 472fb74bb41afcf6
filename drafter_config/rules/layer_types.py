"""DFL030-DFL034: which drafter layers attend through a sliding window.

Why: sliding layers are causal and windowed, full layers see the whole block; a config that lists
the wrong pattern, or a window the drafter was not trained with, changes every drafted token while
loading without complaint (the Qwen3.6 drafters use [S, S, S, S, F] with a 2048 window).
"""

from __future__ import annotations

from drafter_config.context import LintContext
from drafter_config.drafter import Field, is_int
from drafter_config.findings import Finding, show

KNOWN_TYPES = ("full_attention", "sliding_attention")


def check(ctx: LintContext) -> list[Finding]:
    field = ctx.drafter.field("layer_types")
    if field.present and not isinstance(field.value, list):
        return [
            ctx.at(
                "DFL030",
                field.path,
                f"layer_types {show(field.value)} is not a list",
                f"list one of {', '.join(KNOWN_TYPES)} per drafter layer",
            )
        ]
    types = field.value or []
    sliding = [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    return (
        _check_length(ctx, field, types)
        + _check_kinds(ctx, field, types)
        + (_check_window(ctx, sliding) if sliding else _check_unused_window(ctx))
    )


def _check_length(ctx: LintContext, field: Field, types: list) -> list[Finding]:
    """DFL030: one type per drafter layer."""
    layers = ctx.drafter.int_value("num_hidden_layers")
    if not field.present or layers is None or len(types) == layers:
        return []
    return [
        ctx.at(
            "DFL030",
            field.path,
            f"layer_types has {len(types)} entries but num_hidden_layers is {layers}",
            "list exactly one type per drafter layer (from the model card)",
        )
    ]


def _check_kinds(ctx: LintContext, field: Field, types: list) -> list[Finding]:
    """DFL031: entries that are not a drafter layer type."""
    findings = []
    for index, kind in enumerate(types):
        if kind not in KNOWN_TYPES:
            hint = f"use {' or '.join(KNOWN_TYPES)}"
            if kind == "linear_attention":
                hint += "; linear_attention is a Qwen3.5 target layer type, not a drafter one"
            findings.append(ctx.at("DFL031", (*field.path, index), f"unknown layer type {show(kind)}", hint))
    return findings


def _check_window(ctx: LintContext, sliding: list[int]) -> list[Finding]:
    """DFL032/DFL034: sliding layers need a positive window at least one block wide."""
    window = ctx.drafter.field("sliding_window")
    block = ctx.drafter.int_value("block_size")
    if not (is_int(window.value) and window.value > 0):
        return [
            ctx.at(
                "DFL032",
                window.path,
                f"layers {sliding} are sliding_attention but sliding_window is {show(window.value)}",
                "set sliding_window to the trained window (the model card's value, e.g. 2048)",
            )
        ]
    if block is not None and window.value < block:
        return [
            ctx.at(
                "DFL034",
                window.path,
                f"sliding_window {window.value} is smaller than block_size "
                f"{block}: a drafted block would not see its own start",
                f"set sliding_window to the trained window (>= {block})",
            )
        ]
    return []


def _check_unused_window(ctx: LintContext) -> list[Finding]:
    """DFL033: a sliding window configured although no layer slides."""
    window = ctx.drafter.field("sliding_window")
    use = ctx.drafter.field("use_sliding_window")
    if window.value is None and use.value is not True:
        return []
    path = window.path if window.value is not None else use.path
    return [
        ctx.at(
            "DFL033",
            path,
            f"sliding_window={show(window.value)}, use_sliding_window={show(use.value)} "
            "but no layer in layer_types is sliding_attention",
            "if the drafter slides, list its sliding layers in layer_types; otherwise set "
            "sliding_window to null and use_sliding_window to false",
        )
    ]
