"""Drafter config steps: ``drafter_lint`` and ``drafter_patch`` on the host's checkpoints.

Both read the host's ``drafter`` (and optional ``target``) directories through the connection's
SFTP calls, using the same rules as ``specops config lint|patch``: config files and tokenizer files
are read whole, safetensors files only up to the end of their headers. ``drafter_lint`` is a
read-only check whose errors fail the host (so ``fab deploy`` can refuse a bad drafter);
``drafter_patch`` plans two atomic writes, a timestamped backup beside the config and the patched
config itself (the file a symlinked config.json points to), and plans nothing once the config
matches the spec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drafter_config.findings import format_findings
from drafter_config.lint import lint, load_inputs
from drafter_config.patch import PatchRefused, backup_path, plan_patch
from drafter_config.serve import serve_from_vars
from drafter_config.source import InvalidJson
from drafter_config.spec import Spec, load_spec, shipped_specs
from ops.api.args import Arg, arguments
from ops.api.changes import Plan, StepFailed, Write
from ops.api.context import StepContext
from ops.steps.base import Step, register

if TYPE_CHECKING:
    from ops.connection import Connection

_SHOWN = 3


def _serve_vars(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected the inventory's serve mapping, got {value!r}")
    return value


def resolve_spec(name: str | None, ctx: StepContext) -> Spec | None:
    """A shipped spec by name, else a controller-side file beside the playbook or absolute."""
    if name is None:
        return None
    if name in shipped_specs():
        return load_spec(name)
    return load_spec(str(ctx.find_source(name)))


def summarize(findings: list[dict[str, Any]]) -> str:
    """``DFL012 dflash_config.mask_token_id (config.json:14), ...`` for a one-line message."""
    parts = [
        f"{f['code']} {f['path']} ({f['file'].rsplit('/', 1)[-1]}:{f['line']})"
        if f["line"]
        else f"{f['code']} {f['file'].rsplit('/', 1)[-1]}"
        for f in findings[:_SHOWN]
    ]
    more = f" and {len(findings) - _SHOWN} more" if len(findings) > _SHOWN else ""
    return ", ".join(parts) + more


@register
class DrafterLint(Step):
    name = "drafter_lint"
    summary = "lint the host's DFlash drafter config against its target and a spec (read-only)"
    args = arguments(
        drafter=Arg(str, required=True, help="drafter checkpoint directory (or config.json) on the host"),
        target=Arg(str, help="target checkpoint directory (or config.json) on the host"),
        spec=Arg(str, help="a shipped spec name or a spec file on the controller"),
        serve=Arg(_serve_vars, help="the host's serve variables; num_speculative_tokens is checked"),
    )

    def probe(self, conn: Connection, args: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        serve = (
            serve_from_vars(args["serve"], f"inventory serve vars of {ctx.host.name}")
            if args["serve"]
            else None
        )
        report = lint(
            args["drafter"], args["target"], spec=resolve_spec(args["spec"], ctx), serve=serve, store=conn
        )
        return {**report.as_json(), "text": format_findings(report)}

    def plan(self, facts: dict[str, Any], args: dict[str, Any], ctx: StepContext) -> Plan:
        errors = [f for f in facts["findings"] if f["severity"] == "error"]
        warnings = [f for f in facts["findings"] if f["severity"] == "warning"]
        data = {"errors": len(errors), "warnings": len(warnings), "findings": facts["findings"]}
        if errors:
            raise StepFailed(
                f"drafter config {args['drafter']}: {len(errors)} error(s), {len(warnings)} "
                f"warning(s): {summarize(errors)}",
                stderr=facts["text"],
            )
        noted = f": {summarize(warnings)}" if warnings else ""
        return Plan.noop(
            f"drafter config {args['drafter']} passes lint ({len(warnings)} warning(s){noted})", **data
        )


@register
class DrafterPatch(Step):
    name = "drafter_patch"
    summary = "patch the host's DFlash drafter config to a spec, keeping a backup beside it"
    args = arguments(
        drafter=Arg(str, required=True, help="drafter checkpoint directory (or config.json) on the host"),
        spec=Arg(str, required=True, help="a shipped spec name or a spec file on the controller"),
        target=Arg(str, help="target checkpoint on the host; the patched config is re-linted against it"),
    )

    def probe(self, conn: Connection, args: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        spec = resolve_spec(args["spec"], ctx)
        try:
            inputs = load_inputs(conn, args["drafter"], args["target"])
        except InvalidJson as exc:
            raise StepFailed(f"{exc}: cannot patch a file that is not JSON (fix the syntax first)") from None
        try:
            patch = plan_patch(inputs, spec)
        except PatchRefused as exc:
            return {
                "config": inputs.drafter.file,
                "spec": spec.name,
                "refused": format_findings(exc.report),
                "errors": [f.as_json() for f in exc.report.errors],
            }
        return {
            "config": patch.path,
            "target": patch.target,
            "spec": spec.name,
            "refused": None,
            "old": patch.old,
            "new": patch.new,
            "diff": patch.diff,
            "backup": backup_path(conn, patch.path) if patch.changed else None,
        }

    def plan(self, facts: dict[str, Any], args: dict[str, Any], ctx: StepContext) -> Plan:
        if facts["refused"] is not None:
            raise StepFailed(
                f"refusing to patch {facts['config']} to spec {facts['spec']}: the result would "
                f"still fail lint: {summarize(facts['errors'])}",
                stderr=facts["refused"],
            )
        if facts["new"] == facts["old"]:
            return Plan.noop(f"{facts['config']} already matches spec {facts['spec']}")
        target = facts["target"]
        via = "" if target == facts["config"] else f" through the link: wrote {target}"
        changes = [
            Write(facts["backup"], facts["old"].encode("utf-8"), why="backup of the config before patching"),
            Write(target, facts["new"].encode("utf-8"), diff=facts["diff"], why=f"spec {facts['spec']}"),
        ]
        return Plan.of(
            changes,
            f"patched {facts['config']}{via} to spec {facts['spec']} (backup {facts['backup']})",
            backup=facts["backup"],
            config=facts["config"],
            written=target,
        )
