"""Applying a service plan: run its changes, and when the new release does not answer, go back.

A failure before the first disruptive change (the start check) leaves the running release
untouched; after it, the release that ran before is switched back, restarted and proven, and the
step still fails with the failed release's log tail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ops.api.changes import Applied, Plan, StepFailed
from ops.api.context import StepContext
from ops.service.acceptance import AcceptanceFailed
from ops.service.facts import gather
from ops.service.plan import plan_service

if TYPE_CHECKING:
    from ops.connection import Connection

LOG_TAIL_LINES = 40


class ServiceFailed(StepFailed):
    """A failure while applying; ``touched``: the switch, stop or start had begun (roll back)."""

    def __init__(self, cause: StepFailed, touched: bool) -> None:
        super().__init__(str(cause), command=cause.command, stderr=cause.stderr)
        self.touched = touched
        self.cause = cause


def execute_plan(conn: Connection, plan: Plan) -> dict[str, Any]:
    """Apply a service plan's changes in order; the answers of the health wait and the acceptance
    gate are returned, a failure raised as ServiceFailed saying whether the server had been touched
    (switch, stop or start) by then."""
    answer: dict[str, Any] = {}
    first_disruptive = plan.data.get("first_disruptive", 0)
    for index, change in enumerate(plan.changes):
        try:
            answer = {**answer, **(change.apply(conn) or {})}  # the health wait and the gate answer
        except StepFailed as exc:
            raise ServiceFailed(exc, touched=index >= first_disruptive) from None
    return answer


def log_tail(conn: Connection, path: str, offset: int) -> str:
    """The log lines written since ``offset`` (the whole log if it was truncated), last few only."""
    info = conn.stat(path)
    if info is None:
        return f"(no log at {path})"
    data = conn.read_bytes(path, offset if info.size >= offset else 0)
    lines = data.decode("utf-8", "replace").rstrip().splitlines()[-LOG_TAIL_LINES:]
    return "\n".join(lines) or f"(nothing new in {path})"


def apply_service(conn: Connection, plan: Plan, ctx: StepContext) -> Applied:
    """The service step's apply: the plan, else a refusal (nothing touched) or a rollback."""
    data = plan.data
    if "args" not in data:  # only the service definition changed
        execute_plan(conn, plan)
        return Applied(True, plan.reason, dict(plan.data))
    try:
        answer = execute_plan(conn, plan)
    except ServiceFailed as exc:
        if not exc.touched:
            kept = f"; release {data['rollback_to']} keeps running untouched" if data["rollback_to"] else ""
            raise StepFailed(
                f"release {data['release']} refused before any restart: {exc}{kept}",
                command=exc.command,
                stderr=exc.stderr,
            ) from None
        roll_back(conn, plan, ctx, exc)
    what = (
        f"release {data['release']}"
        if data["system"] == "ddtree"
        else f"{data['system']} (release {data['release']})"
    )
    message = (
        f"{what} answers at {data['url']} (pid {answer['pid']}, ready after "
        f"{answer['healthy_after']}s, completion {answer['text']!r})"
    )
    gate = answer.get("acceptance")
    if gate:
        message += "; acceptance: " + ", ".join(
            f"{mode} tau {m['tau']:.2f}" + (f" >= {m['min_tau']:g} ({m['source']})" if m["min_tau"] else "")
            for mode, m in gate["modes"].items()
        )
    kept = {k: data[k] for k in ("release", "previous", "backend", "url", "system")}
    return Applied(True, message, kept | {"pid": answer["pid"], "acceptance": gate})


def roll_back(conn: Connection, plan: Plan, ctx: StepContext, failure: StepFailed) -> None:
    """Back to the release that ran before; always raises, with the failed release's log tail."""
    data = plan.data
    tail = log_tail(conn, data["log"], data["log_size"])
    if failure.stderr:
        tail = f"{failure.command or ''}\n{failure.stderr}\n--- log ---\n{tail}".lstrip()
    bad, old = data["release"], data["rollback_to"]
    gated = isinstance(getattr(failure, "cause", failure), AcceptanceFailed)
    why = "failed its acceptance gate" if gated else "did not answer"
    if old is None:  # stop it: a server that never answered must not crash-loop under its supervisor
        stopped = conn.run(data["stop"], timeout=data["args"]["stop_timeout"] + 60).ok
        raise StepFailed(
            f"release {bad} {why} ({failure}); no earlier release to roll back to"
            + ("; it was stopped" if stopped else ""),
            stderr=tail,
        )
    # with the settings it answered with: its proven record (proven=True), else the state's arguments
    args = {**(data.get("rollback_args") or data["args"]), "release": old}
    if ctx.reporter is not None:  # a rollback restarts a model: say so while it loads
        ctx.reporter.note(f"{ctx.host.name} | release {bad} {why} ({failure}); rolling back to {old}")
    try:
        back = plan_service(
            gather(conn, args), args, ctx, previous=data["previous_before"], rollback=True, proven=True
        )
        answer = execute_plan(conn, back) if back.will_change else {"pid": back.data.get("pid")}
    except StepFailed as again:
        raise StepFailed(
            f"release {bad} {why} ({failure}); rolling back to {old} failed too: {again}",
            stderr=tail,
        ) from None
    raise StepFailed(
        f"release {bad} {why} ({failure}); rolled back to {old}"
        + (" with the settings that answered before" if old == bad else "")
        + f", which answers again (pid {answer.get('pid')})",
        stderr=tail,
    )
