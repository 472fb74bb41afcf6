"""One changing run per host: ``<base>/run/deploy.lock``, taken around every playbook that says
``lock: true`` (deploy, rollback, bench, tune, provision, patch-drafter).

Two deploys on one host would otherwise both report success while one silently replaced the
other's server. The lock holds the run id, the controller's host name and pid, and when it was
taken; it is written whole into a temp file first, then made visible with ``ln`` (atomic, and it
fails when the lock exists), so a lock is never seen half-written and a full disk leaves no lock
at all. A lock whose holder ran on this controller and is gone (its pid is dead, or it is this
process and the run has ended, e.g. when the connection was cut before it could release) is stale
and taken over, as is an empty one (left by an older specops that created the file before writing
it, on a full disk); any other lock refuses the run with a message naming the holder and how to
clear it. Only its holder releases a lock.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ops.errors import SpecopsError
from ops.layout import HostLayout
from ops.shell import quote

if TYPE_CHECKING:
    from ops.connection import Connection

TAKEN = "specops-lock: taken"
UNWRITTEN = "specops-lock: not written"
_RUNNING: set[str] = set()  # run ids this process is running now (see active)


class LockError(SpecopsError):
    """The host's lock could not be taken (its run fails at step "lock")."""


class HostLocked(LockError):
    """Another run holds the host's lock."""


def _record(run_id: str) -> str:
    return json.dumps(
        {
            "run_id": run_id,
            "controller": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
        sort_keys=True,
    )


@contextmanager
def active(run_id: str) -> Iterator[None]:
    """Mark ``run_id`` as running in this process (a lock it left after it ended is stale)."""
    _RUNNING.add(run_id)
    try:
        yield
    finally:
        _RUNNING.discard(run_id)


def _stale(holder: dict[str, Any]) -> bool:
    """True when the holder ran on this controller and is gone: a dead pid, or an ended run here."""
    if holder.get("controller") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    if holder["pid"] == os.getpid():
        return holder.get("run_id") not in _RUNNING
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def acquire(
    conn: Connection, host: str, base: str, run_id: str, note: Callable[[str], None] | None = None
) -> str:
    """Take the host's lock for ``run_id``; returns its text (what :func:`release` checks).
    ``note`` hears about a stale lock taken over."""
    layout, mine = HostLayout(base), _record(run_id)
    run, lock = quote(layout.run), quote(layout.deploy_lock)
    command = (
        f"mkdir -p -m 0700 {run} && t=$(mktemp {run}/.deploy.lock.XXXXXX) && "
        f"{{ printf '%s\\n' {quote(mine)} > \"$t\"; }} 2>/dev/null; "
        f'if [ "$(cat "$t")" != {quote(mine)} ]; then rm -f "$t"; echo {quote(UNWRITTEN)}; '
        f'elif ln "$t" {lock} 2>/dev/null; then rm -f "$t"; echo {quote(TAKEN)}; '
        f'else rm -f "$t"; cat {lock}; fi'
    )
    holder: Any = {}
    for _ in range(3):
        result = conn.run(command, timeout=60)
        text = result.stdout.strip()
        if result.ok and text == TAKEN:
            return mine
        if text == UNWRITTEN or not result.ok:
            why = "writing it failed (is the disk full?)" if text == UNWRITTEN else result.stderr.strip()
            raise LockError(
                f"host '{host}': cannot take the lock {layout.deploy_lock}: {why or 'no output'} (fix: free "
                f"space on the host (df -h {layout.run}) and check that {base} is writable, then run again)"
            )
        try:
            holder = json.loads(text) if text else {}
        except ValueError:
            holder = None
        if text and not (isinstance(holder, dict) and _stale(holder)):
            break
        gone = "an empty lock (left by a run that could not write it, e.g. on a full disk)"
        if text:
            gone = f"a stale lock of run {holder.get('run_id')} (pid {holder.get('pid')}, no longer running)"
        if note is not None:
            note(f"took over {gone}: {layout.deploy_lock}")
        conn.run(f'[ "$(cat {lock})" = {quote(text)} ] && rm -f {lock}; true', timeout=60)
    who = (
        f"run {holder.get('run_id')} (pid {holder.get('pid')} on {holder.get('controller')}, "
        f"since {holder.get('since')})"
        if isinstance(holder, dict) and holder
        else "an unreadable lock"
    )
    raise HostLocked(
        f"host '{host}' is locked by {who}: another specops run is changing it (fix: wait for "
        f"it to finish; if it is gone, remove {layout.deploy_lock} on the host)"
    )


def release(conn: Connection, base: str, mine: str) -> None:
    """Remove the lock if it is still ours."""
    lock = quote(HostLayout(base).deploy_lock)
    conn.run(f'[ "$(cat {lock} 2>/dev/null)" = {quote(mine)} ] && rm -f {lock}; true', timeout=60)
