"""File steps: ``directory``, ``file_copy``, ``template`` and ``line_in_file``.

All four share one fact, :func:`path_info` (type, mode, owner, size and sha256 in one round trip),
so a satisfied step costs a single command. File contents are read only when the checksum says
they differ, to show a unified diff.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

from ops.api.args import Arg, arguments, mode_arg
from ops.api.changes import Fact, Plan, Run, StepFailed, Write, unified_diff
from ops.api.context import StepContext
from ops.api.templates import render_template
from ops.shell import quote
from ops.steps.base import Step, register

if TYPE_CHECKING:
    from ops.connection import CommandResult, Connection

# Largest file whose old content is fetched to show a diff; bigger ones get a checksum note.
DIFF_LIMIT = 256 * 1024

_TYPES = {
    "regular file": "file",
    "regular empty file": "file",
    "directory": "directory",
    "symbolic link": "link",
}


def path_info(path: str) -> Fact[dict[str, Any]]:
    """Type, mode, owner, group, size and (regular files) sha256 of ``path``, without following links."""
    p = quote(path)
    command = (
        f"if [ -e {p} ] || [ -L {p} ]; then stat -c '%F|%a|%U|%G|%s' -- {p} && "
        f"if [ -f {p} ] && [ ! -L {p} ]; then sha256sum -- {p}; fi; else echo missing; fi"
    )
    return Fact(command, lambda result: parse_path_info(path, result))


def parse_path_info(path: str, result: CommandResult) -> dict[str, Any]:
    """Pure parser of :func:`path_info`'s output (``missing`` or ``stat`` line + ``sha256sum`` line)."""
    lines = result.stdout.splitlines()
    if not result.ok or not lines:
        raise StepFailed(f"cannot inspect {path}", command=result.command, stderr=result.stderr)
    if lines[0].strip() == "missing":
        return {"exists": False}
    kind, mode, owner, group, size = lines[0].rsplit("|", 4)
    info: dict[str, Any] = {
        "exists": True,
        "type": _TYPES.get(kind, kind),
        "mode": f"{int(mode, 8):04o}",
        "owner": owner,
        "group": group,
        "size": int(size),
    }
    if len(lines) > 1:
        info["sha256"] = lines[1].split()[0]
    return info


def owner_matches(wanted: str | None, info: dict[str, Any]) -> bool:
    """``wanted`` is ``user`` or ``user:group``; None means "do not manage ownership"."""
    if wanted is None:
        return True
    user, _, group = wanted.partition(":")
    return info.get("owner") == user and (not group or info.get("group") == group)


def _attribute_changes(
    path: str, mode: str | None, owner: str | None, info: dict[str, Any], ctx: StepContext
) -> list[Run]:
    """chmod / chown commands for an existing path whose mode or owner differ."""
    changes = []
    if mode is not None and info.get("mode") != mode:
        changes.append(Run(f"chmod {mode} -- {quote(path)}", why=f"mode {info.get('mode')} -> {mode}"))
    if not owner_matches(owner, info):
        changes.append(
            Run(
                f"chown {quote(owner)} -- {quote(path)}",
                sudo=ctx.host.sudo,
                why=f"owner {info.get('owner')}:{info.get('group')} -> {owner}",
            )
        )
    return changes


def _describe(info: dict[str, Any]) -> str:
    return f"mode {info.get('mode')}, owner {info.get('owner')}"


def probe_file(conn: Connection, path: str, wanted: bytes | None) -> dict[str, Any]:
    """path_info, plus the old text when it differs from ``wanted`` (for the diff)."""
    info = path_info(path).gather(conn)
    if (
        info.get("type") == "file"
        and info.get("size", 0) <= DIFF_LIMIT
        and (wanted is None or info.get("sha256") != hashlib.sha256(wanted).hexdigest())
    ):
        old = conn.read_bytes(path)
        try:
            info["content"] = old.decode("utf-8")
        except UnicodeDecodeError:
            info["content"] = None
    return info


def plan_file(
    path: str, data: bytes, mode: str | None, owner: str | None, info: dict[str, Any], ctx: StepContext
) -> Plan:
    """Shared by file_copy, template and line_in_file: write when the checksum differs."""
    sha = hashlib.sha256(data).hexdigest()
    if info.get("exists") and info.get("type") != "file":
        raise StepFailed(f"{path} exists and is a {info.get('type')}, not a regular file: remove it first")
    if not info.get("exists") or info.get("sha256") != sha:
        old = info.get("content")
        if info.get("exists") and old is None:
            diff = f"{path}: content differs (sha256 {info.get('sha256', '?')[:12]} -> {sha[:12]})\n"
        else:
            diff = unified_diff(path, None if old is None else old.encode("utf-8"), data)
        changes: list[Run | Write] = [
            Write(
                path,
                data,
                mode or info.get("mode") or "0644",
                diff,
                why="create" if not info.get("exists") else "content differs",
            )
        ]
        if owner is not None:
            changes.append(Run(f"chown {quote(owner)} -- {quote(path)}", sudo=ctx.host.sudo, why="owner"))
        verb = "create" if not info.get("exists") else "update"
        return Plan.of(changes, f"{verb} {path} (sha256 {sha[:12]})", sha256=sha)
    changes = _attribute_changes(path, mode, owner, info, ctx)
    if changes:
        return Plan.of(changes, "; ".join(c.why for c in changes), sha256=sha)
    return Plan.noop(f"{path} is up to date (sha256 {sha[:12]}, {_describe(info)})", sha256=sha)


