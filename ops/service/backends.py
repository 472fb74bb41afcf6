"""The two ways a server runs on a host, with the same verbs: install, start, stop, wait.

- :class:`Systemd`: a unit rendered from ``templates/specops-ddtree.service.j2`` (system scope as
  root, user scope with a user bus otherwise), ``EnvironmentFile=`` for the 0600 environment file.
- :class:`Supervisor`: ``remote/supervisor.py`` copied to ``<base>/bin/`` (setsid, pidfile, log
  file, TERM then KILL), which loads the same environment file into the process. ``fab bench``
  also starts vLLM and SGLang under it, each with its own pidfile and log.

Every verb returns changes (``ops.api.changes``) for a plan to list; none of them runs anything.
``hand_over`` stops the server when the *other* backend ran it before, so a host can move from one
backend to the other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ops.api.changes import Run, StepFailed, Write
from ops.layout import HostLayout
from ops.service.facts import parse_json_line, run_script
from ops.service.remote import HERE as REMOTE_DIR
from ops.shell import join

if TYPE_CHECKING:
    from ops.connection import Connection

SUPERVISOR_SOURCE = REMOTE_DIR / "supervisor.py"


class Wait(Run):
    """The change that polls /health and one completion (``remote/wait.py``); applying it returns
    the script's answer, or raises StepFailed with its error."""

    def describe(self) -> str:
        return f"run: python3 -c <wait for /health and one completion>  # {self.why}"

    def apply(self, conn: Connection) -> dict[str, Any]:
        answer = parse_json_line("the health wait")(conn.run(self.command, timeout=self.timeout))
        if not answer["ready"]:
            raise StepFailed(answer["error"])
        return answer


class Preflight(Run):
    """``serve --help`` on the new release before anything stops: a release that cannot even
    import is refused while the running one keeps serving (no rollback needed)."""


class Installed(Run):
    """Before a vLLM or SGLang server is (re)started: its executable is in its venv."""

    def apply(self, conn: Connection) -> None:
        if not conn.run(self.command, timeout=self.timeout).ok:
            raise StepFailed(self.why)


def installed(executable: str, system: str) -> Installed:
    return Installed(
        join(["test", "-x", executable]),
        timeout=60,
        why=f"{executable} is missing: {system} is not installed there (fix: list {system} in the "
        "host's systems and run fab provision, or set serve.venv to the venv that has it)",
    )


class PortCheck(Run):
    """Before a running server stops: the port the new one binds is free, or the running one's."""

    def describe(self) -> str:
        return f"run: python3 -c <the port is free or ours>  # {self.why}"

    def apply(self, conn: Connection) -> None:
        answer = parse_json_line("the port check")(conn.run(self.command, timeout=self.timeout))
        if not answer["ok"]:
            raise StepFailed(answer["error"])


def port_check(port: int, pid: int | None) -> PortCheck:
    return PortCheck(
        run_script("port", {"port": port, "pid": pid}),
        timeout=60,
        why=f"port {port} is free or held by the running server",
    )


def wait(url: str, timeout: float, prompt: str, on: dict[str, Any], env_file: str | None = None) -> Wait:
    """A Wait on ``url``; ``on`` says how the script finds the pid (a pidfile, or the unit), and
    ``env_file`` holds the server's API key, if it has one."""
    spec = {"url": url, "timeout": timeout, "prompt": prompt, "max_tokens": 4, **on, "env_file": env_file}
    return Wait(
        run_script("wait", spec), timeout=timeout + 60, why=f"/health and one completion within {timeout:g}s"
    )


def choose_backend(wanted: str, systemd: dict[str, Any]) -> str:
    if wanted == "systemd" and not systemd["usable"]:
        raise StepFailed(
            "backend systemd asked for, but systemd is not usable on this host (PID 1 is not "
            "systemd, or no user bus for a non-root user): set service_backend: supervisor"
        )
    if wanted == "auto":
        return "systemd" if systemd["usable"] else "supervisor"
    return wanted


