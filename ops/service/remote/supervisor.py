"""The built-in process supervisor, for hosts where specops may not use systemd.

This file is copied to ``<base>/bin/specops-supervisor.py`` and run there by the host's
``python3``, so it uses the standard library only and imports nothing from specops.

- ``start --pidfile P --log L --cwd D [--env-file E] [--setenv K=V ...] -- ARGV...`` starts ARGV
  in a new session (setsid: it outlives the SSH session and gets its own process group), stdin from
  /dev/null, stdout and stderr appended to L. The environment file's ``KEY=VALUE`` lines (secrets
  live there, mode 0600) go into the process environment, never onto a command line. It refuses
  to start while the pidfile names a live process, and prints ``{"pid": N}``.
- ``stop --pidfile P [--timeout S]`` sends TERM to the process group, waits up to S seconds, then
  KILL; a pidfile whose pid is gone, unreadable or no longer a session leader (a reused pid) is
  just removed. It prints ``{"stopped": N | null, "signal": "TERM" | "KILL" | null}``.

Exit status: 0 done, 2 usage, 3 refused (already running, unreadable environment file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

POLL_S = 0.1


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
    env = dict(os.environ)
    try:
        if args.env_file:
            env.update(read_env_file(args.env_file))
    except (OSError, ValueError) as exc:
        print(f"refused: environment file: {exc}", file=sys.stderr)
        return 3
    for item in args.setenv:
        key, _, value = item.partition("=")
        env[key] = value
    with open(args.log, "ab") as log:
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
    print(json.dumps({"pid": proc.pid}))
    return 0


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while is_running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def stop(args: argparse.Namespace) -> int:
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
    p_start = sub.add_parser("start")
    p_start.add_argument("--pidfile", required=True)
    p_start.add_argument("--log", required=True)
    p_start.add_argument("--cwd", required=True)
    p_start.add_argument("--env-file")
    p_start.add_argument("--setenv", action="append", default=[], metavar="KEY=VALUE")
    p_start.add_argument("argv", nargs="+")
    p_stop = sub.add_parser("stop")
    p_stop.add_argument("--pidfile", required=True)
    p_stop.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    return start(args) if args.command == "start" else stop(args)


if __name__ == "__main__":
    raise SystemExit(main())
