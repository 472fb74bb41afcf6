"""DFL020-DFL025: which target hidden states feed the drafter's context projection.

Why: ``target_layer_ids`` are zero-based decoder-layer ids (layer i is HF ``hidden_states[i+1]``).
An off-by-one here, a count that disagrees with ``fc.weight``, or ids from another target depth
feed the drafter features it never saw in training: acceptance drops without any error.
"""

from __future__ import annotations

from itertools import pairwise

from drafter_config.context import LintContext
from drafter_config.drafter import Field, is_int
from drafter_config.findings import WARNING, Finding, show


def default_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The reference spread from layer 1 to L-3 used when a drafter is trained without explicit ids."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def _fc_weight(ctx: LintContext):
    if ctx.weights is None:
        return None
    for name in ("fc.weight", "model.fc.weight"):
        if name in ctx.weights.tensors:
            return ctx.weights.tensors[name]
    return None


def _check_count(ctx: LintContext, ids: list[int]) -> list[Finding]:
    fc = _fc_weight(ctx)
    if fc is None or len(fc.shape) != 2:
        return []
    hidden = (
        ctx.target.hidden_size
        if ctx.target and ctx.target.hidden_size
        else ctx.drafter.int_value("hidden_size")
    )
    if not hidden or fc.shape[1] == len(ids) * hidden:
        return []
    field = ctx.drafter.field("target_layer_ids")
    wanted = (
        f"{fc.shape[1] // hidden}"
        if fc.shape[1] % hidden == 0
        else f"{fc.shape[1]}/{hidden} (not a whole number of)"
    )
    return [
        ctx.at(
            "DFL024",
            field.path,
            f"{len(ids)} target_layer_ids need fc.weight input width "
            f"{len(ids)} x {hidden} = {len(ids) * hidden}, but {fc.file} has fc.weight {list(fc.shape)}",
            f"the weights were trained on {wanted} target layers; list that many ids "
            "(from the drafter's model card)",
        )
    ]


def _check_spec(ctx: LintContext, ids: list[int]) -> list[Finding]:
    if ctx.spec is None or "target_layer_ids" not in ctx.spec.values:
        return []
    want = ctx.spec.values["target_layer_ids"]
    if ids == want:
        return []
    field = ctx.drafter.field("target_layer_ids")
    message = f"target_layer_ids {ids} differ from {want} of {ctx.spec.cite('target_layer_ids')}"
    for shift, meaning in ((1, "one-based"), (-1, "shifted down by one")):
        if ids == [i + shift for i in want]:
            message += (
                f": they are the spec's ids {'+' if shift > 0 else '-'}1, the {meaning} hidden-state "
                "indexing mistake (layer i is hidden_states[i+1]; the config stores i)"
            )
    return [ctx.at("DFL025", field.path, message, f"set target_layer_ids to {want}")]


def check(ctx: LintContext) -> list[Finding]:
    count, source = ctx.target_layer_count()
    findings = _check_target_depth(ctx)
    field = ctx.drafter.field("target_layer_ids")
    if not field.present:
        return [*findings, _missing(ctx, field, count)]
    ids = field.value
    if not (isinstance(ids, list) and ids and all(is_int(i) and i >= 0 for i in ids)):
        return [*findings, _malformed(ctx, field)]
    return (
        findings
        + _check_order(ctx, field, ids)
        + _check_range(ctx, field, ids, count, source)
        + _check_count(ctx, ids)
        + _check_spec(ctx, ids)
    )


def _check_target_depth(ctx: LintContext) -> list[Finding]:
    """DFL023: the drafter's own num_target_layers against the target's layer count."""
    own = ctx.drafter.field("num_target_layers")
    if not (
        ctx.target is not None
        and ctx.target.num_layers is not None
        and own.present
        and own.value != ctx.target.num_layers
    ):
        return []
    return [
        ctx.at(
            "DFL023",
            own.path,
            f"num_target_layers is {show(own.value)} but the target has "
            f"{ctx.target.num_layers} layers ({ctx.target.where('num_hidden_layers')})",
            f"set num_target_layers to {ctx.target.num_layers}, or pair the drafter with "
            "the target it was trained for",
        )
    ]


def _missing(ctx: LintContext, field: Field, count: int | None) -> Finding:
    """DFL020: no target_layer_ids; the hint offers the reference default when the depths are known."""
    draft_layers = ctx.drafter.int_value("num_hidden_layers")
    hint = "copy target_layer_ids from the drafter's model card into dflash_config"
    if count and draft_layers:
        default = default_ids(count, draft_layers)
        hint += f" (the reference default for {count} target layers would be {default})"
    return ctx.at("DFL020", field.path, "target_layer_ids is missing", hint)


def _malformed(ctx: LintContext, field: Field) -> Finding:
    """DFL021: not a non-empty list of non-negative integers, so no further id check applies."""
    return ctx.at(
        "DFL021",
        field.path,
        f"target_layer_ids {show(field.value)} is not a non-empty list of non-negative integers",
        "list zero-based decoder-layer ids, e.g. [1, 9, 17, 25, 33]",
    )


def _check_order(ctx: LintContext, field: Field, ids: list[int]) -> list[Finding]:
    """DFL021: ids out of order or repeated."""
    if not any(b <= a for a, b in pairwise(ids)):
        return []
    return [
        ctx.at(
            "DFL021",
            field.path,
            f"target_layer_ids {ids} are not strictly increasing and distinct",
            f"use {sorted(set(ids))} if the order was a typo; the order must match the drafter's training",
        )
    ]


def _check_range(
    ctx: LintContext, field: Field, ids: list[int], count: int | None, source: str
) -> list[Finding]:
    """DFL022: ids past the target's last layer (errors) or at it (a warning)."""
    if count is None:
        return []
    findings = []
    for index, layer in enumerate(ids):
        if layer >= count:
            findings.append(
                ctx.at(
                    "DFL022",
                    (*field.path, index),
                    f"target layer id {layer} does not exist: {source} has {count} layers (0..{count - 1})",
                    "ids are zero-based decoder-layer ids; check for a one-based list",
                )
            )
        elif layer == count - 1:
            findings.append(
                ctx.at(
                    "DFL022",
                    (*field.path, index),
                    f"target layer id {layer} is the last layer "
                    f"of {count}: its output is the final hidden state, rarely a trained choice",
                    "check the model card; the reference spread stops at layer L-3",
                    severity=WARNING,
                )
            )
    return findings
