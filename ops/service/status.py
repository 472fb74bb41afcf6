"""What ``fab status`` shows for one host, from the service facts (pure)."""

from __future__ import annotations

from typing import Any

from ops.service.acceptance import likely_fields
from ops.service.metrics import status_metrics
from ops.service.settings import serve_url


def status_summary(facts: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """Release, backend, pid, the release the process runs, uptime, health, URL and metrics."""
    layout, svc = facts["layout"], facts["service"]
    backend = "systemd" if svc["systemd"]["process"] else "supervisor" if svc["supervisor_process"] else None
    process = svc["systemd"]["process"] or svc["supervisor_process"]
    running = process["cwd"].rstrip("/").rsplit("/", 1)[-1] if process and process["cwd"] else None
    state = svc["state"] or {}
    metrics = status_metrics(svc["metrics"]) if svc["metrics"] else {}
    return {
        "system": state.get("system", "ddtree"),
        "pins": state.get("pins") or {},
        "command": state.get("argv"),
        "acceptance": svc.get("acceptance"),
        "tau_drop": tau_drop(metrics.get("mean_acceptance_length"), svc.get("acceptance")),
        "release": layout["current"],
        "previous": layout["previous"],
        "releases": sorted(layout["releases"], key=lambda r: layout["releases"][r]),
        "backend": backend,
        "unit": f"{args['name']}.service" if backend == "systemd" else None,
        "pid": process["pid"] if process else None,
        "running_release": running,
        "uptime_s": process["uptime_s"] if process else None,
        "health": svc["health"],
        "url": serve_url(args["serve"]),
        "metrics": metrics,
        "supervisor": svc.get("supervisor_status") if backend != "systemd" else None,
    }


def tau_drop(live: float | None, gate: dict[str, Any] | None) -> dict[str, Any] | None:
    """Pure: the live tau (over the server's life) under the lowest threshold its last acceptance
    gate passed, as {"tau", "min_tau", "mode"}; None when it holds or nothing can be compared."""
    limits = [
        (m["min_tau"], mode) for mode, m in ((gate or {}).get("modes") or {}).items() if m.get("min_tau")
    ]
    if live is None or not limits:
        return None
    minimum, mode = min(limits)
    return {"tau": live, "min_tau": minimum, "mode": mode} if live < minimum else None


def is_down(info: dict[str, Any]) -> bool:
    """A deployed release whose server is not running, or does not answer /health."""
    return info["release"] is not None and (info["pid"] is None or info["health"] != 200)


def status_line(info: dict[str, Any]) -> str:
    """One line: the release, the process and its health, and the acceptance length when known."""
    supervisor = info.get("supervisor") or {}
    if info["pid"] is None and supervisor.get("state") == "crash-loop":
        state = (
            f"not running: crash loop ({supervisor['restarts']} restarts, last exit "
            f"{supervisor['last_exit']}; the supervisor stopped restarting it)"
        )
    elif info["pid"] is None:
        state = "not running"
    else:
        where = info["unit"] or "supervisor"
        state = f"pid {info['pid']} ({where}), up {info['uptime_s']:g}s, /health {info['health']}"
        if supervisor.get("restarts"):
            state += f", restarted {supervisor['restarts']} time(s) after crashes (last exit {supervisor['last_exit']})"
    m = info["metrics"]
    extra = (
        f", {m.get('requests', 0):g} requests, acceptance length {m['mean_acceptance_length']}"
        if "mean_acceptance_length" in m
        else ""
    )
    gate = info.get("acceptance") or {}
    for mode, passed in (gate.get("modes") or {}).items():
        extra += f"; {mode} passed its gate at tau {passed['tau']:g}" + (
            f" (min_tau {passed['min_tau']:g})" if passed.get("min_tau") else ""
        )
    drop = info.get("tau_drop")
    if drop:
        extra += (
            f"; ACCEPTANCE DROPPED: live tau {drop['tau']:g} < min_tau {drop['min_tau']:g} (likely wrong: "
            f"{likely_fields(info['system'], drop['mode'])})"
        )
    system = "" if info.get("system", "ddtree") == "ddtree" else f"{info['system']} {_version(info)}, "
    return f"release {info['release'] or 'none'}: {system}{state}{extra}"


def _version(info: dict[str, Any]) -> str:
    return (info.get("pins") or {}).get(info["system"], "(version unknown)")
