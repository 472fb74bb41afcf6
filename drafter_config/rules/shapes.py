"""DFL040-DFL045: the drafter's dimensions against the target's and against its own weights.

Why: the drafter has no embedding or LM head; it borrows the target's, so hidden_size and
vocab_size must match the target exactly. Rope, norm epsilon and context length that differ from
the target do not break loading but quietly shift the drafter's numerics (warnings). Attention
shapes are checked against the safetensors headers, since a wrong head count loads garbage.
"""

from __future__ import annotations

from drafter_config.context import LintContext
from drafter_config.drafter import same_value
from drafter_config.findings import Finding, show
from drafter_config.target import rope_settings


def _against_target(ctx: LintContext) -> list[Finding]:
    if ctx.target is None:
        return []
    return _borrowed_dims(ctx) + _rope(ctx) + _norm_eps(ctx) + _context_length(ctx)


def _borrowed_dims(ctx: LintContext) -> list[Finding]:
    """DFL040/DFL041: hidden_size and vocab_size must equal the target's embeddings and LM head."""
    target, drafter = ctx.target, ctx.drafter
    findings = []
    for code, name, want in (
        ("DFL040", "hidden_size", target.hidden_size),
        ("DFL041", "vocab_size", target.vocab_size),
    ):
        field = drafter.field(name)
        if want is not None and field.present and field.value != want:
            findings.append(
                ctx.at(
                    code,
                    field.path,
                    f"{name} is {show(field.value)} but the target's is {want} "
                    f"({target.where(name)}); the drafter uses the target's embeddings and LM head",
                    f"pair the drafter with the target it was trained for (or set {name} to {want} "
                    "if only the config is wrong)",
                )
            )
    return findings


def _rope(ctx: LintContext) -> list[Finding]:
    """DFL043: rope theta and scaling against the target's."""
    target, drafter = ctx.target, ctx.drafter
    findings = []
    theta, scaling = rope_settings(drafter.data)
    if target.rope_theta is not None and theta is not None and not same_value(theta, target.rope_theta):
        path = drafter.field("rope_theta").path if "rope_theta" in drafter.data else ("rope_parameters",)
        findings.append(
            ctx.at(
                "DFL043",
                path,
                f"rope_theta {theta} differs from the target's {target.rope_theta} "
                f"({target.where('rope_theta')})",
                f"set rope_theta to {target.rope_theta} unless the model card says otherwise",
            )
        )
    if not same_value(scaling, target.rope_scaling):
        findings.append(
            ctx.at(
                "DFL043",
                ("rope_scaling",),
                f"rope scaling {scaling} differs from the target's {target.rope_scaling}",
                "copy the target's rope scaling into the drafter config",
            )
        )
    return findings


def _norm_eps(ctx: LintContext) -> list[Finding]:
    """DFL044: rms_norm_eps against the target's."""
    want = ctx.target.rms_norm_eps
    eps = ctx.drafter.field("rms_norm_eps")
    if want is None or not eps.present or same_value(eps.value, want):
        return []
    return [
        ctx.at(
            "DFL044",
            eps.path,
            f"rms_norm_eps {eps.value} differs from the target's {want}",
            f"set rms_norm_eps to {want}",
        )
    ]


def _context_length(ctx: LintContext) -> list[Finding]:
    """DFL045: a rope table shorter than the target's context."""
    maxpos = ctx.drafter.field("max_position_embeddings")
    want = ctx.target.max_position_embeddings
    if want is None or not isinstance(maxpos.value, int) or maxpos.value >= want:
        return []
    return [
        ctx.at(
            "DFL045",
            maxpos.path,
            f"max_position_embeddings {maxpos.value} is below the "
            f"target's {want}: long prompts outrun the drafter's rope table",
            f"set max_position_embeddings to {want}",
        )
    ]


def expected_layer_shapes(ctx: LintContext) -> dict[str, tuple[tuple[int, ...], str]]:
    """Per-layer tensor suffix -> (shape the config implies, config key that sets it)."""
    d = ctx.drafter
    hidden, heads = d.int_value("hidden_size"), d.int_value("num_attention_heads")
    kv, head_dim, inter = (
        d.int_value("num_key_value_heads") or heads,
        d.head_dim(),
        d.int_value("intermediate_size"),
    )
    if not (hidden and heads and kv and head_dim):
        return {}
    shapes = {
        "self_attn.q_proj.weight": ((heads * head_dim, hidden), "num_attention_heads"),
        "self_attn.k_proj.weight": ((kv * head_dim, hidden), "num_key_value_heads"),
        "self_attn.v_proj.weight": ((kv * head_dim, hidden), "num_key_value_heads"),
        "self_attn.o_proj.weight": ((hidden, heads * head_dim), "num_attention_heads"),
        "self_attn.q_norm.weight": ((head_dim,), "head_dim"),
        "self_attn.k_norm.weight": ((head_dim,), "head_dim"),
        "input_layernorm.weight": ((hidden,), "hidden_size"),
        "post_attention_layernorm.weight": ((hidden,), "hidden_size"),
    }
    if inter:
        shapes["mlp.gate_proj.weight"] = ((inter, hidden), "intermediate_size")
        shapes["mlp.up_proj.weight"] = ((inter, hidden), "intermediate_size")
        shapes["mlp.down_proj.weight"] = ((hidden, inter), "intermediate_size")
    return shapes


def _against_weights(ctx: LintContext) -> list[Finding]:
    weights, layers = ctx.weights, ctx.drafter.int_value("num_hidden_layers")
    if weights is None or not layers:
        return []
    prefix = "model." if any(n.startswith("model.layers.") for n in weights.tensors) else ""
    mismatches: dict[tuple[str, tuple[int, ...], tuple[int, ...]], list[int]] = {}
    expected = expected_layer_shapes(ctx)
    for layer in range(layers):
        for suffix, (shape, _) in expected.items():
            tensor = weights.tensors.get(f"{prefix}layers.{layer}.{suffix}")
            if tensor is not None and tensor.shape != shape:
                mismatches.setdefault((suffix, shape, tensor.shape), []).append(layer)
    findings = []
    for (suffix, shape, actual), where in mismatches.items():
        key = expected[suffix][1]
        field = ctx.drafter.field(key)
        findings.append(
            ctx.at(
                "DFL042",
                field.path,
                f"{key}={show(field.value)} implies {suffix} {list(shape)}, but "
                f"the weights hold {list(actual)} (layers {where})",
                f"correct {key} (or head_dim / hidden_size) so that the config implies {list(actual)}",
            )
        )
    return findings


def check(ctx: LintContext) -> list[Finding]:
    return _against_target(ctx) + _against_weights(ctx)
