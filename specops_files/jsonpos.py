"""A JSON reader that remembers where every key and value sits in the text.

Why: lint findings must point at ``file:line:col`` like a compiler, and ``patch`` must edit a value
in place (keeping the user's key order, indentation and comments-free formatting) instead of
re-dumping the whole file. The standard ``json`` module gives neither, so this small recursive
descent parser reuses json's own string and number scanners and records spans on the way.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from dataclasses import dataclass, field
from typing import Any

JsonPath = tuple[str | int, ...]

_WHITESPACE = " \t\n\r"
MAX_DEPTH = 100  # real configs nest < 10 deep; a hostile file must not reach the recursion limit
_LITERALS = {"true": True, "false": False, "null": None}


class JsonSyntaxError(ValueError):
    """Invalid JSON, with the 1-based line and column of the first offending character."""

    def __init__(self, message: str, line: int, col: int):
        super().__init__(f"{message} at line {line} column {col}")
        self.reason = message
        self.line = line
        self.col = col


@dataclass(frozen=True)
class Span:
    """Where one value sits: [start, end) offsets into the text, and its key's offset if any."""

    start: int
    end: int
    key_start: int | None = None


@dataclass
class JsonDocument:
    """Parsed JSON text plus the span of every value, addressed by its JSON path."""

    text: str
    data: Any
    spans: dict[JsonPath, Span] = field(default_factory=dict)

    def position(self, offset: int) -> tuple[int, int]:
        """1-based (line, col) of a character offset."""
        line = self.text.count("\n", 0, offset) + 1
        col = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return line, col

    def locate(self, path: JsonPath) -> tuple[int, int]:
        """Position of the value at ``path``, or of the nearest existing ancestor when it is absent."""
        for cut in range(len(path), -1, -1):
            span = self.spans.get(path[:cut])
            if span is not None:
                return self.position(span.start)
        return 1, 1

    def get(self, path: JsonPath, default: Any = None) -> Any:
        """The value at ``path`` or ``default`` when any step is missing."""
        node = self.data
        for step in path:
            in_list = isinstance(step, int) and isinstance(node, list) and 0 <= step < len(node)
            if in_list or (isinstance(step, str) and isinstance(node, dict) and step in node):
                node = node[step]
            else:
                return default
        return node


def format_path(path: JsonPath) -> str:
    """``("dflash_config", "target_layer_ids", 2)`` -> ``dflash_config.target_layer_ids[2]``."""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out or "$"


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.spans: dict[JsonPath, Span] = {}
        self._number = json.scanner.NUMBER_RE

    def fail(self, message: str, offset: int) -> JsonSyntaxError:
        line = self.text.count("\n", 0, offset) + 1
        col = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return JsonSyntaxError(message, line, col)

    def skip(self, i: int) -> int:
        while i < len(self.text) and self.text[i] in _WHITESPACE:
            i += 1
        return i

    def value(self, i: int, path: JsonPath, key_start: int | None) -> tuple[Any, int]:
        i = self.skip(i)
        if i >= len(self.text):
            raise self.fail("Expecting value", i)
        start = i
        char = self.text[i]
        if char in "{[" and len(path) >= MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels", i)
        if char == "{":
            result, i = self.object(i, path)
        elif char == "[":
            result, i = self.array(i, path)
        elif char == '"':
            result, i = self.string(i)
        else:
            for word, literal in _LITERALS.items():
                if self.text.startswith(word, i):
                    result, i = literal, i + len(word)
                    break
            else:
                match = self._number.match(self.text, i)
                if match is None:
                    raise self.fail("Expecting value", i)
                integer, frac, exp = match.groups()
                result = float(integer + (frac or "") + (exp or "")) if frac or exp else int(integer)
                i = match.end()
        self.spans[path] = Span(start, i, key_start)
        return result, i

    def string(self, i: int) -> tuple[str, int]:
        try:
            return json.decoder.scanstring(self.text, i + 1, True)
        except json.JSONDecodeError as exc:
            raise self.fail(exc.msg, exc.pos) from None

    def object(self, i: int, path: JsonPath) -> tuple[dict[str, Any], int]:
        result: dict[str, Any] = {}
        i = self.skip(i + 1)
        if self.text.startswith("}", i):
            return result, i + 1
        while True:
            if not self.text.startswith('"', i):
                raise self.fail("Expecting property name enclosed in double quotes", i)
            key_start = i
            key, i = self.string(i)
            i = self.skip(i)
            if not self.text.startswith(":", i):
                raise self.fail("Expecting ':' delimiter", i)
            result[key], i = self.value(i + 1, (*path, key), key_start)
            i = self.skip(i)
            if self.text.startswith("}", i):
                return result, i + 1
            if not self.text.startswith(",", i):
                raise self.fail("Expecting ',' delimiter", i)
            i = self.skip(i + 1)

    def array(self, i: int, path: JsonPath) -> tuple[list[Any], int]:
        result: list[Any] = []
        i = self.skip(i + 1)
        if self.text.startswith("]", i):
            return result, i + 1
        while True:
            item, i = self.value(i, (*path, len(result)), None)
            result.append(item)
            i = self.skip(i)
            if self.text.startswith("]", i):
                return result, i + 1
            if not self.text.startswith(",", i):
                raise self.fail("Expecting ',' delimiter", i)
            i += 1


def parse(text: str) -> JsonDocument:
    """Parse ``text``; raise JsonSyntaxError with line and column on invalid JSON."""
    parser = _Parser(text)
    data, end = parser.value(0, (), None)
    end = parser.skip(end)
    if end != len(text):
        raise parser.fail("Extra data", end)
    return JsonDocument(text=text, data=data, spans=parser.spans)
