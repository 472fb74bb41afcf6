"""The wheel builder (named by version and commit, cached, reproducible) and the built-in
supervisor (setsid, pidfile, log, environment file, TERM then KILL) on real processes."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from ops.wheel import base_version, build_wheel
from tests.deploy.helpers import is_running, stop_servers

SUPERVISOR = Path(__file__).resolve().parents[2] / "ops" / "service" / "remote" / "supervisor.py"


def test_wheel_is_named_by_commit_cached_and_marks_local_edits(checkout):
    sha = subprocess.run(
        ["git", "-C", str(checkout.path), "rev-parse", "--short=7", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    wheel = build_wheel(checkout.path)
    assert wheel.version == f"{base_version(checkout.path)}+g{sha}" == wheel.release_id
    assert wheel.path.name == f"specops-{wheel.version}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel.path).namelist()
    assert "ddtree_runtime/tiny.py" in names and "ops/service/remote/supervisor.py" in names
    again = build_wheel(checkout.path)
    assert again == wheel  # the cache: same file, same checksum

    init = checkout.path / "ddtree_runtime" / "__init__.py"
    init.write_text(init.read_text() + "# a local edit\n")
    dirty = build_wheel(checkout.path)
    assert dirty.version.startswith(f"{wheel.version}.dirty") and dirty.sha256 != wheel.sha256
    (checkout.path / "build").rename(checkout.path / "old-build")  # no cache: rebuilt, byte for byte
    assert build_wheel(checkout.path).sha256 == dirty.sha256
    (checkout.path / "tests").mkdir()
    (checkout.path / "tests" / "x.py").write_text("# not packaged\n")
    assert build_wheel(checkout.path).version == dirty.version


def supervise(*args: str, soft_files: int | None = None) -> subprocess.CompletedProcess:
    """The supervisor script; ``soft_files`` lowers its soft open-file limit (a login's 1024, say)."""

    def limit() -> None:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (soft_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )

    return subprocess.run(
        [sys.executable, str(SUPERVISOR), *args],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limit if soft_files else None,
    )


def test_supervisor_starts_detached_with_env_file_and_stops_with_term_then_kill(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    env_file = run / "svc.env"
    env_file.write_text("# comment\nAPI_TOKEN='s3cret-value'\n\nOTHER=1\n")
    env_file.chmod(0o600)
    pidfile, log, out = run / "svc.pid", tmp_path / "svc.log", tmp_path / "seen.json"
    child = (
        "import json, os, resource, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "seen = {'env': dict(os.environ), 'cwd': os.getcwd(), 'sid': os.getsid(0), "
        "'files': resource.getrlimit(resource.RLIMIT_NOFILE)}; "
        "json.dump(seen, open(sys.argv[1], 'w')); "
        "print('started', flush=True); time.sleep(600)"
    )
    try:
        started = supervise(
            "start",
            "--pidfile",
            str(pidfile),
            "--log",
            str(log),
            "--cwd",
            str(tmp_path),
            "--env-file",
            str(env_file),
            "--setenv",
            "SPECOPS_RELEASE=r1",
            "--",
            sys.executable,
            "-c",
            child,
            str(out),
            soft_files=256,
        )
        assert started.returncode == 0, started.stderr
        pid = json.loads(started.stdout)["pid"]
        assert int(pidfile.read_text()) == pid and is_running(pid)
        deadline = time.monotonic() + 30
        while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = json.loads(out.read_text())
        assert seen["env"]["API_TOKEN"] == "s3cret-value" and seen["env"]["SPECOPS_RELEASE"] == "r1"
        assert seen["cwd"] == str(tmp_path) and seen["sid"] == pid  # its own session
        soft, hard = seen["files"]
        assert soft == hard > 256  # issue 27, item 6: the open-file limit raised for the server
        assert b"s3cret-value" not in Path(f"/proc/{pid}/cmdline").read_bytes()

        refused = supervise(
            "start", "--pidfile", str(pidfile), "--log", str(log), "--cwd", str(tmp_path), "--", "true"
        )
        assert refused.returncode == 3 and "still running" in refused.stderr

        stopped = supervise("stop", "--pidfile", str(pidfile), "--timeout", "0.5")
        assert json.loads(stopped.stdout) == {"stopped": pid, "signal": "KILL"}  # it ignored TERM
        assert not is_running(pid) and not pidfile.exists()
        assert "started" in log.read_text() and "specops-supervisor: start" in log.read_text()
        assert json.loads(supervise("stop", "--pidfile", str(pidfile)).stdout) == {
            "stopped": None,
            "signal": None,
        }
    finally:
        stop_servers(tmp_path)


def test_supervisor_refuses_an_environment_file_it_cannot_parse(tmp_path):
    env_file = tmp_path / "bad.env"
    env_file.write_text("not a key value line\n")
    done = supervise(
        "start",
        "--pidfile",
        str(tmp_path / "p"),
        "--log",
        str(tmp_path / "l"),
        "--cwd",
        str(tmp_path),
        "--env-file",
        str(env_file),
        "--",
        "true",
    )
    assert done.returncode == 3 and "bad.env:1: expected KEY=VALUE" in done.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("pid_text", ["999999999", "garbage"])
def test_supervisor_stop_clears_a_stale_pidfile(tmp_path, pid_text):
    pidfile = tmp_path / "svc.pid"
    pidfile.write_text(pid_text)
    done = supervise("stop", "--pidfile", str(pidfile))
    assert done.returncode == 0 and json.loads(done.stdout)["stopped"] is None
    assert not pidfile.exists()
