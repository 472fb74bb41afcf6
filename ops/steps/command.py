"""The ``command`` step: run a shell command, guarded by ``creates`` and ``unless``.

A bare command cannot know whether its work is done, so it is flagged not idempotent; with a
guard it becomes a probe (does the file exist? does the check command succeed?) like any step.
"""

from __future__ import annotations

from typing import Any

from ops.api.args import Arg, arguments
from ops.api.changes import Applied, Fact, Plan, Run, StepFailed
from ops.shell import join, quote
from ops.steps.base import Step, register


def command_arg(value: Any) -> str:
    """A shell string as written, or an argument list quoted through ops.shell."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(v, (str, int, float)) for v in value):
        return join([str(v) for v in value])
    raise ValueError(f"expected a command string or a non-empty list of arguments, got {value!r}")


def exists_fact(path: str) -> Fact[bool]:
    return Fact(
        f"if [ -e {quote(path)} ]; then echo yes; else echo no; fi",
        lambda result: result.stdout.strip() == "yes",
    )


def exit_code_fact(command: str) -> Fact[int]:
    return Fact(command, lambda result: result.exit_code)


def tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


@register
class Command(Step):
    name = "command"
    summary = "run a shell command unless 'creates' exists or 'unless' succeeds"
    idempotent = False
    args = arguments(
        cmd=Arg(command_arg, required=True, help="shell string, or a list of arguments (quoted for you)"),
        creates=Arg(str, help="skip when this path exists on the host"),
        unless=Arg(command_arg, help="skip when this read-only check command exits 0"),
        sudo=Arg(bool, default=False, help="run through sudo (the host must allow it)"),
        timeout=Arg(float, help="seconds before the command is abandoned"),
    )

    def is_idempotent(self, args):
        return bool(args["creates"] or args["unless"])

    def probe(self, conn, args, ctx):
        facts: dict[str, Any] = {}
        if args["creates"]:
            facts["creates_exists"] = exists_fact(args["creates"]).gather(conn)
        if args["unless"] and not facts.get("creates_exists"):
            facts["unless_exit"] = exit_code_fact(args["unless"]).gather(conn, sudo=args["sudo"])
        return facts

    def plan(self, facts, args, ctx):
        if facts.get("creates_exists"):
            return Plan.noop(f"{args['creates']} exists")
        if facts.get("unless_exit") == 0:
            return Plan.noop("'unless' check succeeded")
        why = "no guard" if not self.is_idempotent(args) else "guard not satisfied"
        return Plan.of([Run(args["cmd"], sudo=args["sudo"], timeout=args["timeout"], why=why)], why)

    def apply(self, conn, plan, ctx):
        """Like the default, but the output is kept for ``register`` (stdout, stderr, rc)."""
        data: dict[str, Any] = {}
        for change in plan.changes:
            result = conn.run(change.command, sudo=change.sudo, timeout=change.timeout)
            data = {"stdout": result.stdout, "stderr": result.stderr, "rc": result.exit_code}
            if not result.ok:
                raise StepFailed(
                    f"command exited {result.exit_code}",
                    command=result.command,
                    stderr=tail(result.stderr or result.stdout),
                )
        message = tail(data.get("stdout", ""), 1) or "ran"
        return Applied(bool(plan.changes), message, data)
