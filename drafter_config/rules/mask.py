"""DFL010-DFL012: the mask token that fills positions 1..block_size-1 of every drafted block.

Why: the drafter was trained to denoise one specific token id. Any other id (out of range, or a
real token such as <|im_end|>) does not crash; drafts just stop matching, which is the silent
1%-acceptance failure this linter exists for.
"""

from __future__ import annotations

from drafter_config.context import LintContext
from drafter_config.drafter import is_int
from drafter_config.findings import ERROR, WARNING, Finding, show


def _spec_hint(ctx: LintContext) -> str:
    if ctx.spec is not None and "mask_token_id" in ctx.spec.values:
        return f"set it to {ctx.spec.values['mask_token_id']} ({ctx.spec.cite('mask_token_id')})"
    return "set it to the id of the drafter's mask token (<|MASK|>) from its model card"


def _collision(ctx: LintContext, mask: int) -> Finding | None:
    path = ctx.drafter.field("mask_token_id").path
    tok = ctx.tokenizer
    if tok is not None:
        use = tok.use_of(mask)
        if use is not None and "mask" not in use.content.lower():
            return ctx.at(
                "DFL012",
                path,
                f"mask_token_id {mask} is {use.content!r} ({use.kind}) in {use.file}",
                _spec_hint(ctx),
                severity=ERROR,
            )
        if use is None and mask in tok.vocab.values():
            word = next(w for w, i in tok.vocab.items() if i == mask)
            return ctx.at(
                "DFL012",
                path,
                f"mask_token_id {mask} is the ordinary token {word!r} in the tokenizer's vocabulary",
                _spec_hint(ctx),
                severity=ERROR,
            )
        if use is not None or tok.vocab:
            return None
    roles = dict(ctx.target.special_ids) if ctx.target is not None else {}
    for role in ("bos_token_id", "eos_token_id", "pad_token_id"):
        values = ctx.drafter.value(role)
        for value in values if isinstance(values, list) else [values]:
            if is_int(value):
                roles.setdefault(value, role.removesuffix("_id"))
    if mask in roles:
        return ctx.at(
            "DFL012",
            path,
            f"mask_token_id {mask} is also the {roles[mask]} id in the config",
            _spec_hint(ctx),
            severity=WARNING,
        )
    return None


def check(ctx: LintContext) -> list[Finding]:
    field = ctx.drafter.field("mask_token_id")
    if not field.present:
        return [
            ctx.at(
                "DFL010",
                field.path,
                "mask_token_id is missing (neither dflash_config.mask_token_id "
                "nor a top-level mask_token_id)",
                _spec_hint(ctx),
            )
        ]
    mask = field.value
    if not is_int(mask):
        return [
            ctx.at("DFL011", field.path, f"mask_token_id {show(mask)} is not an integer", _spec_hint(ctx))
        ]
    vocab, source = None, ""
    if ctx.target is not None and ctx.target.vocab_size is not None:
        vocab, source = ctx.target.vocab_size, f"the target's vocab_size ({ctx.target.where('vocab_size')})"
    elif ctx.drafter.int_value("vocab_size") is not None:
        vocab, source = ctx.drafter.int_value("vocab_size"), "vocab_size"
    if vocab is not None and not 0 <= mask < vocab:
        return [
            ctx.at(
                "DFL011",
                field.path,
                f"mask_token_id {mask} is outside [0, {vocab}) of {source}",
                _spec_hint(ctx),
            )
        ]
    collision = _collision(ctx, mask)
    return [collision] if collision else []
