"""Known-good specs: the expected config values of one published drafter.

Why: rule checks catch what is inconsistent; only a spec catches what is consistent but wrong
(ids shifted by one, a mask id that is merely in range). A spec is a small YAML file (format in
specs/README.md) shipped with the project for published drafters, or written by the user from a
model card. Each spec field maps to the rule code that owns that field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from drafter_config.source import LintInputError
from specops_contract import did_you_mean

SPECS_DIR = Path(__file__).with_name("specs")

# spec field -> (rule code, accepted Python types)
SPEC_FIELDS: dict[str, tuple[str, tuple[type, ...]]] = {
    "architectures": ("DFL002", (list,)),
    "block_size": ("DFL050", (int,)),
    "mask_token_id": ("DFL011", (int,)),
    "target_layer_ids": ("DFL025", (list,)),
    "num_target_layers": ("DFL023", (int,)),
    "layer_types": ("DFL030", (list,)),
    "sliding_window": ("DFL032", (int, type(None))),
    "use_sliding_window": ("DFL032", (bool,)),
    "hidden_size": ("DFL040", (int,)),
    "vocab_size": ("DFL041", (int,)),
    "num_hidden_layers": ("DFL042", (int,)),
    "num_attention_heads": ("DFL042", (int,)),
    "num_key_value_heads": ("DFL042", (int,)),
    "head_dim": ("DFL042", (int,)),
    "intermediate_size": ("DFL042", (int,)),
    "rope_theta": ("DFL043", (int, float)),
    "rope_scaling": ("DFL043", (dict, type(None))),
    "rms_norm_eps": ("DFL044", (float, int)),
    "max_position_embeddings": ("DFL045", (int,)),
    "dtype": ("DFL060", (str,)),
}
_TOP_KEYS = ("name", "description", "drafter", "target", "source", "values", "min_tau")


@dataclass(frozen=True)
class Spec:
    name: str
    file: str
    values: dict[str, Any]
    lines: dict[str, int]  # spec field -> line in the spec file, for messages
    min_tau: float | dict[str, float] | None = None  # the acceptance gate's floor (fab deploy)

    def cite(self, key: str) -> str:
        return f"spec {self.name} ({self.file}:{self.lines.get(key, 1)})"


def shipped_specs() -> list[str]:
    return sorted(p.stem for p in SPECS_DIR.glob("*.yaml"))


def _suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    return did_you_mean(word, choices, f"known: {', '.join(choices)}")


def load_spec(name_or_file: str) -> Spec:
    """A shipped spec by name, or a YAML file by path; bad specs raise with file:line and the fix."""
    path = Path(name_or_file)
    if not path.is_file():
        shipped = SPECS_DIR / f"{name_or_file}.yaml"
        if not shipped.is_file():
            raise LintInputError(
                f"spec {name_or_file!r}: no such file or shipped spec "
                f"(fix: {_suggest(name_or_file, shipped_specs())})"
            )
        path = shipped
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"))
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise LintInputError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict) or not isinstance(data.get("values"), dict):
        raise LintInputError(
            f"{path}:1: a spec is a mapping with a 'values' mapping (fix: see drafter_config/specs/README.md)"
        )
    lines = {}
    for key_node, value_node in root.value:
        if key_node.value not in _TOP_KEYS:
            raise LintInputError(
                f"{path}:{key_node.start_mark.line + 1}: unknown key "
                f"'{key_node.value}' (fix: {_suggest(key_node.value, _TOP_KEYS)})"
            )
        if key_node.value == "values":
            lines = {k.value: k.start_mark.line + 1 for k, _ in value_node.value}
    for key, value in data["values"].items():
        if key not in SPEC_FIELDS:
            raise LintInputError(
                f"{path}:{lines.get(key, 1)}: unknown spec field '{key}' "
                f"(fix: {_suggest(key, list(SPEC_FIELDS))})"
            )
        types = SPEC_FIELDS[key][1]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise LintInputError(
                f"{path}:{lines.get(key, 1)}: spec field '{key}' has the wrong type "
                f"{type(value).__name__} (fix: use {'/'.join(t.__name__ for t in types)})"
            )
    return Spec(
        str(data.get("name") or path.stem), str(path), dict(data["values"]), lines, _min_tau(path, data)
    )


def _min_tau(path: Path, data: dict[str, Any]) -> float | dict[str, float] | None:
    """``min_tau``: greedy acceptance (tau, bonus token included) that a correctly configured
    deployment of this drafter reaches at least; a number, or one per mode."""
    value = data.get("min_tau")
    items = value.items() if isinstance(value, dict) else [("", value)]
    for mode, number in items:
        if value is not None and (
            isinstance(number, bool) or not isinstance(number, (int, float)) or number < 1
        ):
            raise LintInputError(
                f"{path}: min_tau{'.' + str(mode) if mode else ''} is {number!r} "
                "(fix: a number >= 1, or {mode: number})"
            )
    return value
