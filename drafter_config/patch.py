"""Apply a spec to a drafter config in place: minimal text edits, backup, atomic write, diff.

Why: users diff and review config.json, so a patch must touch only the values it fixes and keep
key order, indentation and line layout. Each wrong value is replaced at the span the JSON reader
recorded; a missing key is inserted at the end of its object in the object's own indentation.
Before anything is written the edited text is linted again, and a result that lint would reject
is refused, so ``patch`` can never turn a warning into a broken deployment. Writes go through the
Store (local disk or SFTP) with a timestamped backup beside the file. A ``config.json`` that is a
symlink (the Hugging Face cache layout links it to a blob) is patched where it points, so the link
stays a link and the file every reader sees is the one that changes; results name that file.
"""

from __future__ import annotations

import difflib
import json
import posixpath
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from drafter_config.drafter import DrafterConfig, same_value
from drafter_config.findings import LintReport
from drafter_config.lint import LintInputs, load_inputs, run_rules
from drafter_config.source import InvalidJson, LintInputError
from drafter_config.spec import Spec
from specops_files.jsonpos import JsonDocument, JsonPath, parse
from specops_files.store import Store


class PatchRefused(LintInputError):
    """The patched config would still fail lint; nothing was written."""

    def __init__(self, path: str, report: LintReport):
        codes = ", ".join(f"{f.code} {f.path or f.file}" for f in report.errors)
        super().__init__(
            f"{path}: refusing to patch, the result would still fail lint with "
            f"{len(report.errors)} error(s): {codes} (fix: correct those first; "
            "`specops config lint` shows each one with its hint)"
        )
        self.report = report


@dataclass(frozen=True)
class PatchResult:
    path: str
    target: str  # the file written: ``path``, or the file it links to
    changed: bool
    diff: str
    backup: str | None
    written: bool
    report: LintReport


@dataclass(frozen=True)
class _Edit:
    start: int
    end: int
    text: str


def _line_indent(text: str, offset: int) -> str:
    start = text.rfind("\n", 0, offset) + 1
    prefix = text[start:offset]
    return prefix if not prefix.strip() else prefix[: len(prefix) - len(prefix.lstrip())]


def _render(value: Any, old: str | None, indent: str, unit: str) -> str:
    """JSON for ``value`` in the layout of the text it replaces (inline stays inline)."""
    if not isinstance(value, (list, dict)) or not value:
        return json.dumps(value)
    multiline = "\n" in old if old is not None else isinstance(value, dict) or len(json.dumps(value)) > 80
    if not multiline:
        return json.dumps(value)
    body = json.dumps(value, indent=len(unit) or 2)
    return body.replace("\n", "\n" + indent)


def _indent_unit(text: str) -> str:
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and len(stripped) < len(line):
            return line[: len(line) - len(stripped)]
    return "  "


def _replace(doc: JsonDocument, path: JsonPath, value: Any, unit: str) -> _Edit:
    span = doc.spans[path]
    old = doc.text[span.start : span.end]
    indent = _line_indent(doc.text, span.key_start if span.key_start is not None else span.start)
    return _Edit(span.start, span.end, _render(value, old, indent, unit))


def _insert(doc: JsonDocument, path: JsonPath, value: Any, unit: str) -> _Edit:
    parent, key = path[:-1], str(path[-1])
    span = doc.spans[parent]
    members = [p for p in doc.spans if len(p) == len(path) and p[:-1] == parent]
    if members:
        last = max((doc.spans[p] for p in members), key=lambda s: s.end)
        first = min((doc.spans[p] for p in members), key=lambda s: s.start)
        key_indent = _line_indent(doc.text, first.key_start or first.start)
        newline = "\n" if "\n" in doc.text[span.start : first.key_start or first.start] else " "
        sep = f",{newline}{key_indent if newline == chr(10) else ''}"
        return _Edit(last.end, last.end, f"{sep}{json.dumps(key)}: {_render(value, None, key_indent, unit)}")
    outer = _line_indent(doc.text, span.start)
    inner = outer + unit
    return _Edit(
        span.start + 1,
        span.end - 1,
        f"\n{inner}{json.dumps(key)}: {_render(value, None, inner, unit)}\n{outer}",
    )


