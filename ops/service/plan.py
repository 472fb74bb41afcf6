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

from ops.api.changes import Plan, Run, StepFailed, Write
from ops.api.context import StepContext
from ops.api.templates import render_template
from ops.layout import HostLayout
from ops.service.acceptance import Probe, probe
from ops.service.backends import Preflight, Supervisor, Systemd, backends, installed, port_check, wait
from ops.service.command import serve_argv, served_id, system_of
from ops.service.proven import keep_env, proven_records, proven_settings, restore_env
from ops.service.releases import switch_commands
from ops.service.settings import serve_url
from ops.shell import join
from specops_contract import SERVE_DEFAULTS

UNIT_TEMPLATE = "specops-ddtree.service.j2"
_UNSET: Any = object()


def launch(args: dict[str, Any], ctx: StepContext, release: str) -> dict[str, Any]:
    """Everything that, when it changes, needs a restart (with the env file's checksum). Our runtime
    runs from its release; vLLM and SGLang run from their venvs, so a new release leaves them be."""
    if system_of(args).follows_release:
        where = HostLayout(args["base"]).release(release)
        env = {"PYTHONPATH": f"{where}/site", "SPECOPS_RELEASE": release}
    else:
        where, env = args["base"], {}
    return {"argv": serve_argv(args, ctx), "cwd": where, "env_file": args["env_file"], "env": env}


def unit_text(
    args: dict[str, Any], ctx: StepContext, spec: dict[str, Any], release: str, scope: str
) -> bytes:
    context = {
        "service": args["name"],
        "system": system_of(args).name,
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
    current: str | None,
    wanted: str,
    process: dict[str, Any] | None,
    svc: dict[str, Any],
    fingerprint: str,
    follows_release: bool = True,
) -> list[str]:
    """Pure: why the server must (re)start; empty when it runs ``wanted`` as wanted and answers
    (a system that does not run from a release restarts only when its fingerprint changes)."""
    reasons = []
    if current != wanted and follows_release:
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
    """The backend's install changes and the restart fingerprint (launch, env file, backend, unit,
    and the installed versions of the system's packages: a re-provisioned venv restarts it)."""
    fingerprint: dict[str, Any] = {
        "launch": spec,
        "env_sha": env_sha,
        "backend": backend.name,
        "pins": svc.get("pins") or {},
    }
    if isinstance(backend, Systemd):
        unit = unit_text(args, ctx, spec, wanted, backend.facts["scope"])
        fingerprint["unit_sha"] = hashlib.sha256(unit).hexdigest()
        return list(backend.install(unit, wanted)), fingerprint
    return list(backend.install(svc)), fingerprint


def _rollback_target(
    current: str | None,
    wanted: str,
    state: dict[str, Any],
    layout: dict[str, Any],
    digest: str,
    follows_release: bool = True,
) -> tuple[str | None, dict[str, Any] | None]:
    """What to go back to if ``wanted`` fails, and with which service arguments (None: the new ones).

    The release ``current`` named, else (a re-run after a cut link left ``current`` switched but
    unproven) the release that last answered; the arguments it answered with come from the state
    file. When the release stays and only the settings change, it is the same release with its
    old settings."""
    proven, proven_args = state.get("release"), state.get("args")
    if not follows_release:  # vLLM/SGLang: our release only carries tools; go back to the settings
        return (wanted, proven_args) if proven_args and state.get("fingerprint") != digest else (None, None)
    target = current if current != wanted else proven if proven != wanted else None
    target = target if target in layout["releases"] else None
    if target is None and proven == wanted and proven_args and state.get("fingerprint") != digest:
        return wanted, proven_args
    return target, proven_args if target is not None and target == proven else None


