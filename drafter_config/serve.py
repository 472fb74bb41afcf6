"""The deployment side of the block size: ``num_speculative_tokens`` in a serve configuration.

Why: vLLM and our runtime draft ``block_size - 1`` tokens per round; a deployment that asks for a
different count either wastes drafter work or truncates every block. The value may sit at the top
of a YAML/JSON file, inside vLLM's ``speculative_config``, or in an inventory's ``serve`` vars, so
the first key of that name anywhere in the document is taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from drafter_config.source import LintInputError

KEY = "num_speculative_tokens"


@dataclass(frozen=True)
class ServeSetting:
    """One num_speculative_tokens value and where it was found."""

    value: object
    file: str
    line: int | None


def _find(node: yaml.Node) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == KEY:
                return value
        children = [value for _, value in node.value]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        return None
    for child in children:
        found = _find(child)
        if found is not None:
            return found
    return None


def load_serve_config(path: str) -> ServeSetting | None:
    """Read a YAML or JSON serve configuration; None when it sets no num_speculative_tokens."""
    file = Path(path)
    if not file.is_file():
        raise LintInputError(f"serve config {path}: no such file (fix: pass a YAML or JSON file)")
    try:
        root = yaml.compose(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise LintInputError(f"{path}: invalid YAML/JSON: {' '.join(str(exc).split())}") from None
    node = _find(root) if root is not None else None
    if node is None:
        return None
    return ServeSetting(yaml.safe_load(yaml.serialize(node)), path, node.start_mark.line + 1)


def serve_from_vars(serve: dict[str, object], origin: str) -> ServeSetting | None:
    """The same setting from an inventory's ``serve`` variables (no line numbers there)."""
    if KEY not in serve:
        return None
    return ServeSetting(serve[KEY], origin, None)
