"""Service steps: ``service`` (run a release, prove it answers, roll back if not) and ``service_status``.

``service`` takes a host from any state to "the DDTree server answers on release R": it points
``<base>/current`` at R, (re)starts the server only when the release, the environment file or the
unit changed (or it is down or unhealthy), then waits for ``/health`` and one real completion.
Before it stops a running release for a new one, the new one must pass a start check (``serve
--help`` imports it): a release that cannot even import is refused while the old one keeps
serving. If R starts but does not answer within the timeout, the step switches back to the
release that ran before, restarts it, confirms it answers, and fails with R's log tail.
``release: previous`` is ``fab rollback``. One GPU holds one model, so a restart is a short gap
in service; there is no second copy running side by side.

Two real backends, chosen per host (``backend: auto`` = systemd when usable):

- systemd: a unit rendered from ``templates/specops-ddtree.service.j2`` (system scope as root,
  user scope with a user bus otherwise), ``EnvironmentFile=`` for the 0600 environment file;
- the built-in supervisor, ``ops/supervisor.py`` copied to ``<base>/bin/`` (setsid, pidfile,
  log file, TERM then KILL), which loads the same environment file into the process.

Either way the server runs in ``<base>/releases/<id>`` with ``PYTHONPATH=<that>/site`` (it keeps
its release even when ``current`` moves), logs to ``<base>/logs/<name>.log``, and a state file
``<base>/run/<name>.state`` records the fingerprint of what was started, which is how a second
deploy knows that nothing changed and keeps the same pid. Secrets stay in the environment file:
the server's command line holds paths and numbers only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.shell import join
from ops.steps.base import (
    Applied,
    Arg,
    Fact,
    Plan,
    Run,
    Step,
    StepContext,
    StepFailed,
    Write,
    arguments,
    check_result,
    register,
)
from ops.steps.files import render_template
from ops.steps.release import layout_fact, release_dir, switch_commands

if TYPE_CHECKING:
    from ops.connection import CommandResult, Connection

SERVICE = "specops-ddtree"
SUPERVISOR_SOURCE = Path(__file__).resolve().parent.parent / "supervisor.py"
UNIT_TEMPLATE = "specops-ddtree.service.j2"
LOG_TAIL_LINES = 40
SERVE_DEFAULTS = {"host": "127.0.0.1", "port": 8000, "mode": "ddtree", "budget": 64}
SERVE_KEYS = {
    "host": str,
    "port": int,
    "mode": str,
    "budget": int,
    "dtype": str,
    "device": str,
    "max_context": int,
}
SERVE_FOREIGN = {"num_speculative_tokens"}  # read by the drafter lint, not by our server
MODES = ("ar", "dflash", "ddtree")
BACKENDS = ("auto", "systemd", "supervisor")


def serve_arg(value: Any) -> dict[str, Any]:
    """The inventory's ``serve`` mapping, with known keys type-checked and typos refused."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping like {{port: 8000, mode: ddtree}}, got {value!r}")
    clean: dict[str, Any] = {}
    for key, raw in value.items():
        if key in SERVE_FOREIGN:
            continue
        if key not in SERVE_KEYS:
            raise ValueError(f"unknown serve key '{key}' (known: {', '.join(sorted(SERVE_KEYS))})")
        kind = SERVE_KEYS[key]
        try:
            clean[key] = kind(str(raw).strip()) if kind is int and not isinstance(raw, bool) else kind(raw)
        except ValueError:
            raise ValueError(f"serve.{key}: expected {kind.__name__}, got {raw!r}") from None
    if "mode" in clean and clean["mode"] not in MODES:
        raise ValueError(f"serve.mode: expected one of {', '.join(MODES)}, got {clean['mode']!r}")
    if "port" in clean and not 0 < clean["port"] < 65536:
        raise ValueError(f"serve.port: expected 1-65535, got {clean['port']}")
    return clean


def backend_arg(value: Any) -> str:
    if value not in BACKENDS:
        raise ValueError(f"expected one of {', '.join(BACKENDS)}, got {value!r}")
    return value


