"""The service lifecycle under faults (issue 15, items 2 to 6): real sshd hosts, the real server on
the CPU, real HTTP, real processes killed.

- a deploy proves it talks to the process it started: an impostor on the port fails it;
- a config change to a taken port is refused before the running server stops, and a config change
  that cannot start goes back to the old server with its old settings;
- one changing run per host (the lock), and a clean Ctrl-C;
- the supervisor restarts a crashed server, reports a crash loop, and ``fab status`` fails for a
  host whose server is down.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ops.wheel import REPO_ROOT
from tests.deploy.helpers import (
    complete,
    deploy,
    free_port,
    healthy,
    host_vars,
    is_running,
    server_pid,
    step,
)
from tests.deploy.test_wheel_and_supervisor import SUPERVISOR, supervise

API_KEY = "sk-specops-deploy-test-0123456789"


class Impostor(BaseHTTPRequestHandler):
    """Another OpenAI-compatible server: it answers everything a health wait asks."""

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json({"data": [{"id": "impostor"}]} if self.path == "/v1/models" else {"status": "ok"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._json({"choices": [{"text": " impostor"}]})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def impostor() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Impostor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def wait_for(predicate, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def failure(result, step_name: str = "service") -> str:
    return next(s.message for s in result.hosts["h1"].steps if s.step == step_name and s.status == "failed")


def test_supervisor_restarts_a_crashed_server_then_reports_a_crash_loop(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    pidfile, log = run / "svc.pid", tmp_path / "svc.log"
    try:
        started = supervise(
            "start",
            "--pidfile",
            str(pidfile),
            "--log",
            str(log),
            "--cwd",
            str(tmp_path),
            "--restart-backoff",
            "0.1",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(600)",
        )
        assert started.returncode == 0, started.stderr
        first = json.loads(started.stdout)["pid"]
        os.kill(first, signal.SIGKILL)  # the OOM killer, say
        wait_for(lambda: (p := int(pidfile.read_text())) != first and is_running(p), 30, "a restart")
        status = json.loads((run / "svc.status").read_text())
        assert status["state"] == "running" and status["restarts"] == 1 and status["last_exit"] == -9
        assert "exited with -9; restart in 0.1s" in log.read_text()
        second = int(pidfile.read_text())
        stopped = json.loads(supervise("stop", "--pidfile", str(pidfile), "--timeout", "5").stdout)
        assert stopped == {"stopped": second, "signal": "TERM"}
        time.sleep(0.5)  # nothing restarts what `stop` stopped
        assert not pidfile.exists() and not is_running(second)

        crashing = supervise(
            "start",
            "--pidfile",
            str(pidfile),
            "--log",
            str(log),
            "--cwd",
            str(tmp_path),
            "--restart-backoff",
            "0.05",
            "--crash-limit",
            "3",
            "--",
            sys.executable,
            "-c",
            "raise SystemExit(7)",
        )
        assert crashing.returncode == 0, crashing.stderr
        wait_for(
            lambda: json.loads((run / "svc.status").read_text())["state"] == "crash-loop", 30, "a crash loop"
        )
        status = json.loads((run / "svc.status").read_text())
        assert status["restarts"] == 3 and status["last_exit"] == 7 and status["pid"] is None
        assert "crash loop: exit 7, 3 restarts" in log.read_text()
    finally:
        subprocess.run([sys.executable, str(SUPERVISOR), "stop", "--pidfile", str(pidfile)], timeout=60)


@pytest.mark.slow
def test_deploy_proves_its_own_server_answers_and_never_leaves_the_host_without_one(
    sshd_hosts, make_inventory, tiny_pair, checkout, servers, tmp_path, impostor, monkeypatch
):
    (h1,) = sshd_hosts(1)
    base = servers(h1.base)
    results = tmp_path / "results"

    def inventory(port: int, serve_env: dict | None = None, secrets: dict | None = None, **serve) -> Path:
        return make_inventory(
            [h1],
            host_vars={
                "h1": {
                    **host_vars(tiny_pair, checkout, port),
                    "serve": {"port": port, "budget": 8, **serve},
                    "serve_env": serve_env or {},
                }
            },
            host_fields={"h1": {"secrets": secrets}} if secrets else None,
        )

    # An impostor answers on the port: our server dies on bind, and the deploy fails saying so.
    taken = deploy(inventory(impostor), results)
    assert not taken.ok
    message = failure(taken)
    assert f"port {impostor} answers, but not from the server we started" in message
    assert f"pid {os.getpid()}" in message and "it was stopped" in message

    # A good deploy, then a config-only change to the taken port: refused before anything stops.
    port = free_port()
    assert deploy(inventory(port), results).ok
    pid = server_pid(base)
    refused = deploy(inventory(impostor), results)
    assert not refused.ok and f"port {impostor} is taken by pid {os.getpid()}" in failure(refused)
    assert "keeps running untouched" in failure(refused)
    assert server_pid(base) == pid and is_running(pid) and complete(port)["choices"]

    # A config-only change that cannot start (no room for one verify round): back to the old
    # server with its old settings, although the release did not change.
    broken = deploy(inventory(port, max_context=8), results)
    assert not broken.ok and "rolled back to" in failure(broken)
    assert healthy(port) and complete(port)["choices"] and server_pid(base) != pid

    # A change of serve_env alone, to a value the server refuses: the template step rewrote the env
    # file first, so the rollback restores the one the old server answered with (issue 27, item 1).
    env_file = base / "run" / "specops-ddtree.env"
    answered = env_file.read_bytes()
    refused_env = deploy(inventory(port, serve_env={"SPECOPS_SERVE_QUEUE_SIZE": 0}), results)
    assert not refused_env.ok and "rolled back to" in failure(refused_env), failure(refused_env)
    assert "--queue-size: 0 is not valid" in step(refused_env, "h1", "service").stderr
    assert env_file.read_bytes() == answered and stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert healthy(port) and complete(port)["choices"]

    # Killed (SIGKILL): the supervisor restarts it; stopped: fab status fails for the host.
    killed = server_pid(base)
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: server_pid(base) != killed and healthy(port), 180, "the restarted server")
    status = deploy(inventory(port), results, "status.yaml")
    assert (
        status.ok
        and "restarted 1 time(s) after crashes" in status.hosts["h1"].registered["service_status"]["message"]
    )
    supervisor = base / "bin" / "specops-supervisor.py"
    subprocess.run(
        [sys.executable, str(supervisor), "stop", "--pidfile", str(base / "run" / "specops-ddtree.pid")],
        check=True,
        timeout=120,
    )
    down = deploy(inventory(port), results, "status.yaml")
    assert not down.ok and "not running" in failure(down, "service_status")

    # An API key from an inventory secret (issue 27, item 6), guarding every route here: the deploy's
    # health wait and fab status send it; a client without it gets 401.
    monkeypatch.setenv("SPECOPS_TEST_API_KEY", API_KEY)
    keyed = inventory(
        port,
        serve_env={"SPECOPS_SERVE_API_KEY_ROUTES": "all"},
        secrets={"SPECOPS_SERVE_API_KEY": {"env": "SPECOPS_TEST_API_KEY"}},
    )
    assert deploy(keyed, results).ok
    with pytest.raises(urllib.error.HTTPError, match="401"):
        complete(port)
    assert not healthy(port)
    status = deploy(keyed, results, "status.yaml")
    assert status.ok and "/health 200" in status.hosts["h1"].registered["service_status"]["message"]


@pytest.mark.slow
def test_one_changing_run_per_host_and_a_clean_ctrl_c(
    sshd_hosts, make_inventory, tiny_pair, checkout, servers, tmp_path
):
    (h1,) = sshd_hosts(1)
    base = servers(h1.base)
    port = free_port()
    inventory = make_inventory([h1], host_vars={"h1": host_vars(tiny_pair, checkout, port)})
    results = tmp_path / "results"
    assert deploy(inventory, results).ok
    lock = base / "run" / "deploy.lock"
    assert not lock.exists()  # released

    # A lock held by a live run is respected: the deploy is refused, naming the holder. The holder
    # stands in for another fab process on this controller (a real live pid), so the refusal does
    # not depend on how long a real deploy happens to hold the lock.
    holder_proc = subprocess.Popen(["sleep", "600"])
    holder = {
        "controller": socket.gethostname(),
        "pid": holder_proc.pid,
        "run_id": "20261203-000000-deploy-live",
        "since": "2026-12-03T00:00:00+00:00",
    }
    lock.write_text(json.dumps(holder) + "\n")
    try:
        second = deploy(inventory, results)
        assert not second.ok and lock.exists()
        assert f"is locked by run {holder['run_id']} (pid {holder_proc.pid}" in failure(second, "lock")
    finally:
        holder_proc.kill()
        holder_proc.wait()
    # Once its holder is gone the lock is stale: the next deploy takes it over and releases it.
    assert deploy(inventory, results).ok and not lock.exists()

    # Ctrl-C during a deploy: the step in progress finishes, the rest is skipped, the summary says
    # so, results/latest points at it, and the message says how to continue.
    fab = Path(sys.executable).with_name("fab")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    before = {p.name for p in results.iterdir()}
    proc = subprocess.Popen(
        [str(fab), "deploy", "--inventory", str(inventory), "--results", str(results)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    wait_for(
        lambda: any("[6/" in p.read_text() for p in results.glob("*/run.log") if p.parent.name not in before),
        120,
        "the deploy to reach step 6",
    )
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    summary = json.loads((results / "latest" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["hosts"]["h1"]["status"] == "interrupted"
    assert summary["hosts"]["h1"]["steps"][-1]["message"] == "not run: interrupted (Ctrl-C)"
    assert "interrupted: run " in err and "h1: stopped after " in err and "run the same command again" in err
    assert "Traceback" not in err and not lock.exists() and complete(port)["choices"]
