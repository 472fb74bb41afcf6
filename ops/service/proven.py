"""The settings each proven start used, per release: its service arguments (kept in the state file)
and a copy of the env file it read (``<base>/run/<service>.proven/<release>.env``, mode 0600).

A deploy renders the env file before the service step. When the new settings do not answer, the
automatic rollback must restart the old server with the env file it answered with, not the one
that just failed (a ``serve_env`` value the server refuses would otherwise fail the rollback too and
leave nothing running); ``fab rollback`` likewise goes back to the previous release with the
settings it last answered with, which it is known to understand.
"""

from __future__ import annotations

from typing import Any

from ops.api.changes import Run
from ops.layout import HostLayout
from ops.shell import quote


def proven_settings(svc: dict[str, Any], release: str) -> dict[str, Any] | None:
    """What ``release`` last answered with: ``args``, ``env_sha`` (that env file's, or None when no
    copy of it is kept) and ``restore`` (the env file differs from it now); None if never proven."""
    state = svc.get("state") or {}
    record = (state.get("proven") or {}).get(release)
    if record is None and state.get("release") == release and state.get("args"):
        record = {"args": state["args"], "env_sha": None}  # a state file older than these records
    if record is None:
        return None
    kept = (
        record.get("env_sha") is not None and (svc.get("proven_env") or {}).get(release) == record["env_sha"]
    )
    env_sha = record["env_sha"] if kept else svc["env_sha"]
    return {"args": record["args"], "env_sha": env_sha, "restore": kept and env_sha != svc["env_sha"]}


def proven_records(
    state: dict[str, Any] | None,
    releases: dict[str, Any],
    release: str,
    args: dict[str, Any],
    env_sha: str | None,
) -> dict[str, Any]:
    """The state file's ``proven`` map once ``release`` answered with ``args`` and that env file:
    every release still on the host keeps its record."""
    old = (state or {}).get("proven") or {}
    kept = {r: record for r, record in old.items() if r in releases and r != release}
    return {**kept, release: {"args": args, "env_sha": env_sha}}


def keep_env(args: dict[str, Any], release: str) -> Run:
    """Copy the env file this start answered with beside the state (0600 from the first byte)."""
    layout = HostLayout(args["base"], args["name"])
    saved = layout.proven_env(release)
    return Run(
        f"umask 077 && mkdir -p {quote(layout.proven)} && cp -- {quote(args['env_file'])} "
        f"{quote(saved + '.tmp')} && mv -f -- {quote(saved + '.tmp')} {quote(saved)}",
        timeout=60,
        why=f"the env file release {release} answered with",
    )


def restore_env(args: dict[str, Any], release: str) -> Run:
    """Put back the env file ``release`` answered with (through a temp file and a rename)."""
    saved = HostLayout(args["base"], args["name"]).proven_env(release)
    tmp = args["env_file"] + ".specops-restore"
    return Run(
        f"umask 077 && cp -- {quote(saved)} {quote(tmp)} && mv -f -- {quote(tmp)} {quote(args['env_file'])}",
        timeout=60,
        why=f"the env file release {release} last answered with",
    )