# ---------------------------------------------------------------- host-side facts
# argv[1]: JSON {name, base, pidfile, state, log, env_file, supervisor, health, metrics}
_PROBE = r"""
import hashlib, json, os, shutil, subprocess, sys, urllib.error, urllib.request
s = json.loads(sys.argv[1])
def sha(path):
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None
def process(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            up = float(fh.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    if fields[0] == "Z":
        return None
    try:
        cwd = os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        cwd = None
    return {"pid": pid, "uptime_s": round(up - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 1), "cwd": cwd}
def get(url, limit):
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status, r.read(limit).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except Exception as exc:
        return None, "%s: %s" % (type(exc).__name__, exc)
try:
    with open(s["pidfile"]) as fh:
        sup = process(int(fh.read().strip()))
except (OSError, ValueError):
    sup = None
uid = os.getuid()
home = os.path.expanduser("~")
systemd = {"usable": bool(os.path.isdir("/run/systemd/system") and shutil.which("systemctl")
                          and (uid == 0 or os.path.exists("/run/user/%d/bus" % uid))),
           "scope": "system" if uid == 0 else "user", "uid": uid,
           "unit_path": ("/etc/systemd/system/" if uid == 0 else home + "/.config/systemd/user/")
                        + s["name"] + ".service"}
systemd["unit_sha"] = sha(systemd["unit_path"])
systemd["process"] = None
if systemd["usable"]:
    ctl = ["systemctl"] if uid == 0 else ["systemctl", "--user"]
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/run/user/%d" % uid))
    out = subprocess.run(ctl + ["show", "-p", "ActiveState,MainPID", s["name"] + ".service"],
                         capture_output=True, text=True, env=env).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    pid = int(props.get("MainPID") or 0)
    systemd["active"] = props.get("ActiveState")
    systemd["process"] = process(pid) if pid > 0 and props.get("ActiveState") == "active" else None
try:
    with open(s["state"]) as fh:
        state = json.load(fh)
except (OSError, ValueError):
    state = None
facts = {"supervisor_process": sup, "systemd": systemd, "state": state, "env_sha": sha(s["env_file"]),
         "supervisor_sha": sha(s["supervisor"]), "health": None, "metrics": None,
         "log_size": os.path.getsize(s["log"]) if os.path.exists(s["log"]) else 0}
if sup or systemd["process"]:
    facts["health"], error = get(s["health"], 1 << 16)
    if facts["health"] is None:
        facts["health_error"] = error
    if s["metrics"]:
        status, text = get(s["metrics"], 1 << 20)
        facts["metrics"] = text if status == 200 else None
print(json.dumps(facts))
"""

# argv[1]: JSON {url, timeout, prompt, max_tokens, pidfile | (systemctl, unit)}
WAIT_SCRIPT = r"""
import json, os, subprocess, sys, time, urllib.error, urllib.request
s = json.loads(sys.argv[1])
def current_pid():
    if s.get("pidfile"):
        try:
            with open(s["pidfile"]) as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            return None
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/run/user/%d" % os.getuid()))
    out = subprocess.run(s["systemctl"] + ["show", "-p", "MainPID", "--value", s["unit"]],
                         capture_output=True, text=True, env=env).stdout.strip()
    return int(out) if out.isdigit() and int(out) > 0 else None
def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError, TypeError):
        return False
def fetch(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(s["url"] + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(1 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(1 << 16).decode("utf-8", "replace")
    except Exception as exc:
        return None, "%s: %s" % (type(exc).__name__, exc)
def done(ready, **extra):
    print(json.dumps(dict(extra, ready=ready, elapsed=round(time.monotonic() - start, 2))))
    sys.exit(0)
start = time.monotonic()
first = current_pid()
healthy = None
while True:
    pid = current_pid()
    if pid is None or not alive(pid):
        done(False, error="the server process %s exited" % (pid or first or "?"))
    if first is not None and pid != first:
        done(False, error="the server restarted (pid %s -> %s)" % (first, pid))
    status, body = fetch("/health")
    if status == 200:
        healthy = healthy or round(time.monotonic() - start, 2)
        status, body = fetch("/v1/models")
        model = None
        if status == 200:
            try:
                model = json.loads(body)["data"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError):
                done(False, error="/v1/models answered without a model id: %s" % body[:200])
            status, body = fetch("/v1/completions", {"model": model, "prompt": s["prompt"],
                                                     "max_tokens": s["max_tokens"], "temperature": 0})
            if status == 200:
                try:
                    text = json.loads(body)["choices"][0]["text"]
                except (ValueError, KeyError, IndexError, TypeError):
                    done(False, error="/v1/completions answered without choices: %s" % body[:200])
                done(True, pid=pid, healthy_after=healthy, text=text)
            if status not in (429, 503):
                done(False, error="/v1/completions answered %s: %s" % (status, body[:300]))
    if time.monotonic() - start > s["timeout"]:
        done(False, error="no healthy answer within %ss (last: %s %s)" % (s["timeout"], status, body[:200]))
    time.sleep(0.25)
"""


