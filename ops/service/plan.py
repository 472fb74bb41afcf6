"""The service plan, pure: does the server need a restart, and if so, the backend's commands.

:func:`restart_reasons` compares what runs (the probe's facts, the state file's fingerprint) with
what is wanted; :func:`plan_service` turns a "yes" into changes: the backend's definition, the
start check of a new release, the switch of ``current``, the backend's (re)start, the health
wait and the state file. ``fab rollback`` is ``release: previous``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ops.layout import HostLayout
from ops.service.backends import Preflight, Supervisor, Systemd, backends, port_check, wait
from ops.service.proven import keep_env, proven_records, proven_settings, restore_env
from ops.service.releases import switch_commands
from ops.service.settings import serve_url
from ops.shell import join
from ops.steps.base import Plan, Run, StepContext, StepFailed, Write
from ops.steps.files import render_template
from specops_contract import SERVE_DEFAULTS

UNIT_TEMPLATE = "specops-ddtree.service.j2"
_UNSET: Any = object()


def serve_argv(args: dict[str, Any], ctx: StepContext) -> list[str]:
    """The server's command line: paths and numbers only. Secrets, and any other ``SPECOPS_SERVE_*``
    setting (temperature, queue size, ...), are in the environment file the server reads."""
    serve = {**SERVE_DEFAULTS, **args["serve"]}
    cpu = ctx.vars.get("profile") == "cpu"
    device = serve.get("device") or ("cpu" if cpu else "cuda")
    flags = {
        "--target": args["target"],
        "--drafter": args["drafter"],
        "--mode": serve["mode"],
        "--budget": serve["budget"],
        "--host": serve["host"],
        "--port": serve["port"],
        "--device": device,
        "--env-file": args["env_file"],
    }
    if serve.get("dtype"):  # unset: the server picks for the host's hardware (loader.default_dtype)
        flags["--dtype"] = serve["dtype"]
    argv = [f"{args['venv']}/bin/python", "-m", "ddtree_runtime", "serve"]
    for flag, value in flags.items():
        argv += [flag, str(value)]
    if serve.get("max_context"):
        argv += ["--max-context", str(serve["max_context"])]
    return argv


def launch(args: dict[str, Any], ctx: StepContext, release: str) -> dict[str, Any]:
    """Everything that, when it changes, needs a restart (with the env file's checksum)."""
    where = HostLayout(args["base"]).release(release)
    return {
        "argv": serve_argv(args, ctx),
        "cwd": where,
        "env_file": args["env_file"],
        "env": {"PYTHONPATH": f"{where}/site", "SPECOPS_RELEASE": release},
    }


def unit_text(
    args: dict[str, Any], ctx: StepContext, spec: dict[str, Any], release: str, scope: str
) -> bytes:
    context = {
        "service": args["name"],
        "release": release,
        "scope": scope,
        "exec_start": join(spec["argv"]),
        "cwd": spec["cwd"],
        "environment": spec["env"],
        "env_file": spec["env_file"],
        "log": HostLayout(args["base"], args["name"]).log(),
        "stop_timeout": int(args["stop_timeout"]),
    }
    return render_template(UNIT_TEMPLATE, context, ctx)


def wanted_release(layout: dict[str, Any], args: dict[str, Any], ctx: StepContext) -> str:
    """The release id to run: ``args["release"]``, or what ``previous`` names."""
    if args["release"] == "previous":
        wanted = layout["previous"]
        if wanted is None:
            raise StepFailed(
                f"no previous release under {args['base']} to go back to (fix: deploy first; "
                "a rollback needs two releases)"
            )
    else:
        wanted = args["release"]
    complete = wanted in layout["releases"] or ctx.check  # --check: the release step only planned it
    if not complete:
        raise StepFailed(
            f"release {wanted} is not complete under {args['base']}/releases (fix: run fab deploy)"
        )
    return wanted


def restart_reasons(
    current: str | None, wanted: str, process: dict[str, Any] | None, svc: dict[str, Any], fingerprint: str
) -> list[str]:
    """Pure: why the server must (re)start; empty when it runs ``wanted`` as wanted and answers."""
    reasons = []
    if current != wanted:
        reasons.append(f"current {current or 'none'} -> {wanted}")
    if process is None:
        reasons.append("not running")
    elif (svc["state"] or {}).get("fingerprint") != fingerprint:
        reasons.append("release, environment file or unit changed")
    elif svc["health"] != 200:
        reasons.append(f"running but /health answers {svc['health'] or svc.get('health_error')}")
    return reasons


def _definition(
    backend: Supervisor | Systemd,
    args: dict[str, Any],
    ctx: StepContext,
    svc: dict[str, Any],
    spec: dict[str, Any],
    wanted: str,
    env_sha: str | None,
) -> tuple[list[Run | Write], dict[str, Any]]:
    """The backend's install changes and the restart fingerprint (launch, env file, backend, unit)."""
    fingerprint: dict[str, Any] = {"launch": spec, "env_sha": env_sha, "backend": backend.name}
    if isinstance(backend, Systemd):
        unit = unit_text(args, ctx, spec, wanted, backend.facts["scope"])
        fingerprint["unit_sha"] = hashlib.sha256(unit).hexdigest()
        return list(backend.install(unit, wanted)), fingerprint
    return list(backend.install(svc)), fingerprint


def _rollback_target(
    current: str | None, wanted: str, state: dict[str, Any], layout: dict[str, Any], digest: str
) -> str | None:
    """What to go back to if ``wanted`` fails (with the settings it was proven with, see
    ``proven.py``): the release ``current`` named, else (a re-run after a cut link left ``current``
    switched but unproven) the release that last answered. When the release stays and only the
    settings change, it is the same release with its old settings."""
    proven = state.get("release")
    target = current if current != wanted else proven if proven != wanted else None
    target = target if target in layout["releases"] else None
    if target is None and proven == wanted and state.get("fingerprint") != digest:
        return wanted
    return target


def plan_service(
    facts: dict[str, Any],
    args: dict[str, Any],
    ctx: StepContext,
    previous: Any = _UNSET,
    preflight: bool = True,
    proven: bool = False,
) -> Plan:
    """Pure. ``previous`` overrides where ``<base>/previous`` ends up, ``preflight`` False skips the
    start check (the automatic rollback goes back to a release that just ran), and ``proven`` runs
    the release with the settings it last answered with, env file included (the rollbacks)."""
    layout, svc = facts["layout"], facts["service"]
    wanted = wanted_release(layout, args, ctx)
    settings = proven_settings(svc, wanted) if proven else None
    if settings is not None:
        args = {**settings["args"], "release": wanted}
    env_sha = svc["env_sha"] if settings is None else settings["env_sha"]
    current = layout["current"]
    if previous is _UNSET:
        previous = current if current != wanted else layout["previous"]
    backend, other = backends(HostLayout(args["base"], args["name"]), svc, args["backend"])
    spec = launch(args, ctx, wanted)
    if not env_sha and not ctx.check:  # under --check the template step only planned it
        raise StepFailed(f"environment file {args['env_file']} is missing (fix: render it before this step)")
    definition, fingerprint = _definition(backend, args, ctx, svc, spec, wanted, env_sha)
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    process = backend.process(svc)
    reasons = restart_reasons(current, wanted, process, svc, digest)
    data = {"release": wanted, "previous": previous, "backend": backend.name, "url": serve_url(args["serve"])}
    if not reasons:
        pid = process["pid"]
        message = f"release {wanted} running (pid {pid}, up {process['uptime_s']:g}s), /health 200"
        if definition:
            return Plan.of(definition, message + "; update the service definition", pid=pid, **data)
        return Plan.noop(message, pid=pid, **data)
    rollback_to = _rollback_target(current, wanted, svc["state"] or {}, layout, digest)
    running = process or other.process(svc)
    changes: list[Run | Write] = list(definition)
    if preflight:
        changes += _start_checks(args, spec, rollback_to not in (None, wanted), running)
    first_disruptive = len(changes)
    if settings is not None and settings["restore"]:
        changes.append(restore_env(args, wanted))
    if current != wanted or layout["previous"] != previous:
        changes += switch_commands(args["base"], wanted, previous)
    changes += other.hand_over(svc, args["stop_timeout"]) + backend.start(spec, args["stop_timeout"])
    changes.append(wait(data["url"], args["timeout"], args["prompt"], backend.wait_on, args["env_file"]))
    if env_sha is not None:
        changes.append(keep_env(args, wanted))
    records = proven_records(svc["state"], layout["releases"], wanted, args, env_sha)
    changes.append(_state_write(args, wanted, digest, backend.name, records))
    data.update(
        stop=backend.stop(args["stop_timeout"]).command,
        first_disruptive=first_disruptive,
        rollback_to=rollback_to,
        previous_before=layout["previous"],
        log_size=svc["log_size"],
        log=HostLayout(args["base"], args["name"]).log(),
        args=args,
    )
    return Plan.of(changes, f"restart on release {wanted}: {'; '.join(reasons)}", **data)


def _start_checks(
    args: dict[str, Any], spec: dict[str, Any], new_release: bool, running: dict[str, Any] | None
) -> list[Run | Write]:
    """The checks before anything is disturbed: a new release starts, and the port is ours to take."""
    checks: list[Run | Write] = []
    if new_release:
        check = join(["env", f"PYTHONPATH={spec['env']['PYTHONPATH']}", *spec["argv"][:4], "--help"])
        checks.append(
            Preflight(
                f"cd {join([spec['cwd']])} && {check} >/dev/null",
                timeout=300,
                why="the new release imports and parses its flags",
            )
        )
    if running is not None:
        checks.append(port_check({**SERVE_DEFAULTS, **args["serve"]}["port"], running["pid"]))
    return checks


def _state_write(
    args: dict[str, Any], wanted: str, digest: str, backend: str, proven: dict[str, Any]
) -> Write:
    """The state file: which release runs, with which fingerprint and arguments, and what each
    release last answered with (the rollbacks read it)."""
    record = {"release": wanted, "fingerprint": digest, "backend": backend, "args": args, "proven": proven}
    state = HostLayout(args["base"], args["name"]).state()
    return Write(state, (json.dumps(record, indent=1) + "\n").encode(), "0644", why="what runs")
