"""YAML input files (inventory, playbooks, matrices) read with the line of every key and item.

Why: every user-facing input error must name ``file:line``, and PyYAML silently keeps the last of
two duplicate keys. One loader serves every YAML input so they report problems the same way.
Mappings load as :class:`LineMap` (``.line``, ``.key_lines``), lists as :class:`LineSeq`
(``.line``, ``.item_lines``) and ints as :class:`YamlInt`, which keeps its source text so that
``mode: 755`` can mean 0o755 as it does for chmod. Use :func:`plain` to drop these types.

Hostile input is bounded: ``[`` and ``{`` nest at most ``MAX_FLOW_DEPTH`` deep, and a document
whose aliases expand to more than ``MAX_VALUES`` values (a "billion laughs" bomb of nested
``*refs``) is refused at the alias that crosses the limit, before anything walks the expanded tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ops.errors import InputFileError

MAX_VALUES = 100_000  # values in the document with every alias expanded; real files hold < 5,000
MAX_FLOW_DEPTH = 64  # nested [ and { (PyYAML's scanner slows quadratically with the depth)


class LineMap(dict):
    """A YAML mapping that remembers its own line and each key's line (1-based)."""

    line = 0
    key_lines: dict[Any, int]


class LineSeq(list):
    """A YAML sequence that remembers its own line and each item's line (1-based)."""

    line = 0
    item_lines: list[int]


class YamlInt(int):
    """An int that remembers how it was written."""

    raw = ""


class _Loader(yaml.SafeLoader):
    """SafeLoader that records line numbers and refuses duplicate keys."""

    source = "<yaml>"
    expanded = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        """Count every value the constructed data will hold, aliases expanded, and stop a bomb early."""
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            self.expanded += _size(target, {}) if target is not None else 0
            if self.expanded > MAX_VALUES:
                raise InputFileError(
                    self.source,
                    event.start_mark.line + 1,
                    f"YAML aliases expand to more than {MAX_VALUES:,} values at '*{event.anchor}'",
                    "an alias bomb? Use fewer nested aliases or write the values out",
                )
        else:
            self.expanded += 1
        return super().compose_node(parent, index)

    def fetch_flow_collection_start(self, token_class: type) -> None:
        if self.flow_level >= MAX_FLOW_DEPTH:
            raise InputFileError(
                self.source,
                self.get_mark().line + 1,
                f"[ and {{ nested deeper than {MAX_FLOW_DEPTH} levels",
                "a real inventory or playbook nests a few levels, not hundreds",
            )
        super().fetch_flow_collection_start(token_class)

    def construct_line_map(self, node: yaml.MappingNode):
        data = LineMap()
        data.line = node.start_mark.line + 1
        data.key_lines = {}
        yield data
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = data.key_lines.get(key)
            except TypeError:
                raise InputFileError(
                    self.source, line, f"a mapping key must be a plain value, got {key!r}"
                ) from None
            if first is not None:
                raise InputFileError(
                    self.source,
                    line,
                    f"duplicate key '{key}' (first defined at line {first})",
                    "remove or rename one of them",
                )
            data.key_lines[key] = line
        data.update(self.construct_mapping(node, deep=True))
        for key in data:  # keys that came in through a YAML merge (<<: *anchor) point at the mapping
            data.key_lines.setdefault(key, data.line)

    def construct_line_seq(self, node: yaml.SequenceNode):
        data = LineSeq()
        data.line = node.start_mark.line + 1
        data.item_lines = [item.start_mark.line + 1 for item in node.value]
        yield data
        data.extend(self.construct_sequence(node, deep=True))

    def construct_yaml_int_with_text(self, node: yaml.ScalarNode) -> YamlInt:
        value = YamlInt(self.construct_yaml_int(node))
        value.raw = node.value
        return value


def _size(node: yaml.Node, seen: dict[int, int]) -> int:
    """Values under `node` with aliases expanded (a node that contains itself counts once)."""
    if id(node) in seen:
        return seen[id(node)]
    seen[id(node)] = 1
    if isinstance(node, yaml.SequenceNode):
        seen[id(node)] = 1 + sum(_size(child, seen) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        seen[id(node)] = 1 + sum(_size(k, seen) + _size(v, seen) for k, v in node.value)
    return seen[id(node)]


_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_line_map)
_Loader.add_constructor("tag:yaml.org,2002:seq", _Loader.construct_line_seq)
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int_with_text)


def read_source(path: Path, what: str, hint: str) -> str:
    """The UTF-8 text of a user's file; an unreadable or non-UTF-8 file is an InputFileError."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputFileError(path, None, f"cannot read {what}: {exc.strerror}", hint) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputFileError(
            path,
            line,
            f"{what} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})",
            "save the file as UTF-8",
        ) from None


def load_yaml(text: str, source: str | Path) -> Any:
    """Parse one YAML document; every syntax problem is an InputFileError naming source:line."""
    loader = _Loader(text)
    loader.source = str(source)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise InputFileError(
            source, line, f"invalid YAML: {exc.problem or exc.context}", "check indentation and quoting"
        ) from None
    except yaml.YAMLError as exc:
        raise InputFileError(source, None, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise InputFileError(
            source,
            None,
            "invalid YAML: nested too deeply to read",
            "a real inventory or playbook nests a few levels, not hundreds",
        ) from None
    finally:
        loader.dispose()


def line_of(node: Any, key: Any, default: int = 0) -> int:
    """The line of ``key`` in a loaded mapping, else the mapping's own line, else ``default``."""
    return getattr(node, "key_lines", {}).get(key, getattr(node, "line", default))


def plain(value: Any) -> Any:
    """Drop the line-tracking types so callers keep ordinary dicts, lists and ints."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, YamlInt):
        return int(value)
    return value