def parse_json_line(what: str) -> Any:
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


@dataclass(frozen=True)
class Paths:
    """Where a service keeps its files under ``<base>``."""

    base: str
    name: str

    @property
    def pidfile(self) -> str:
        return f"{self.base}/run/{self.name}.pid"

    @property
    def state(self) -> str:
        return f"{self.base}/run/{self.name}.state"

    @property
    def log(self) -> str:
        return f"{self.base}/logs/{self.name}.log"

    @property
    def supervisor(self) -> str:
        return f"{self.base}/bin/specops-supervisor.py"


def serve_url(serve: dict[str, Any]) -> str:
    host = serve.get("host", SERVE_DEFAULTS["host"])
    host = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    return f"http://{host}:{serve.get('port', SERVE_DEFAULTS['port'])}"


def service_fact(args: dict[str, Any], *, metrics: bool = False) -> Fact[dict[str, Any]]:
    paths = Paths(args["base"], args["name"])
    url = serve_url(args["serve"])
    spec = {
        "name": args["name"],
        "pidfile": paths.pidfile,
        "state": paths.state,
        "log": paths.log,
        "env_file": args.get("env_file") or "",
        "supervisor": paths.supervisor,
        "health": url + "/health",
        "metrics": url + "/metrics" if metrics else "",
    }
    return Fact(join(["python3", "-c", _PROBE, json.dumps(spec)]), parse_json_line("the service probe"))


def gather(conn: Connection, args: dict[str, Any], *, metrics: bool = False) -> dict[str, Any]:
    return {
        "layout": layout_fact(args["base"]).gather(conn),
        "service": service_fact(args, metrics=metrics).gather(conn, timeout=60),
    }


# ---------------------------------------------------------------- plan
class Wait(Run):
    """The change that polls /health and one completion; apply reads its JSON answer."""

    def describe(self) -> str:
        return f"run: python3 -c <wait for /health and one completion>  # {self.why}"


class Preflight(Run):
    """``serve --help`` on the new release before anything stops: a release that cannot even
    import is refused while the running one keeps serving (no rollback needed)."""


class ServiceFailed(StepFailed):
    """A failure while applying; ``touched``: the switch, stop or start had begun (roll back)."""

    def __init__(self, cause: StepFailed, touched: bool) -> None:
        super().__init__(str(cause), command=cause.command, stderr=cause.stderr)
        self.touched = touched


def choose_backend(wanted: str, systemd: dict[str, Any]) -> str:
    if wanted == "systemd" and not systemd["usable"]:
        raise StepFailed(
            "backend systemd asked for, but systemd is not usable on this host (PID 1 is not "
            "systemd, or no user bus for a non-root user): set service_backend: supervisor"
        )
    if wanted == "auto":
        return "systemd" if systemd["usable"] else "supervisor"
    return wanted


