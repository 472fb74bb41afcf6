"""The ``http_wait`` step: poll a URL *from the host* until it answers as wanted.

Services usually listen on the host's loopback, so the poll runs there: one small python3 process
loops until ready or timeout, which costs one round trip instead of one per attempt. Waiting
changes nothing on the host, so the step reports ``ok`` whether it waited or not.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ops.api.args import Arg, arguments
from ops.api.changes import Applied, Fact, Plan, Run, StepFailed
from ops.shell import join
from ops.steps.base import Step, register

if TYPE_CHECKING:
    from ops.connection import CommandResult

# argv: url, timeout seconds, wanted status, wanted substring ("" for any), interval seconds.
_POLL = r"""
import json, sys, time, urllib.error, urllib.request
url, timeout, want, contains, interval = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
start = time.monotonic()
while True:
    status, error = None, ""
    try:
        with urllib.request.urlopen(url, timeout=max(1.0, min(10.0, timeout))) as response:
            status, body = response.status, response.read(1 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(1 << 20).decode("utf-8", "replace")
    except Exception as exc:
        body, error = "", f"{type(exc).__name__}: {exc}"
    ready = status == want and (not contains or contains in body)
    if not error and not ready:
        error = f"status {status}" + (f", body lacks {contains!r}" if status == want else "")
    elapsed = time.monotonic() - start
    if ready or elapsed + interval > timeout:
        print(json.dumps({"ready": ready, "status": status, "error": error, "elapsed": round(elapsed, 2)}))
        sys.exit(0)
    time.sleep(interval)
"""


def poll_command(url: str, timeout: float, status: int, contains: str | None, interval: float) -> str:
    return join(["python3", "-c", _POLL, url, str(timeout), str(status), contains or "", str(interval)])


def parse_poll(result: CommandResult) -> dict[str, Any]:
    """The poller's one JSON line; anything else means python3 is missing or crashed."""
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise StepFailed(
            "could not poll (is python3 installed on the host?)", command=result.command, stderr=result.stderr
        ) from None


@register
class HttpWait(Step):
    name = "http_wait"
    summary = "wait until a URL, fetched from the host, returns a status (and text)"
    args = arguments(
        url=Arg(str, required=True, help="fetched from the host, so 127.0.0.1 means the host"),
        timeout=Arg(float, default=60.0, help="seconds to keep trying"),
        status=Arg(int, default=200, help="wanted HTTP status"),
        contains=Arg(str, help="text the body must contain, e.g. the served model id"),
        interval=Arg(float, default=0.5, help="seconds between attempts"),
    )

    def probe(self, conn, args, ctx):
        once = poll_command(args["url"], 0.0, args["status"], args["contains"], 0.0)
        return Fact(once, parse_poll).gather(conn, timeout=30)

    def plan(self, facts, args, ctx):
        if facts["ready"]:
            return Plan.noop(f"{args['url']} answered {facts['status']}", status=facts["status"])
        poll = poll_command(args["url"], args["timeout"], args["status"], args["contains"], args["interval"])
        return Plan.of(
            [Run(poll, timeout=args["timeout"] + 30, why=f"not ready yet ({facts['error']})")],
            f"wait up to {args['timeout']:g}s for {args['url']}",
            status=facts["status"],
        )

    def apply(self, conn, plan, ctx):
        for change in plan.changes:
            outcome = parse_poll(conn.run(change.command, timeout=change.timeout))
            if not outcome["ready"]:
                raise StepFailed(
                    f"timed out after {outcome['elapsed']}s: {outcome['error']}",
                    command=change.command.split(" ", 1)[0] + " -c <poll>",
                )
            return Applied(
                False,
                f"ready after {outcome['elapsed']}s (status {outcome['status']})",
                {"status": outcome["status"]},
            )
        return Applied(False, plan.reason, dict(plan.data))
