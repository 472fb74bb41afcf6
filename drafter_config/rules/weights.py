"""DFL060-DFL063: do the stored tensors match what the config describes, and are they sound?

Why: a checkpoint whose tensors the config does not explain (more layers than num_hidden_layers,
a missing fc) loads with random or dropped weights under a lenient loader. Only the safetensors
headers are consulted: names, shapes and dtypes, never the data.
"""

from __future__ import annotations

import re

from drafter_config.context import LintContext
from drafter_config.findings import WARNING, Finding, show
from drafter_config.rules.shapes import expected_layer_shapes
from drafter_config.safetensors_header import WeightSet

DTYPES = {
    "bfloat16": "BF16",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")
_LIST_LIMIT = 5


def expected_names(ctx: LintContext, prefix: str) -> set[str]:
    """Every tensor name the DFlash architecture builds for this config."""
    layers = ctx.drafter.int_value("num_hidden_layers") or 0
    names = {f"{prefix}{n}" for n in ("fc.weight", "hidden_norm.weight", "norm.weight")}
    suffixes = list(expected_layer_shapes(ctx)) or [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ]
    if ctx.drafter.value("attention_bias") is True:
        suffixes += [f"self_attn.{p}_proj.bias" for p in "qkvo"]
    if not any(s.startswith("mlp.") for s in suffixes):
        suffixes += ["mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    names |= {f"{prefix}layers.{i}.{s}" for i in range(layers) for s in suffixes}
    return names


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_LIST_LIMIT])
    return shown + (f" and {len(names) - _LIST_LIMIT} more" if len(names) > _LIST_LIMIT else "")


def check(ctx: LintContext) -> list[Finding]:
    weights = ctx.weights
    if weights is None:
        return []
    findings = _unreadable(ctx, weights)
    if not weights.tensors:
        return findings + _no_weights(ctx, weights)
    return findings + _names(ctx, weights) + _dtype(ctx)


def _unreadable(ctx: LintContext, weights: WeightSet) -> list[Finding]:
    """DFL061-DFL063: files that could not be read, lie outside the checkpoint, or have bad offsets."""
    findings = [
        ctx.in_file("DFL061", file, message, "re-download or re-export the checkpoint")
        for file, message in weights.problems
    ]
    if weights.escapes:
        names = ", ".join(repr(name) for _, name in weights.escapes)
        findings.append(
            ctx.in_file(
                "DFL062",
                weights.escapes[0][0],
                f"weight_map names {len(weights.escapes)} "
                f"file(s) outside the checkpoint directory, not read: {names}",
                "a shard index may only name files beside it; re-download the checkpoint",
            )
        )
    findings += [
        ctx.in_file("DFL063", file, message, "the file is corrupt or crafted; re-download or re-export it")
        for file, message in weights.bad_offsets
    ]
    return findings


def _no_weights(ctx: LintContext, weights: WeightSet) -> list[Finding]:
    """DFL061: no tensors at all, unless a read problem already explains why."""
    if weights.problems or weights.escapes:
        return []
    return [
        ctx.at(
            "DFL061",
            (),
            "the drafter directory has no *.safetensors weights",
            "copy the drafter's model.safetensors next to its config.json",
        )
    ]


def _names(ctx: LintContext, weights: WeightSet) -> list[Finding]:
    """DFL061: tensor names against the names the config implies."""
    tensors = weights.tensors
    prefix = "model." if any(n.startswith("model.") for n in tensors) else ""
    expected = expected_names(ctx, prefix)
    extra = sorted(tensors.keys() - expected)
    layers = ctx.drafter.int_value("num_hidden_layers") or 0
    beyond = [n for n in extra if (m := _LAYER.match(n)) and int(m.group(1)) >= layers]
    others = [n for n in extra if n not in beyond]
    return (
        _missing(ctx, weights, sorted(expected - tensors.keys()))
        + _beyond_layers(ctx, beyond, layers)
        + _unexplained(ctx, weights, others)
    )


def _missing(ctx: LintContext, weights: WeightSet, missing: list[str]) -> list[Finding]:
    if not missing:
        return []
    first_file = weights.files[0] if weights.files else ctx.drafter.file
    return [
        ctx.in_file(
            "DFL061",
            first_file,
            f"{len(missing)} tensor(s) the config expects are missing: {_listed(missing)}",
            "check num_hidden_layers / attention_bias against the checkpoint, or re-download the weights",
        )
    ]


def _beyond_layers(ctx: LintContext, beyond: list[str], layers: int) -> list[Finding]:
    """Layer tensors past num_hidden_layers: the config undercounts the drafter's layers."""
    if not beyond:
        return []
    count = max(int(_LAYER.match(n).group(1)) for n in beyond) + 1
    field = ctx.drafter.field("num_hidden_layers")
    return [
        ctx.at(
            "DFL061",
            field.path,
            f"the weights hold layers up to {count - 1} "
            f"({_listed(beyond)}) but num_hidden_layers is {layers}",
            f"set num_hidden_layers to {count} (and layer_types to {count} entries)",
        )
    ]


def _unexplained(ctx: LintContext, weights: WeightSet, others: list[str]) -> list[Finding]:
    if not others:
        return []
    return [
        ctx.in_file(
            "DFL061",
            weights.tensors[others[0]].file,
            f"{len(others)} tensor(s) the config does not explain: {_listed(others)}",
            "check that this is a plain DFlash drafter and that the config matches the checkpoint",
            severity=WARNING,
        )
    ]


def _dtype(ctx: LintContext) -> list[Finding]:
    field = ctx.drafter.dtype
    stored = sorted({t.dtype for t in ctx.weights.tensors.values() if t.dtype.startswith(("F", "BF"))})
    want = DTYPES.get(str(field.value)) if field.present else None
    if want is None or not stored or stored == [want]:
        return []
    reverse = {v: k for k, v in DTYPES.items()}
    actual = ", ".join(reverse.get(s, s) for s in stored)
    return [
        ctx.at(
            "DFL060",
            field.path,
            f"{field.name} is {show(field.value)} but the weights are stored as {actual}",
            f'set {field.name} to "{reverse.get(stored[0], stored[0])}"'
            if len(stored) == 1
            else "re-export the weights in one dtype",
        )
    ]
