"""Helpers for the deploy tests: a git checkout to build releases from, the host variables that
deploy it, releases broken on purpose (``with_crash``), HTTP calls to the deployed server, watchers
that sample /proc and the ``current`` link while a deploy runs. ``benchmarks/faults.py`` uses them
too, so they live here rather than in a test module."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.results import RunResult
from ops.tasks import run_file
from ops.wheel import REPO_ROOT, packaged_files

PLAYBOOKS = REPO_ROOT / "playbooks"
GIT = [
    "git",
    "-c",
    "user.name=specops tests",
    "-c",
    "user.email=tests@specops.invalid",
    "-c",
    "commit.gpgsign=false",
]


MAIN = "ddtree_runtime/__main__.py"
CRASH_ON_IMPORT = 'raise RuntimeError("deliberately broken release: crashes on import")\n'
CRASH_AT_START = (
    'import sys\nif "serve" in sys.argv and "--help" not in sys.argv:\n'
    '    raise SystemExit("deliberately broken release: crashes at start-up")\n'
)
FUTURE = "from __future__ import annotations\n"


def with_crash(main: str, code: str) -> str:
    """``__main__.py`` with ``code`` run first (after a ``from __future__`` line, which must lead)."""
    head, sep, tail = main.partition(FUTURE)
    return head + sep + code + tail if sep else code + main


def host_vars(tiny_pair, checkout, port: int, **extra) -> dict:
    """A cpu host that deploys ``checkout``'s releases of the tiny pair, serving on ``port``."""
    return {
        "profile": "cpu",
        "target": str(tiny_pair.target),
        "drafter": str(tiny_pair.drafter),
        "serve": {"port": port, "budget": 8},
        "venv_site_packages": ["controller"],
        "release_source": str(checkout.path),
        "deploy_timeout": 120,
        **extra,
    }


@dataclass
class Checkout:
    """A real git repository with this checkout's packaged files; commits make new releases."""

    path: Path

    @classmethod
    def create(cls, path: Path) -> Checkout:
        for rel in packaged_files(REPO_ROOT):
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / rel, path / rel)
        checkout = cls(path)
        subprocess.run([*GIT, "init", "-q", str(path)], check=True)
        checkout.commit("initial", {})
        return checkout

    def commit(self, message: str, edits: dict[str, str]) -> None:
        for rel, text in edits.items():
            (self.path / rel).write_text(text)
        subprocess.run([*GIT, "-C", str(self.path), "add", "-A"], check=True)
        subprocess.run(
            [*GIT, "-C", str(self.path), "commit", "-q", "--allow-empty", "-m", message], check=True
        )

    def read(self, rel: str) -> str:
        return (self.path / rel).read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deploy(inventory: Path, results: Path, playbook: str = "deploy.yaml") -> RunResult:
    return run_file(PLAYBOOKS / playbook, inventory=str(inventory), results=str(results))


def step(result: RunResult, host: str, step_name: str) -> Any:
    """The last result of a step (by its registered operation name) on a host."""
    return [s for s in result.hosts[host].steps if s.step == step_name][-1]


def complete(port: int, prompt: str = "the first") -> dict[str, Any]:
    """One real completion over HTTP, with the served model id from /v1/models."""
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
        model = json.load(r)["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(
        base + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        return json.load(r)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def server_pid(base: Path) -> int:
    return int((base / "run" / "specops-ddtree.pid").read_text())


def running_release(pid: int) -> str:
    """The release a server process runs: its working directory is the release directory."""
    return Path(os.readlink(f"/proc/{pid}/cwd")).name


def link(base: Path, name: str) -> str | None:
    try:
        return Path(os.readlink(base / name)).name
    except OSError:
        return None


def is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_servers(base: Path) -> None:
    """Kill what the supervisor started under ``base`` (test clean-up; TERM, then KILL)."""
    pidfiles = sorted(
        (base / "run").glob("*.pid") if (base / "run").is_dir() else [],
        key=lambda p: not p.name.endswith(".monitor.pid"),
    )  # monitors first: they restart servers
    for pidfile in pidfiles:
        with contextlib.suppress(ValueError, OSError):
            pid = int(pidfile.read_text())
            if not is_running(pid) or os.getsid(pid) != pid:
                continue
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while is_running(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if is_running(pid):
                os.killpg(pid, signal.SIGKILL)


@dataclass
class Sampler:
    """Calls ``probe`` every ``interval`` seconds in a thread until stopped; keeps what it returns."""

    probe: Any
    interval: float = 0.02
    samples: list[Any] = field(default_factory=list)

    def __enter__(self) -> Sampler:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.probe())
            time.sleep(self.interval)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def argv_holding(secret: str) -> list[str]:
    """Command lines of every process on this machine that contain ``secret``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                if secret.encode() in cmdline:
                    found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found
