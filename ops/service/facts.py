"""What the host says about the server, in one read-only round trip (``remote/probe.py``).

``gather`` returns ``{"layout": <releases and links>, "service": <probe facts>}``; the probe's
facts are plain JSON (the plan tests feed them in as data): ``supervisor_process`` and
``systemd.process`` (pid, uptime, cwd, or None), ``systemd`` (usable, scope, uid, unit_path,
unit_sha), ``state`` (the release record: what the last deploy started), ``acceptance`` (the last
gate it passed), ``pins`` (versions of the system's packages in its venv), ``env_sha``,
``supervisor_sha``, ``health``
(the status code of ``/health``, or None), ``metrics`` (``/metrics`` text when asked) and
``log_size`` (where this start's log begins) and ``proven_env`` (release -> sha of the env file copy
its last proven start left, ``proven.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ops.api.changes import Fact, StepFailed
from ops.layout import HostLayout
from ops.service.command import system_of, system_venv
from ops.service.releases import layout_fact
from ops.service.remote import script
from ops.service.settings import serve_url
from ops.shell import join

if TYPE_CHECKING:
    from ops.connection import CommandResult, Connection


def parse_json_line(what: str) -> Callable[[CommandResult], Any]:
    """A parser of a host script's last stdout line as JSON; no JSON is a StepFailed naming ``what``."""

    def parse(result: CommandResult) -> Any:
        try:
            return json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise StepFailed(
                f"{what} printed no result (is python3 installed on the host?)",
                command=result.command.split(" -c ", 1)[0] + " -c <script>",
                stderr=result.stderr,
            ) from None

    return parse


INCLUDES = {  # helpers a script's text is prefixed with
    "wait": ("sockets", "apikey"),
    "port": ("sockets",),
    "probe": ("apikey",),
    "accept": ("apikey",),
}


def run_script(name: str, spec: Any) -> str:
    """The command that runs ``remote/<name>.py`` (after its helpers) with the host's python3 and
    one argument."""
    text = "\n".join(script(part) for part in (*INCLUDES.get(name, ()), name))
    return join(["python3", "-c", text, spec if isinstance(spec, str) else json.dumps(spec)])


def service_fact(args: dict[str, Any], *, metrics: bool = False) -> Fact[dict[str, Any]]:
    layout = HostLayout(args["base"], args["name"])
    url = serve_url(args["serve"])
    spec = {
        "venv": system_venv(args),
        "packages": list(system_of(args).packages),
        "acceptance": layout.acceptance(),
        "name": args["name"],
        "pidfile": layout.pidfile(),
        "state": layout.state(),
        "log": layout.log(),
        "env_file": args.get("env_file") or "",
        "proven": layout.proven,
        "auth_env": args.get("env_file") or layout.env_file,  # its API key, for /health and /metrics
        "supervisor": layout.supervisor,
        "health": url + "/health",
        "metrics": url + "/metrics" if metrics else "",
    }
    return Fact(run_script("probe", spec), parse_json_line("the service probe"))


def gather(conn: Connection, args: dict[str, Any], *, metrics: bool = False) -> dict[str, Any]:
    return {
        "layout": layout_fact(args["base"]).gather(conn),
        "service": service_fact(args, metrics=metrics).gather(conn, timeout=60),
    }