def plan_edits(drafter: DrafterConfig, spec: Spec) -> list[_Edit]:
    """The text edits that make every spec field hold the spec's value."""
    doc, unit = drafter.doc, _indent_unit(drafter.doc.text)
    edits = []
    for name, want in spec.values.items():
        names = ("dtype", "torch_dtype") if name == "dtype" else (name,)
        paths = [p for n in names for p in drafter.locations(n)]
        if not paths:
            if want is not None:
                edits.append(_insert(doc, drafter.insert_path(name), want, unit))
            continue
        edits += [_replace(doc, p, want, unit) for p in paths if not same_value(doc.get(p), want)]
    return edits


def apply_edits(text: str, edits: list[_Edit]) -> str:
    for edit in sorted(enumerate(edits), key=lambda e: (e[1].start, e[0]), reverse=True):
        text = text[: edit[1].start] + edit[1].text + text[edit[1].end :]
    return text


def backup_path(store: Store, path: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    candidate, n = f"{path}.bak-{stamp}", 1
    while store.stat(candidate) is not None:
        n += 1
        candidate = f"{path}.bak-{stamp}-{n}"
    return candidate


@dataclass(frozen=True)
class PatchPlan:
    """The checked edit of one config: old and new text, their diff, and the re-lint of the new text."""

    path: str
    target: str  # the file to write: ``path``, or the file it links to
    old: str
    new: str
    diff: str
    report: LintReport

    @property
    def changed(self) -> bool:
        return self.new != self.old


def plan_patch(inputs: LintInputs, spec: Spec) -> PatchPlan:
    """Edit the config text to match ``spec`` and re-lint it; PatchRefused if lint still rejects it."""
    drafter = inputs.drafter
    old = drafter.doc.text
    new = apply_edits(old, plan_edits(drafter, spec))
    report = run_rules(inputs, spec, drafter=DrafterConfig(drafter.file, parse(new)))
    if report.errors:
        raise PatchRefused(drafter.file, report)
    diff = "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=drafter.file,
            tofile=f"{drafter.file} (spec {spec.name})",
        )
    )
    return PatchPlan(drafter.file, link_target(inputs.store, drafter.file), old, new, diff, report)


def link_target(store: Store, path: str) -> str:
    """The file a write to ``path`` must replace: ``path`` itself, or where it links to."""
    resolved = store.realpath(path)
    folder = store.realpath(posixpath.dirname(path) or ".")
    return path if resolved == posixpath.join(folder, posixpath.basename(path)) else resolved


def write_patch(store: Store, plan: PatchPlan) -> str:
    """Back the old text up beside ``path``, then replace the target atomically; returns the backup path."""
    backup = backup_path(store, plan.path)
    store.write_bytes(backup, plan.old.encode("utf-8"))
    store.write_bytes(plan.target, plan.new.encode("utf-8"))
    return backup


def patch(
    store: Store, drafter_path: str, spec: Spec, *, target_path: str | None = None, check: bool = False
) -> PatchResult:
    """Patch the drafter at ``drafter_path`` (file or directory) to match ``spec``."""
    try:
        inputs = load_inputs(store, drafter_path, target_path)
    except InvalidJson as exc:
        raise LintInputError(f"{exc}: cannot patch a file that is not JSON (fix the syntax first)") from None
    plan = plan_patch(inputs, spec)
    if not plan.changed or check:
        return PatchResult(plan.path, plan.target, plan.changed, plan.diff, None, False, plan.report)
    return PatchResult(plan.path, plan.target, True, plan.diff, write_patch(store, plan), True, plan.report)