def serve_argv(args: dict[str, Any], ctx: StepContext) -> list[str]:
    """The server's command line: paths and numbers only. Secrets, and any other ``SPECOPS_SERVE_*``
    setting (temperature, queue size, ...), are in the environment file the server reads."""
    serve = {**SERVE_DEFAULTS, **args["serve"]}
    cpu = ctx.vars.get("profile") == "cpu"
    device = serve.get("device") or ("cpu" if cpu else "cuda")
    dtype = serve.get("dtype") or ("float32" if device == "cpu" else "bfloat16")
    flags = {
        "--target": args["target"],
        "--drafter": args["drafter"],
        "--mode": serve["mode"],
        "--budget": serve["budget"],
        "--host": serve["host"],
        "--port": serve["port"],
        "--device": device,
        "--dtype": dtype,
        "--env-file": args["env_file"],
    }
    argv = [f"{args['venv']}/bin/python", "-m", "ddtree_runtime", "serve"]
    for flag, value in flags.items():
        argv += [flag, str(value)]
    if serve.get("max_context"):
        argv += ["--max-context", str(serve["max_context"])]
    return argv


def launch(args: dict[str, Any], ctx: StepContext, release: str) -> dict[str, Any]:
    """Everything that, when it changes, needs a restart (with the env file's checksum)."""
    where = release_dir(args["base"], release)
    return {
        "argv": serve_argv(args, ctx),
        "cwd": where,
        "env_file": args["env_file"],
        "env": {"PYTHONPATH": f"{where}/site", "SPECOPS_RELEASE": release},
    }


def unit_text(
    args: dict[str, Any], ctx: StepContext, spec: dict[str, Any], release: str, scope: str
) -> bytes:
    paths = Paths(args["base"], args["name"])
    return render_template(
        UNIT_TEMPLATE,
        {
            "service": args["name"],
            "release": release,
            "scope": scope,
            "exec_start": join(spec["argv"]),
            "cwd": spec["cwd"],
            "environment": spec["env"],
            "env_file": spec["env_file"],
            "log": paths.log,
            "stop_timeout": int(args["stop_timeout"]),
        },
        ctx,
    )


def systemctl(systemd: dict[str, Any], *words: str) -> str:
    if systemd["scope"] == "system":
        return join(["systemctl", *words])
    return join(["env", f"XDG_RUNTIME_DIR=/run/user/{systemd['uid']}", "systemctl", "--user", *words])


_UNSET: Any = object()


