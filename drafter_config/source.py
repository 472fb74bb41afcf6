"""Finding and reading a checkpoint's config.json through a Store.

Why: users name either a ``config.json`` or a checkpoint directory, locally or on a host; both
resolve here to one directory (for weights and tokenizer files) and one parsed, position-aware
config document. Unreadable input is a usage problem (exit 2), not a lint finding.

Checkpoints come from the internet, so every read here is typed and bounded: only regular files
(after following links) are opened, never more than a hard cap of bytes, and JSON nested too
deeply to parse safely is an error with a position, not a RecursionError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specops_contract import SpecopsError
from specops_files.jsonpos import JsonDocument, JsonSyntaxError, parse
from specops_files.store import Store, join

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
        raise LintInputError(
            f"{role} {path}: no such file or directory (fix: pass a checkpoint directory or its config.json)"
        )
    if not info.is_dir:
        return Checkpoint(None, path)
    config = join(path, "config.json")
    if store.stat(config) is None:
        raise LintInputError(
            f"{role} {path}: directory has no config.json (fix: point at the "
            "checkpoint directory that holds config.json)"
        )
    return Checkpoint(path, config)


def read_file(store: Store, path: str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; anything else is LintInputError."""
    info = store.stat(path)
    if info is None:
        raise LintInputError(f"{path}: no such file")
    if not info.is_file:
        raise LintInputError(
            f"{path}: not a regular file (a device, FIFO or directory, or a link to one); "
            "not read (fix: point at the real file)"
        )
    if info.size > limit:
        raise LintInputError(
            f"{path}: {info.size} bytes is too large (limit {limit}; fix: point at the real file)"
        )
    raw = store.read_bytes(path, 0, limit + 1)
    if len(raw) > limit:
        raise LintInputError(f"{path}: grew past {limit} bytes while read (fix: point at the real file)")
    return raw


def read_text(store: Store, path: str, limit: int = MAX_JSON_BYTES) -> str:
    """Read a UTF-8 text file (a regular file of at most ``limit`` bytes)."""
    raw = read_file(store, path, limit)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LintInputError(f"{path}: not UTF-8 text at byte {exc.start} (fix: save it as UTF-8)") from None


def loads(text: str | bytes) -> Any:
    """``json.loads`` whose failures, over-deep nesting included, are all ValueError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None


def read_json(store: Store, path: str, limit: int = MAX_JSON_BYTES) -> JsonDocument:
    """Read and parse a JSON file with positions; InvalidJson carries the line and column."""
    text = read_text(store, path, limit)
    try:
        return parse(text)
    except JsonSyntaxError as exc:
        raise InvalidJson(path, exc) from None
