"""Finding and reading a checkpoint's config.json through a Store.

Why: users name either a ``config.json`` or a checkpoint directory, locally or on a host; both
resolve here to one directory (for weights and tokenizer files) and one parsed, position-aware
config document. Unreadable input is a usage problem (exit 2), not a lint finding.
"""

from __future__ import annotations

from dataclasses import dataclass

from drafter_config.jsonpos import JsonDocument, JsonSyntaxError, parse
from drafter_config.store import Store, join
from specops_contract import SpecopsError

MAX_JSON_BYTES = 64 * 1024 * 1024


class LintInputError(SpecopsError):
    """An input that cannot be read at all (missing path, not a checkpoint, too large)."""


class InvalidJson(Exception):
    """A file that exists but is not JSON; the orchestrator turns it into DFL001."""

    def __init__(self, path: str, error: JsonSyntaxError):
        super().__init__(f"{path}:{error.line}:{error.col}: {error.reason}")
        self.path = path
        self.error = error


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory (None for a bare config file) and its config.json path."""

    directory: str | None
    config_path: str


def locate_checkpoint(store: Store, path: str, role: str) -> Checkpoint:
    """Resolve DRAFTER/TARGET: a directory holding config.json, or a config.json file itself."""
    info = store.stat(path)
    if info is None:
        raise LintInputError(f"{role} {path}: no such file or directory (fix: pass a checkpoint "
                             "directory or its config.json)")
    if not info.is_dir:
        return Checkpoint(None, path)
    config = join(path, "config.json")
    if store.stat(config) is None:
        raise LintInputError(f"{role} {path}: directory has no config.json (fix: point at the "
                             "checkpoint directory that holds config.json)")
    return Checkpoint(path, config)


def read_text(store: Store, path: str, limit: int = MAX_JSON_BYTES) -> str:
    """Read a UTF-8 text file, refusing files larger than ``limit`` bytes."""
    info = store.stat(path)
    if info is None:
        raise LintInputError(f"{path}: no such file")
    if info.size > limit:
        raise LintInputError(f"{path}: {info.size} bytes is too large for a JSON config "
                             f"(limit {limit}; fix: point at the real config file)")
    raw = store.read_bytes(path)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LintInputError(f"{path}: not UTF-8 text at byte {exc.start} (fix: save it as UTF-8)") from None


def read_json(store: Store, path: str, limit: int = MAX_JSON_BYTES) -> JsonDocument:
    """Read and parse a JSON file with positions; InvalidJson carries the line and column."""
    text = read_text(store, path, limit)
    try:
        return parse(text)
    except JsonSyntaxError as exc:
        raise InvalidJson(path, exc) from None