def plan_service(
    facts: dict[str, Any],
    args: dict[str, Any],
    ctx: StepContext,
    previous: Any = _UNSET,
    preflight: bool = True,
) -> Plan:
    """Pure. ``previous`` overrides where ``<base>/previous`` ends up, and ``preflight`` False skips
    the start check (the automatic rollback goes back to a release that just ran)."""
    layout, svc = facts["layout"], facts["service"]
    paths = Paths(args["base"], args["name"])
    if args["release"] == "previous":
        wanted = layout["previous"]
        if wanted is None:
            raise StepFailed(
                f"no previous release under {args['base']} to go back to (fix: deploy first; "
                "a rollback needs two releases)"
            )
    else:
        wanted = args["release"]
    if wanted not in layout["releases"] and ctx.check:  # --check: the release step only planned it
        layout = {**layout, "releases": {**layout["releases"], wanted: 0}}
    if wanted not in layout["releases"]:
        raise StepFailed(
            f"release {wanted} is not complete under {args['base']}/releases (fix: run fab deploy)"
        )
    current = layout["current"]
    if previous is _UNSET:
        previous = current if current != wanted else layout["previous"]
    backend = choose_backend(args["backend"], svc["systemd"])
    spec = launch(args, ctx, wanted)
    if not svc["env_sha"] and not ctx.check:  # under --check the template step only planned it
        raise StepFailed(f"environment file {args['env_file']} is missing (fix: render it before this step)")
    fingerprint = {"launch": spec, "env_sha": svc["env_sha"], "backend": backend}
    systemd = svc["systemd"]
    definition: list[Run | Write] = []
    if backend == "systemd":
        unit = unit_text(args, ctx, spec, wanted, systemd["scope"])
        fingerprint["unit_sha"] = hashlib.sha256(unit).hexdigest()
        if systemd["unit_sha"] != fingerprint["unit_sha"]:
            definition += [
                Write(
                    systemd["unit_path"],
                    unit,
                    "0644",
                    f"{systemd['unit_path']}: unit for {wanted}\n",
                    why="unit",
                ),
                Run(systemctl(systemd, "daemon-reload"), why="unit changed"),
                Run(systemctl(systemd, "enable", f"{args['name']}.service"), why="start at boot"),
            ]
        process = systemd["process"]
    else:
        source = SUPERVISOR_SOURCE.read_bytes()
        if svc["supervisor_sha"] != hashlib.sha256(source).hexdigest():
            definition.append(
                Write(
                    paths.supervisor,
                    source,
                    "0755",
                    f"{paths.supervisor}: supervisor script\n",
                    why="supervisor",
                )
            )
        process = svc["supervisor_process"]
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    state = svc["state"] or {}
    reasons = []
    if current != wanted:
        reasons.append(f"current {current or 'none'} -> {wanted}")
    if process is None:
        reasons.append("not running")
    elif state.get("fingerprint") != digest:
        reasons.append("release, environment file or unit changed")
    elif svc["health"] != 200:
        reasons.append(f"running but /health answers {svc['health'] or svc.get('health_error')}")
    data = {"release": wanted, "previous": previous, "backend": backend, "url": serve_url(args["serve"])}
    if not reasons:
        pid = process["pid"]
        message = f"release {wanted} running (pid {pid}, up {process['uptime_s']:g}s), /health 200"
        if definition:
            return Plan.of(definition, message + "; update the service definition", pid=pid, **data)
        return Plan.noop(message, pid=pid, **data)

    # What to go back to if `wanted` fails: what `current` named, else (a re-run after a cut link
    # left `current` switched but unproven) the release that last answered.
    proven = state.get("release")
    rollback_to = current if current != wanted else proven if proven != wanted else None
    rollback_to = rollback_to if rollback_to in layout["releases"] else None
    changes = list(definition)
    if preflight and rollback_to is not None:
        check = join(["env", f"PYTHONPATH={spec['env']['PYTHONPATH']}", *spec["argv"][:4], "--help"])
        changes.append(
            Preflight(
                f"cd {join([spec['cwd']])} && {check} >/dev/null",
                timeout=300,
                why="the new release imports and parses its flags",
            )
        )
    first_disruptive = len(changes)
    if current != wanted or layout["previous"] != previous:
        changes += switch_commands(args["base"], wanted, previous)
    supervisor = ["python3", paths.supervisor]
    stop = join([*supervisor, "stop", "--pidfile", paths.pidfile, "--timeout", f"{args['stop_timeout']:g}"])
    if backend == "systemd":
        if svc["supervisor_process"]:
            changes.append(Run(stop, why="the supervisor ran it before"))
        changes.append(Run(systemctl(systemd, "restart", f"{args['name']}.service"), why="start"))
        wait_on: dict[str, Any] = {
            "systemctl": ["systemctl"] if systemd["scope"] == "system" else ["systemctl", "--user"],
            "unit": f"{args['name']}.service",
        }
    else:
        if systemd["process"]:
            changes.append(
                Run(
                    systemctl(systemd, "disable", "--now", f"{args['name']}.service"),
                    why="systemd ran it before",
                )
            )
        changes.append(Run(stop, why="TERM, then KILL after the stop timeout"))
        start = [
            *supervisor,
            "start",
            "--pidfile",
            paths.pidfile,
            "--log",
            paths.log,
            "--cwd",
            spec["cwd"],
            "--env-file",
            args["env_file"],
        ]
        for key, value in spec["env"].items():
            start += ["--setenv", f"{key}={value}"]
        changes.append(Run(join([*start, "--", *spec["argv"]]), why="start"))
        wait_on = {"pidfile": paths.pidfile}
    wait = {
        "url": data["url"],
        "timeout": args["timeout"],
        "prompt": args["prompt"],
        "max_tokens": 4,
        **wait_on,
    }
    changes.append(
        Wait(
            join(["python3", "-c", WAIT_SCRIPT, json.dumps(wait)]),
            timeout=args["timeout"] + 60,
            why=f"/health and one completion within {args['timeout']:g}s",
        )
    )
    record = {"release": wanted, "fingerprint": digest, "backend": backend}
    changes.append(
        Write(paths.state, (json.dumps(record, indent=1) + "\n").encode(), "0644", why="what runs")
    )
    data.update(
        first_disruptive=first_disruptive,
        rollback_to=rollback_to,
        previous_before=layout["previous"],
        log_size=svc["log_size"],
        log=paths.log,
        args=args,
    )
    return Plan.of(changes, f"restart on release {wanted}: {'; '.join(reasons)}", **data)


