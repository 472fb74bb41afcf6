"""A view of a DFlash drafter config that knows where each field lives.

Why: z-lab configs keep ``mask_token_id`` and ``target_layer_ids`` under ``dflash_config`` while
older exports put them at the top level; the reference loader prefers ``dflash_config`` and falls
back to the top level. Rules ask for a field by name and get its value and JSON path, and patch
asks where to write it, so both follow the loader's precedence in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specops_files.jsonpos import JsonDocument, JsonPath

DFLASH_FIELDS = ("mask_token_id", "target_layer_ids")
ARCHITECTURE = "DFlashDraftModel"


@dataclass(frozen=True)
class Field:
    """A field's effective value (None when absent or null) and the path it was read from."""

    name: str
    value: Any
    path: JsonPath
    present: bool


def is_int(value: Any) -> bool:
    """JSON integers only: ``true`` is not a layer id."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class DrafterConfig:
    file: str
    doc: JsonDocument

    @property
    def data(self) -> dict[str, Any]:
        return self.doc.data if isinstance(self.doc.data, dict) else {}

    def _dflash_config(self) -> dict[str, Any] | None:
        section = self.data.get("dflash_config")
        return section if isinstance(section, dict) else None

    def locations(self, name: str) -> list[JsonPath]:
        """Every path where ``name`` is set, in the loader's order of precedence."""
        paths: list[JsonPath] = []
        section = self._dflash_config()
        if name in DFLASH_FIELDS and section is not None and name in section:
            paths.append(("dflash_config", name))
        if name in self.data:
            paths.append((name,))
        return paths

    def insert_path(self, name: str) -> JsonPath:
        """Where a missing field should be written: dflash_config for its fields when it exists."""
        if name in DFLASH_FIELDS and self._dflash_config() is not None:
            return ("dflash_config", name)
        return (name,)

    def field(self, name: str) -> Field:
        for path in self.locations(name):
            value = self.doc.get(path)
            if value is not None:
                return Field(name, value, path, True)
        return Field(name, None, self.insert_path(name), False)

    def value(self, name: str) -> Any:
        return self.field(name).value

    def int_value(self, name: str) -> int | None:
        value = self.value(name)
        return value if is_int(value) else None

    @property
    def dtype(self) -> Field:
        """transformers 5 writes ``dtype``, 4.x ``torch_dtype``."""
        found = self.field("dtype")
        return found if found.present else self.field("torch_dtype")

    def head_dim(self) -> int | None:
        head_dim = self.int_value("head_dim")
        hidden, heads = self.int_value("hidden_size"), self.int_value("num_attention_heads")
        if head_dim is None and hidden and heads:
            return hidden // heads
        return head_dim


def same_value(a: Any, b: Any) -> bool:
    """JSON equality where 1e-06 == 0.000001 and 1000000 == 1e6, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b