@register
class Directory(Step):
    name = "directory"
    summary = "a directory with an optional mode and owner"
    args = arguments(
        path=Arg(str, required=True, help="directory on the host; parents are created"),
        mode=Arg(mode_arg, help="octal mode such as '0755'; unmanaged when absent"),
        owner=Arg(str, help="user or user:group; unmanaged when absent"),
    )

    def probe(self, conn, args, ctx):
        return path_info(args["path"]).gather(conn)

    def plan(self, facts, args, ctx):
        path, mode, owner = args["path"], args["mode"], args["owner"]
        if not facts.get("exists"):
            flag = f"-m {mode} " if mode else ""
            changes = [Run(f"mkdir -p {flag}-- {quote(path)}", why="missing")]
            if owner is not None:
                changes.append(Run(f"chown {quote(owner)} -- {quote(path)}", sudo=ctx.host.sudo, why="owner"))
            return Plan.of(changes, f"create directory {path}" + (f" with mode {mode}" if mode else ""))
        if facts.get("type") != "directory":
            raise StepFailed(f"{path} exists and is a {facts.get('type')}, not a directory: remove it first")
        changes = _attribute_changes(path, mode, owner, facts, ctx)
        if changes:
            return Plan.of(changes, "; ".join(c.why for c in changes))
        return Plan.noop(f"directory exists with {_describe(facts)}")


@register
class FileCopy(Step):
    name = "file_copy"
    summary = "copy a controller file to the host, compared by sha256"
    args = arguments(
        src=Arg(str, required=True, help="controller path: absolute, beside the playbook, or in templates/"),
        dest=Arg(str, required=True, help="file path on the host"),
        mode=Arg(mode_arg, help="octal mode; new files default to 0644, existing keep theirs"),
        owner=Arg(str, help="user or user:group; unmanaged when absent"),
    )

    def probe(self, conn, args, ctx):
        return probe_file(conn, args["dest"], ctx.find_source(args["src"]).read_bytes())

    def plan(self, facts, args, ctx):
        data = ctx.find_source(args["src"]).read_bytes()
        return plan_file(args["dest"], data, args["mode"], args["owner"], facts, ctx)


@register
class Template(Step):
    name = "template"
    summary = "render a Jinja2 template onto the host, with a unified diff"
    args = arguments(
        src=Arg(str, required=True, help="template beside the playbook or in templates/"),
        dest=Arg(str, required=True, help="file path on the host"),
        mode=Arg(mode_arg, help="octal mode; new files default to 0644, existing keep theirs"),
        owner=Arg(str, help="user or user:group; unmanaged when absent"),
        vars=Arg(dict, help="extra variables for this template only"),
    )

    def probe(self, conn, args, ctx):
        return probe_file(conn, args["dest"], render_template(args["src"], args["vars"], ctx))

    def plan(self, facts, args, ctx):
        data = render_template(args["src"], args["vars"], ctx)
        return plan_file(args["dest"], data, args["mode"], args["owner"], facts, ctx)


def ensure_line(text: str, line: str, regexp: str | None) -> str:
    """Pure: ``text`` with ``line`` present; it replaces the last line matching ``regexp``."""
    lines = text.splitlines()
    if regexp is not None:
        pattern = re.compile(regexp)
        matches = [i for i, old in enumerate(lines) if pattern.search(old)]
        if matches:
            lines[matches[-1]] = line
            return "\n".join(lines) + "\n"
    if line in lines:
        return text
    return "\n".join([*lines, line]) + "\n"


def _regexp(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a regular expression string, got {value!r}")
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"bad regular expression {value!r}: {exc}") from None
    return value


@register
class LineInFile(Step):
    name = "line_in_file"
    summary = "one line present in a text file, replacing the line matching regexp"
    args = arguments(
        path=Arg(str, required=True, help="text file on the host; created when missing"),
        line=Arg(str, required=True, help="the whole line wanted"),
        regexp=Arg(_regexp, help="the last line matching it is replaced by line"),
    )

    def probe(self, conn, args, ctx):
        info = path_info(args["path"]).gather(conn)
        if info.get("type") == "file":
            info["content"] = conn.read_bytes(args["path"]).decode("utf-8", errors="replace")
        return info

    def plan(self, facts, args, ctx):
        old = facts.get("content") or ""
        new = ensure_line(old, args["line"], args["regexp"])
        if facts.get("exists") and new == old:
            return Plan.noop(f"line already present in {args['path']}")
        return plan_file(args["path"], new.encode("utf-8"), None, None, facts, ctx)
