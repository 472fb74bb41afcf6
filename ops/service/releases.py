"""Which releases a host has, and the atomic switch of ``current``/``previous``.

A release is ``<base>/releases/<id>/`` with a ``COMPLETE`` marker (``ops/steps/release.py``
assembles it); ``<base>/current`` and ``<base>/previous`` are symlinks to ``releases/<id>``,
switched by renaming a new link over the old one, so a cut link never leaves a dangling one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ops.api.changes import Fact, Run, StepFailed
from ops.layout import HostLayout
from ops.shell import join, quote

if TYPE_CHECKING:
    from ops.connection import CommandResult

COMPLETE = "COMPLETE"


def layout_fact(base: str) -> Fact[dict[str, Any]]:
    """Complete releases (id -> mtime), and where ``current`` and ``previous`` point."""
    command = (
        f"b={quote(base)}; "
        'echo "current=$(readlink "$b/current" 2>/dev/null)"; '
        'echo "previous=$(readlink "$b/previous" 2>/dev/null)"; '
        'for d in "$b"/releases/*/; do '
        f'if [ -f "${{d}}{COMPLETE}" ]; then echo "release=$(stat -c %Y "$d") $(basename "$d")"; fi; '
        "done; true"
    )
    return Fact(command, parse_layout)


def parse_layout(result: CommandResult) -> dict[str, Any]:
    """Pure parser of :func:`layout_fact`; a link's target ``releases/<id>`` becomes ``<id>``."""
    if not result.ok:
        raise StepFailed("cannot read the release layout", command=result.command, stderr=result.stderr)
    layout: dict[str, Any] = {"current": None, "previous": None, "releases": {}}
    for line in result.stdout.splitlines():
        key, _, value = line.partition("=")
        if key in ("current", "previous"):
            layout[key] = value.strip().rstrip("/").rsplit("/", 1)[-1] or None
        elif key == "release":
            mtime, _, name = value.partition(" ")
            layout["releases"][name] = int(mtime)
    return layout


def link_command(base: str, name: str, release: str | None) -> str:
    """Point ``<base>/<name>`` at ``releases/<release>`` atomically (None removes the link)."""
    link = HostLayout(base).link(name)
    if release is None:
        return join(["rm", "-f", "--", link])
    tmp = f"{base}/.{name}.tmp"
    return f"ln -sfn {quote('releases/' + release)} {quote(tmp)} && mv -T {quote(tmp)} {quote(link)}"


def switch_commands(base: str, release: str, previous: str | None) -> list[Run]:
    """``previous`` first: cut in between, both links still name complete releases."""
    return [
        Run(link_command(base, "previous", previous), why=f"previous -> {previous or 'none'}"),
        Run(link_command(base, "current", release), why=f"current -> {release}"),
    ]