# ---------------------------------------------------------------- apply
def execute_plan(conn: Connection, plan: Plan) -> dict[str, Any]:
    """Run a service plan's changes in order; the Wait's answer is returned, a failure raised as
    ServiceFailed saying whether the server had been touched (switch, stop or start) by then."""
    answer: dict[str, Any] = {}
    first_disruptive = plan.data.get("first_disruptive", 0)
    for index, change in enumerate(plan.changes):
        try:
            if isinstance(change, Wait):
                answer = parse_json_line("the health wait")(conn.run(change.command, timeout=change.timeout))
                if not answer["ready"]:
                    raise StepFailed(answer["error"])
            elif isinstance(change, Run):
                check_result(conn.run(change.command, sudo=change.sudo, timeout=change.timeout))
            else:
                conn.write_bytes(change.path, change.data, int(change.mode, 8) if change.mode else None)
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


@register
class Service(Step):
    name = "service"
    summary = "the server running a release and answering, with automatic rollback"
    args = arguments(
        base=Arg(str, required=True, help="the host's base directory"),
        release=Arg(str, required=True, help="release id to run, or 'previous' to go back one release"),
        venv=Arg(str, required=True, help="the host venv whose python runs the server"),
        target=Arg(str, required=True, help="target checkpoint directory on the host"),
        drafter=Arg(str, required=True, help="drafter checkpoint directory on the host"),
        env_file=Arg(str, required=True, help="the 0600 environment file (secrets live there)"),
        serve=Arg(
            serve_arg,
            default={},
            help="inventory serve vars: host, port, mode, budget, dtype, device, max_context",
        ),
        name=Arg(str, default=SERVICE, help="service (unit) name"),
        backend=Arg(backend_arg, default="auto", help="auto | systemd | supervisor"),
        timeout=Arg(float, default=300.0, help="seconds for /health and one completion"),
        stop_timeout=Arg(float, default=30.0, help="seconds between TERM and KILL"),
        prompt=Arg(str, default="the", help="prompt of the proving completion"),
    )

    def probe(self, conn, args, ctx):
        return gather(conn, args)

    def plan(self, facts, args, ctx):
        return plan_service(facts, args, ctx)

    def apply(self, conn, plan, ctx):
        data = plan.data
        if "args" not in data:  # only the service definition changed
            execute_plan(conn, plan)
            return Applied(True, plan.reason, dict(plan.data))
        try:
            answer = execute_plan(conn, plan)
        except ServiceFailed as exc:
            if not exc.touched:
                kept = (
                    f"; release {data['rollback_to']} keeps running untouched" if data["rollback_to"] else ""
                )
                raise StepFailed(
                    f"release {data['release']} refused before any restart: {exc}{kept}",
                    command=exc.command,
                    stderr=exc.stderr,
                ) from None
            self._roll_back(conn, plan, ctx, exc)
        message = (
            f"release {data['release']} answers at {data['url']} (pid {answer['pid']}, /health after "
            f"{answer['healthy_after']}s, completion {answer['text']!r})"
        )
        return Applied(
            True,
            message,
            {k: data[k] for k in ("release", "previous", "backend", "url")} | {"pid": answer["pid"]},
        )

    def _roll_back(self, conn: Connection, plan: Plan, ctx: StepContext, failure: StepFailed) -> None:
        """Back to the release that ran before; always raises, with the failed release's log tail."""
        data = plan.data
        tail = log_tail(conn, data["log"], data["log_size"])
        if failure.stderr:
            tail = f"{failure.command or ''}\n{failure.stderr}\n--- log ---\n{tail}".lstrip()
        bad, old = data["release"], data["rollback_to"]
        if old is None:
            raise StepFailed(
                f"release {bad} did not answer ({failure}); no earlier release to roll back to", stderr=tail
            )
        args = {**data["args"], "release": old}
        try:
            back = plan_service(
                gather(conn, args), args, ctx, previous=data["previous_before"], preflight=False
            )
            answer = execute_plan(conn, back) if back.will_change else {"pid": back.data.get("pid")}
        except StepFailed as again:
            raise StepFailed(
                f"release {bad} did not answer ({failure}); rolling back to {old} failed too: {again}",
                stderr=tail,
            ) from None
        raise StepFailed(
            f"release {bad} did not answer ({failure}); rolled back to {old}, which answers "
            f"again (pid {answer.get('pid')})",
            stderr=tail,
        )


