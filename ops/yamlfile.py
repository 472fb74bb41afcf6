"""YAML input files (inventory, playbooks, matrices) read with the line of every key and item.

Why: every user-facing input error must name ``file:line``, and PyYAML silently keeps the last of
two duplicate keys. One loader serves every YAML input so they report problems the same way.
Mappings load as :class:`LineMap` (``.line``, ``.key_lines``), lists as :class:`LineSeq`
(``.line``, ``.item_lines``) and ints as :class:`YamlInt`, which keeps its source text so that
``mode: 755`` can mean 0o755 as it does for chmod. Use :func:`plain` to drop these types.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ops.errors import InputFileError


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
                raise InputFileError(self.source, line, f"a mapping key must be a plain value, got {key!r}") from None
            if first is not None:
                raise InputFileError(self.source, line, f"duplicate key '{key}' (first defined at line {first})",
                                     "remove or rename one of them")
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


_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_line_map)
_Loader.add_constructor("tag:yaml.org,2002:seq", _Loader.construct_line_seq)
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int_with_text)


def load_yaml(text: str, source: str | Path) -> Any:
    """Parse one YAML document; every syntax problem is an InputFileError naming source:line."""
    loader = _Loader(text)
    loader.source = str(source)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise InputFileError(source, line, f"invalid YAML: {exc.problem or exc.context}",
                             "check indentation and quoting") from None
    except yaml.YAMLError as exc:
        raise InputFileError(source, None, f"invalid YAML: {exc}") from None
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
