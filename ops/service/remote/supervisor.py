"""The built-in process supervisor, for hosts where specops may not use systemd.

This file is copied to ``<base>/bin/specops-supervisor.py`` and run there by the host's
``python3``, so it uses the standard library only and imports nothing from specops.

- ``start --pidfile P --log L --cwd D [--env-file E] [--setenv K=V ...] -- ARGV...`` starts a
  monitor in its own session, which starts ARGV in another new session (setsid: both outlive the
  SSH session; the server gets its own process group), stdin from /dev/null, stdout and stderr
  appended to L, its soft open-file limit raised to the hard one. The environment file's ``KEY=VALUE`` lines (secrets live there, mode 0600) go into
  the process environment, never onto a command line. It refuses to start while the pidfile names
  a live process, and prints ``{"pid": N}`` (the server's pid, which the pidfile holds).
- The monitor restarts the server when it dies with a non-zero status or a signal (SIGKILL, the
  OOM killer), after a backoff that doubles from ``--restart-backoff`` seconds up to 30; once it
  has restarted ``--crash-limit`` times within ``--crash-window`` seconds it stops restarting and
  records a crash loop. Its state, ``{"state": "running" | "crash-loop" | "exited", "pid",
  "restarts", "last_exit", "updated"}``, is in ``P`` with ``.status`` for ``.pid``; its own pid is
  in ``P`` with ``.monitor.pid``.
- ``stop --pidfile P [--timeout S]`` ends the monitor first (so nothing restarts), then sends TERM
  to the server's process group, waits up to S seconds, then KILL; a pidfile whose pid is gone,
  unreadable or no longer a session leader (a reused pid) is just removed. It prints
  ``{"stopped": N | null, "signal": "TERM" | "KILL" | null}``.

Exit status: 0 done, 2 usage, 3 refused (already running, unreadable environment file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

POLL_S = 0.1
BACKOFF_CAP_S = 30.0


def companion(pidfile: str, suffix: str) -> str:
    """``svc.pid`` -> ``svc<suffix>`` (``.monitor.pid``, ``.status``)."""
    return (pidfile[:-4] if pidfile.endswith(".pid") else pidfile) + suffix


def read_pid(pidfile: str) -> int | None:
    try:
        with open(pidfile) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def is_running(pid: int) -> bool:
    """True for a live process (a zombie no one has reaped yet is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def is_ours(pid: int) -> bool:
    """We start every service as a session leader; a reused pid almost never is one."""
    try:
        return os.getsid(pid) == pid
    except OSError:
        return False


def read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd's EnvironmentFile reads them: comments, blanks and quotes."""
    env = {}
    with open(path) as fh:
        for number, raw in enumerate(fh, 1):
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip().isidentifier():
                raise ValueError(f"{path}:{number}: expected KEY=VALUE")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[key.strip()] = value
    return env


def write_pidfile(pidfile: str, pid: int) -> None:
    tmp = f"{pidfile}.tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{pid}\n")
    os.replace(tmp, pidfile)