# ---------------------------------------------------------------- service_status
METRICS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:request_success": "requests",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}


def parse_metrics(text: str) -> dict[str, float]:
    """Pure: the few counters ``fab status`` shows, summed over labels, plus the mean acceptance length."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line.split(" ", 1)[0] else line.partition(" ")
        key = METRICS.get(name.removesuffix("_total"))
        if key is None:
            continue
        try:
            found[key] = found.get(key, 0.0) + float(rest.rsplit(" ", 1)[-1])
        except ValueError:
            continue
    if found.get("drafts"):
        found["mean_acceptance_length"] = round(1 + found.get("accepted_tokens", 0.0) / found["drafts"], 3)
    return found


def status_summary(facts: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """Pure: what ``fab status`` shows for one host."""
    layout, svc = facts["layout"], facts["service"]
    backend = "systemd" if svc["systemd"]["process"] else "supervisor" if svc["supervisor_process"] else None
    process = svc["systemd"]["process"] or svc["supervisor_process"]
    return {
        "release": layout["current"],
        "previous": layout["previous"],
        "releases": sorted(layout["releases"], key=lambda r: layout["releases"][r]),
        "backend": backend,
        "unit": f"{args['name']}.service" if backend == "systemd" else None,
        "pid": process["pid"] if process else None,
        "running_release": process["cwd"].rstrip("/").rsplit("/", 1)[-1]
        if process and process["cwd"]
        else None,
        "uptime_s": process["uptime_s"] if process else None,
        "health": svc["health"],
        "url": serve_url(args["serve"]),
        "metrics": parse_metrics(svc["metrics"]) if svc["metrics"] else {},
    }


@register
class ServiceStatus(Step):
    name = "service_status"
    summary = "release, pid/unit, health, uptime and last metrics of the server (read-only)"
    args = arguments(
        base=Arg(str, required=True, help="the host's base directory"),
        serve=Arg(serve_arg, default={}, help="inventory serve vars (host and port are used)"),
        name=Arg(str, default=SERVICE, help="service (unit) name"),
    )

    def probe(self, conn, args, ctx):
        return gather(conn, {**args, "env_file": ""}, metrics=True)

    def plan(self, facts, args, ctx):
        info = status_summary(facts, args)
        if info["pid"] is None:
            state = "not running"
        else:
            where = info["unit"] or "supervisor"
            state = f"pid {info['pid']} ({where}), up {info['uptime_s']:g}s, /health {info['health']}"
        m = info["metrics"]
        extra = (
            f", {m.get('requests', 0):g} requests, acceptance length {m['mean_acceptance_length']}"
            if "mean_acceptance_length" in m
            else ""
        )
        return Plan.noop(f"release {info['release'] or 'none'}: {state}{extra}", **info)