def plan_service(
    facts: dict[str, Any],
    args: dict[str, Any],
    ctx: StepContext,
    previous: Any = _UNSET,
    preflight: bool = True,
    rollback: bool = False,
    proven: bool = False,
) -> Plan:
    """Pure. ``previous`` overrides where ``<base>/previous`` ends up; ``rollback`` is the automatic
    one: a restart even where the state file still matches (the failed server runs the new command
    line), no start check and no acceptance gate (it goes back to settings that answered before);
    ``preflight`` False skips the start check alone (the bench); ``proven`` runs the release with
    the settings it last answered with, its env file included (both rollbacks, ``proven.py``)."""
    layout, svc = facts["layout"], facts["service"]
    wanted = wanted_release(layout, args, ctx)
    settings = proven_settings(svc, wanted) if proven else None
    if settings is not None:
        args = {**settings["args"], "release": wanted}
    env_sha = svc["env_sha"] if settings is None else settings["env_sha"]
    system = system_of(args)
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
    reasons = restart_reasons(current, wanted, process, svc, digest, system.follows_release)
    if rollback:
        reasons.append("rolling back")
        preflight = False
    data = {
        "release": wanted,
        "previous": previous,
        "backend": backend.name,
        "url": serve_url(args["serve"]),
        "system": system.name,
    }
    if not reasons:
        pid = process["pid"]
        what = f"release {wanted}" if system.follows_release else system.name
        message = f"{what} running (pid {pid}, up {process['uptime_s']:g}s), /health 200"
        switch = switch_commands(args["base"], wanted, previous) if current != wanted else []
        if switch:  # vLLM/SGLang: the release only carries our tools; the server keeps running
            message += f"; its command line is unchanged, so a new release ({wanted}) does not restart it"
        if definition:
            message += "; update the service definition"
        if definition or switch:
            return Plan.of([*definition, *switch], message, pid=pid, **data)
        return Plan.noop(message, pid=pid, **data)
    rollback_to, rollback_args = _rollback_target(
        current, wanted, svc["state"] or {}, layout, digest, system.follows_release
    )
    running = process or other.process(svc)
    changes: list[Run | Write] = list(definition)
    if preflight:
        new_release = system.follows_release and rollback_to not in (None, wanted)
        changes += _start_checks(args, spec, new_release, running)
        if not system.follows_release:  # before anything stops: vLLM/SGLang is in its venv
            changes.append(installed(spec["argv"][0], system.name))
    first_disruptive = len(changes)
    if settings is not None and settings["restore"]:
        changes.append(restore_env(args, wanted))
    if current != wanted or layout["previous"] != previous:
        changes += switch_commands(args["base"], wanted, previous)
    changes += other.hand_over(svc, args["stop_timeout"]) + backend.start(spec, args["stop_timeout"])
    ready = {**backend.wait_on, "ready_on": system.ready_on, "model": served_id(args)}
    changes.append(wait(data["url"], args["timeout"], args["prompt"], ready, args["env_file"]))
    if not rollback:
        changes += _gate(args, ctx, data["url"])
    if env_sha is not None:  # proven: the env file this start answered with, for the rollbacks
        changes.append(keep_env(args, wanted))
    records = proven_records(svc["state"], layout["releases"], wanted, args, env_sha)
    launched = {"argv": spec["argv"], "pins": svc.get("pins"), "proven": records}
    changes.append(_state_write(args, wanted, digest, backend.name, launched))
    data.update(
        stop=backend.stop(args["stop_timeout"]).command,
        first_disruptive=first_disruptive,
        rollback_to=rollback_to,
        rollback_args=rollback_args,
        previous_before=layout["previous"],
        log_size=svc["log_size"],
        log=HostLayout(args["base"], args["name"]).log(),
        args=args,
    )
    what = f"release {wanted}" if system.follows_release else f"{system.name} (release {wanted})"
    return Plan.of(changes, f"restart on {what}: {'; '.join(reasons)}", **data)


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


def _gate(args: dict[str, Any], ctx: StepContext, url: str) -> list[Probe]:
    """The acceptance gate after the health wait, unless it is off or the mode does not speculate."""
    settings, mode = args["acceptance"], {**SERVE_DEFAULTS, **args["serve"]}["mode"]
    if not settings.get("enabled") or mode == "ar":
        return []
    system = system_of(args)
    extra = {"mode": mode} if system.follows_release else {}  # our server: the request's mode
    record = HostLayout(args["base"], args["name"]).acceptance()
    return [probe(url, served_id(args), system.name, {mode: extra}, settings, ctx, record, args["env_file"])]


def _state_write(
    args: dict[str, Any], wanted: str, digest: str, backend: str, launched: dict[str, Any]
) -> Write:
    """The state file, the release record: which release and system run, the exact command line,
    the installed versions of the system's packages, the fingerprint and the arguments, and what
    each release last answered with (the rollbacks read them)."""
    record = {
        "release": wanted,
        "system": system_of(args).name,
        **launched,
        "fingerprint": digest,
        "backend": backend,
        "args": args,
    }
    state = HostLayout(args["base"], args["name"]).state()
    return Write(state, (json.dumps(record, indent=1) + "\n").encode(), "0644", why="what runs")
