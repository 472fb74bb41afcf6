"""What the target's tokenizer files say each token id is used for.

Why: a mask_token_id that lands on ``<|im_end|>`` or on an ordinary word still "works" but every
drafted block starts from a real token, and acceptance collapses. Only the tokenizer files know
which ids are chat markers, bos/eos/pad or plain vocabulary; ``tokenizer.json`` (added_tokens and
model.vocab), ``tokenizer_config.json`` (added_tokens_decoder and role names) and
``special_tokens_map.json`` are all optional, and each one read adds what it knows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from drafter_config.source import MAX_JSON_BYTES, LintInputError, loads, read_text
from specops_files.store import Store, join

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")


@dataclass
class TokenUse:
    """One token id's meaning and which file said so."""

    content: str
    kind: str  # "special", "added", "vocab", or a role such as "eos_token"
    file: str


@dataclass
class TokenizerInfo:
    """Token ids known to the tokenizer files of one checkpoint directory."""

    files: list[str] = field(default_factory=list)
    uses: dict[int, TokenUse] = field(default_factory=dict)
    vocab: dict[str, int] = field(default_factory=dict)

    def use_of(self, token_id: int) -> TokenUse | None:
        return self.uses.get(token_id)


def _content(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _load(store: Store, path: str) -> dict[str, Any] | None:
    try:
        data = loads(read_text(store, path, MAX_JSON_BYTES))
    except (ValueError, LintInputError):
        return None
    return data if isinstance(data, dict) else None


def read_tokenizer(store: Store, directory: str) -> TokenizerInfo | None:
    """Read whichever tokenizer files exist in ``directory``; None when there are none."""
    present = set(store.listdir(directory))
    info = TokenizerInfo()
    by_content: dict[str, int] = {}
    roles: list[tuple[str, str, str]] = []
    for name in TOKENIZER_FILES:
        if name not in present:
            continue
        path = join(directory, name)
        data = _load(store, path)
        if data is None:
            continue
        info.files.append(path)
        for token in data.get("added_tokens") or []:
            if isinstance(token, dict) and isinstance(token.get("id"), int) and _content(token):
                kind = "special" if token.get("special") else "added"
                info.uses[token["id"]] = TokenUse(_content(token) or "", kind, path)
                by_content[_content(token) or ""] = token["id"]
        for key, token in (data.get("added_tokens_decoder") or {}).items():
            if str(key).isdigit() and _content(token):
                kind = "special" if isinstance(token, dict) and token.get("special") else "added"
                info.uses.setdefault(int(key), TokenUse(_content(token) or "", kind, path))
                by_content.setdefault(_content(token) or "", int(key))
        vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) else None
        if isinstance(vocab, dict):
            info.vocab = {k: v for k, v in vocab.items() if isinstance(v, int)}
        roles += [(role, c, path) for role in _ROLES if (c := _content(data.get(role)))]
    if not info.files:
        return None
    for role, content, path in roles:
        token_id = by_content.get(content, info.vocab.get(content))
        if token_id is not None:
            base = info.uses.get(token_id)
            info.uses[token_id] = TokenUse(content, role, base.file if base else path)
    return info