def start(args: argparse.Namespace) -> int:
    old = read_pid(args.pidfile)
    if old is not None and is_running(old) and is_ours(old):
        print(f"refused: pid {old} from {args.pidfile} is still running (stop it first)", file=sys.stderr)
        return 3
    try:
        if args.env_file:
            read_env_file(args.env_file)
    except (OSError, ValueError) as exc:
        print(f"refused: environment file: {exc}", file=sys.stderr)
        return 3
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.pidfile)
    monitor = [
        sys.executable,
        os.path.abspath(__file__),
        "monitor",
        "--pidfile",
        args.pidfile,
        "--log",
        args.log,
        "--cwd",
        args.cwd,
        "--restart-backoff",
        str(args.restart_backoff),
        "--crash-limit",
        str(args.crash_limit),
        "--crash-window",
        str(args.crash_window),
    ]
    monitor += ["--env-file", args.env_file] if args.env_file else []
    for item in args.setenv:
        monitor += ["--setenv", item]
    with open(args.log, "ab") as log:
        subprocess.Popen(
            [*monitor, "--", *args.argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + 30
    while (pid := read_pid(args.pidfile)) is None:
        if time.monotonic() > deadline:
            print(f"refused: the monitor did not start the server (see {args.log})", file=sys.stderr)
            return 3
        time.sleep(POLL_S)
    print(json.dumps({"pid": pid}))
    return 0


def write_status(args: argparse.Namespace, **state: object) -> None:
    state["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    path = companion(args.pidfile, ".status")
    with open(f"{path}.tmp", "w") as fh:
        json.dump(state, fh)
    os.replace(f"{path}.tmp", path)


def launch(args: argparse.Namespace, env: dict[str, str], log) -> subprocess.Popen:
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    log.write(f"--- specops-supervisor: start {stamp} in {args.cwd}\n".encode())
    log.flush()
    proc = subprocess.Popen(
        args.argv,
        cwd=args.cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )
    write_pidfile(args.pidfile, proc.pid)
    return proc


def raise_open_files() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (the server inherits it): a login's soft limit is
    often 1024, which a thousand client connections use up."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def monitor(args: argparse.Namespace) -> int:
    """Run the server; restart it when it crashes, until a crash loop or a stop."""
    raise_open_files()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    write_pidfile(companion(args.pidfile, ".monitor.pid"), os.getpid())
    env = dict(os.environ, **(read_env_file(args.env_file) if args.env_file else {}))
    env.update(item.partition("=")[::2] for item in args.setenv)
    crashes: list[float] = []
    code = None
    with open(args.log, "ab") as log:
        while True:
            proc = launch(args, env, log)
            write_status(args, state="running", pid=proc.pid, restarts=len(crashes), last_exit=code)
            while (code := proc.poll()) is None and not stopping:  # polled: a TERM must end the wait
                time.sleep(POLL_S)
            if stopping:  # `stop` ends the server itself, with its own timeout
                return 0
            if code == 0:
                write_status(args, state="exited", pid=None, restarts=len(crashes), last_exit=code)
                return 0
            now = time.monotonic()
            crashes = [t for t in crashes if now - t < args.crash_window] + [now]
            if len(crashes) > args.crash_limit:
                log.write(
                    f"--- specops-supervisor: crash loop: exit {code}, {len(crashes) - 1} restarts in "
                    f"{args.crash_window:g}s; not restarting\n".encode()
                )
                write_status(args, state="crash-loop", pid=None, restarts=len(crashes) - 1, last_exit=code)
                return 1
            delay = min(args.restart_backoff * 2 ** (len(crashes) - 1), BACKOFF_CAP_S)
            log.write(
                f"--- specops-supervisor: pid {proc.pid} exited with {code}; restart in {delay:g}s\n".encode()
            )
            log.flush()
            write_status(args, state="restarting", pid=None, restarts=len(crashes), last_exit=code)
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and not stopping:
                time.sleep(POLL_S)
            if stopping:
                return 0


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while is_running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def stop_monitor(pidfile: str) -> None:
    """End the monitor (it exits without touching the server), so nothing restarts what we stop."""
    monitor_pidfile = companion(pidfile, ".monitor.pid")
    pid = read_pid(monitor_pidfile)
    if pid is not None and is_running(pid) and is_ours(pid):
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, 10.0):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 10.0)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(monitor_pidfile)


def stop(args: argparse.Namespace) -> int:
    stop_monitor(args.pidfile)
    pid = read_pid(args.pidfile)
    outcome: dict[str, object] = {"stopped": None, "signal": None}
    if pid is not None and is_running(pid) and is_ours(pid):
        outcome = {"stopped": pid, "signal": "TERM"}
        os.killpg(pid, signal.SIGTERM)
        if not _wait_gone(pid, args.timeout):
            outcome["signal"] = "KILL"
            os.killpg(pid, signal.SIGKILL)
            _wait_gone(pid, 10.0)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.pidfile)
    print(json.dumps(outcome))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specops-supervisor")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("start", "monitor"):
        p_start = sub.add_parser(name)
        p_start.add_argument("--pidfile", required=True)
        p_start.add_argument("--log", required=True)
        p_start.add_argument("--cwd", required=True)
        p_start.add_argument("--env-file")
        p_start.add_argument("--setenv", action="append", default=[], metavar="KEY=VALUE")
        p_start.add_argument("--restart-backoff", type=float, default=1.0, help="first restart delay (s)")
        p_start.add_argument("--crash-limit", type=int, default=5, help="restarts within the window")
        p_start.add_argument("--crash-window", type=float, default=300.0, help="seconds")
        p_start.add_argument("argv", nargs="+")
    p_stop = sub.add_parser("stop")
    p_stop.add_argument("--pidfile", required=True)
    p_stop.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    return {"start": start, "monitor": monitor, "stop": stop}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