@dataclass(frozen=True)
class Supervisor:
    """The built-in supervisor for the service ``layout.service``."""

    layout: HostLayout
    name = "supervisor"

    @property
    def pidfile(self) -> str:
        return self.layout.pidfile()

    @property
    def log(self) -> str:
        return self.layout.log()

    def process(self, svc: dict[str, Any]) -> dict[str, Any] | None:
        return svc["supervisor_process"]

    def install(self, svc: dict[str, Any]) -> list[Write]:
        """The supervisor script, uploaded when the host's copy differs."""
        source = SUPERVISOR_SOURCE.read_bytes()
        if svc["supervisor_sha"] == hashlib.sha256(source).hexdigest():
            return []
        path = self.layout.supervisor
        return [Write(path, source, "0755", f"{path}: supervisor script\n", why="supervisor")]

    def stop(self, timeout: float | None = None, why: str = "") -> Run:
        limit = ["--timeout", f"{timeout:g}"] if timeout is not None else []
        return Run(
            join(["python3", self.layout.supervisor, "stop", "--pidfile", self.pidfile, *limit]), why=why
        )

    def launch(
        self, cwd: str, argv: list[str], env_file: str, env: dict[str, str] | None = None, why: str = "start"
    ) -> Run:
        start = [
            "python3",
            self.layout.supervisor,
            "start",
            "--pidfile",
            self.pidfile,
            "--log",
            self.log,
            "--cwd",
            cwd,
            "--env-file",
            env_file,
        ]
        for key, value in (env or {}).items():
            start += ["--setenv", f"{key}={value}"]
        return Run(join([*start, "--", *argv]), why=why)

    def start(self, spec: dict[str, Any], stop_timeout: float) -> list[Run]:
        """Stop whatever the pidfile names (TERM, then KILL), then start ``spec``."""
        return [
            self.stop(stop_timeout, "TERM, then KILL after the stop timeout"),
            self.launch(spec["cwd"], spec["argv"], spec["env_file"], spec["env"]),
        ]

    def hand_over(self, svc: dict[str, Any], stop_timeout: float) -> list[Run]:
        return [self.stop(stop_timeout, "the supervisor ran it before")] if svc["supervisor_process"] else []

    @property
    def wait_on(self) -> dict[str, Any]:
        return {"pidfile": self.pidfile}


@dataclass(frozen=True)
class Systemd:
    """A systemd unit named after ``layout.service``, in the scope the probe found usable."""

    layout: HostLayout
    facts: dict[str, Any]  # the probe's "systemd" facts
    name = "systemd"

    @property
    def unit(self) -> str:
        return f"{self.layout.service}.service"

    def systemctl(self, *words: str) -> str:
        if self.facts["scope"] == "system":
            return join(["systemctl", *words])
        return join(["env", f"XDG_RUNTIME_DIR=/run/user/{self.facts['uid']}", "systemctl", "--user", *words])

    def process(self, svc: dict[str, Any]) -> dict[str, Any] | None:
        return svc["systemd"]["process"]

    def install(self, unit: bytes, release: str) -> list[Run | Write]:
        """The unit file, reloaded and enabled when the host's copy differs."""
        path = self.facts["unit_path"]
        if self.facts["unit_sha"] == hashlib.sha256(unit).hexdigest():
            return []
        return [
            Write(path, unit, "0644", f"{path}: unit for {release}\n", why="unit"),
            Run(self.systemctl("daemon-reload"), why="unit changed"),
            Run(self.systemctl("enable", self.unit), why="start at boot"),
        ]

    def stop(self, timeout: float | None = None, why: str = "") -> Run:
        """The unit's own TimeoutStopSec applies (``timeout`` is the supervisor's)."""
        return Run(self.systemctl("stop", self.unit), why=why)

    def start(self, spec: dict[str, Any], stop_timeout: float) -> list[Run]:
        return [Run(self.systemctl("restart", self.unit), why="start")]

    def hand_over(self, svc: dict[str, Any], stop_timeout: float) -> list[Run]:
        if not svc["systemd"]["process"]:
            return []
        return [Run(self.systemctl("disable", "--now", self.unit), why="systemd ran it before")]

    @property
    def wait_on(self) -> dict[str, Any]:
        scope = ["systemctl"] if self.facts["scope"] == "system" else ["systemctl", "--user"]
        return {"systemctl": scope, "unit": self.unit}


def stop_ours(layout: HostLayout, svc: dict[str, Any], why: str = "") -> list[Run]:
    """The commands that stop our server wherever the probe's facts ``svc`` found it running
    (systemd, the supervisor); none when it is down."""
    runs = []
    if svc["systemd"]["process"]:
        runs.append(Systemd(layout, svc["systemd"]).stop(why=why))
    if svc["supervisor_process"]:
        runs.append(Supervisor(layout).stop(why=why))
    return runs


def backends(
    layout: HostLayout, svc: dict[str, Any], wanted: str
) -> tuple[Supervisor | Systemd, Supervisor | Systemd]:
    """(the backend to run the server with, the other one) for the probe's facts ``svc``."""
    supervisor, systemd = Supervisor(layout), Systemd(layout, svc["systemd"])
    if choose_backend(wanted, svc["systemd"]) == "systemd":
        return systemd, supervisor
    return supervisor, systemd
