"""Every step for real on the local connection: the first run changes the host, the second run
(a fresh probe of the changed host) plans nothing. Check mode's contract lives in the runner tests."""

from __future__ import annotations

import http.server
import json
import os
import stat
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

from ops.api.changes import Applied, Plan, StepFailed
from ops.api.context import StepContext
from ops.connection import connect
from ops.hosts import Host
from ops.layout import HostLayout
from ops.steps import get_step

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


@pytest.fixture
def local(tmp_path: Path):
    host = Host(
        name="local",
        connection="local",
        address=None,
        port=22,
        user=None,
        key_file=None,
        base=str(tmp_path / "base"),
        host_key_policy="strict",
        known_hosts=(),
        sudo=False,
        connect_timeout=5.0,
        vars={"greeting": "hi"},
        groups=(),
    )
    with connect(host) as conn:
        yield host, conn


def converge(
    local, name: str, args: dict[str, Any], playbook_dir: Path, apply: bool = True, **extra_vars
) -> tuple[Plan, Applied]:
    host, conn = local
    step = get_step(name)()
    ctx = StepContext(
        host=host,
        playbook_dir=playbook_dir,
        templates_dir=TEMPLATES,
        vars={**host.template_vars(), "secrets": {}, **extra_vars},
    )
    typed = step.check_args(args)
    plan = step.plan(step.probe(conn, typed, ctx), typed, ctx)
    if apply and plan.will_change:
        return plan, step.apply(conn, plan, ctx)
    return plan, Applied(False, plan.reason, plan.data)


def twice(local, name: str, args: dict[str, Any], playbook_dir: Path, **extra_vars) -> tuple[Applied, Plan]:
    """Apply once (must change), then plan again (must be a no-op with a reason)."""
    plan, applied = converge(local, name, args, playbook_dir, **extra_vars)
    assert plan.will_change and applied.changed, plan.reason
    again, second = converge(local, name, args, playbook_dir, **extra_vars)
    assert not again.will_change and not second.changed, again.changes
    assert again.reason
    return applied, again


def mode_of(path: Path) -> str:
    return f"{stat.S_IMODE(path.stat().st_mode):04o}"


def test_directory(local, tmp_path: Path) -> None:
    target = tmp_path / "base" / "a b" / "releases"
    _, again = twice(local, "directory", {"path": str(target), "mode": "0750"}, tmp_path)
    assert target.is_dir() and mode_of(target) == "0750"
    assert again.reason.startswith("directory exists with mode 0750")
    target.chmod(0o755)
    plan, applied = converge(local, "directory", {"path": str(target), "mode": "0750"}, tmp_path)
    assert applied.changed and mode_of(target) == "0750" and "0755 -> 0750" in plan.reason


def test_file_copy_by_checksum(local, tmp_path: Path) -> None:
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(4096))
    dest = tmp_path / "out.bin"
    twice(local, "file_copy", {"src": "payload.bin", "dest": str(dest), "mode": "0640"}, tmp_path)
    assert dest.read_bytes() == src.read_bytes() and mode_of(dest) == "0640"
    src.write_bytes(os.urandom(4096))
    plan, _ = converge(
        local, "file_copy", {"src": "payload.bin", "dest": str(dest), "mode": "0640"}, tmp_path
    )
    assert "content differs (sha256" in plan.diff and dest.read_bytes() == src.read_bytes()


def test_template_beside_playbook_then_templates_dir(local, tmp_path: Path) -> None:
    (tmp_path / "motd.j2").write_text("{{ greeting }} from {{ name }}\n")
    dest = tmp_path / "motd"
    twice(local, "template", {"src": "motd.j2", "dest": str(dest)}, tmp_path)
    assert dest.read_text() == "hi from local\n"
    env = tmp_path / "demo.env"
    twice(
        local,
        "template",
        {"src": "env.j2", "dest": str(env), "mode": "0600", "vars": {"env": {"MODE": "ddtree"}}},
        tmp_path,
    )
    assert "MODE=ddtree" in env.read_text() and mode_of(env) == "0600"


def test_line_in_file(local, tmp_path: Path) -> None:
    conf = tmp_path / "app.conf"
    conf.write_text("a=1\nport=7000\n")
    conf.chmod(0o600)
    args = {"path": str(conf), "line": "port=8000", "regexp": "^port="}
    twice(local, "line_in_file", args, tmp_path)
    assert conf.read_text() == "a=1\nport=8000\n" and mode_of(conf) == "0600"


def test_command_guards(local, tmp_path: Path) -> None:
    marker = tmp_path / "made"
    applied, again = twice(
        local, "command", {"cmd": f"echo built; touch {marker}", "creates": str(marker)}, tmp_path
    )
    assert applied.data["stdout"] == "built\n" and again.reason == f"{marker} exists"
    _, again = twice(
        local, "command", {"cmd": f"echo x > {tmp_path}/u", "unless": f"test -s {tmp_path}/u"}, tmp_path
    )
    assert again.reason == "'unless' check succeeded"
    with pytest.raises(StepFailed) as info:
        converge(local, "command", {"cmd": "echo oops >&2; exit 3"}, tmp_path)
    assert info.value.stderr == "oops" and "exited 3" in str(info.value)


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel, so pip_install is tested offline (--no-index --find-links)."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{name}/__init__.py", f"VERSION = {version!r}\n")
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(
            f"{info}/RECORD", f"{name}/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n"
        )
    return path


@pytest.mark.slow
def test_python_venv_and_pip_install(local, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python = os.path.realpath(sys.executable)  # the base interpreter, not a version-manager shim
    _, again = twice(local, "python_venv", {"path": str(venv), "python": python}, tmp_path)
    assert (venv / "bin" / "python").exists() and again.reason.startswith("venv exists (Python 3.")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "specops_tiny", "1.0")
    _wheel(wheels, "specops_tiny", "2.0")
    args = {
        "venv": str(venv),
        "requirements": ["specops-tiny==1.0"],
        "no_index": True,
        "find_links": str(wheels),
    }
    _, again = twice(local, "pip_install", args, tmp_path)
    assert again.data["installed"]["specops-tiny"] == "1.0"
    (tmp_path / "reqs.txt").write_text("# pinned\nspecops_tiny==2.0\n")
    plan, _ = converge(local, "pip_install", {**args, "requirements": "reqs.txt"}, tmp_path, apply=False)
    assert plan.reason.startswith("install specops-tiny 1.0 -> 2.0") and plan.changes[0].command.endswith(
        " specops_tiny==2.0"
    )


class _Flaky(http.server.BaseHTTPRequestHandler):
    """503 for the first ``server.warmup`` requests, then 200 with the model id."""

    def do_GET(self) -> None:
        self.server.hits += 1  # type: ignore[attr-defined]
        ready = self.server.hits > self.server.warmup  # type: ignore[attr-defined]
        body = b'{"data": [{"id": "demo-model"}]}' if ready else b"warming up"
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _server(warmup: int) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    server.hits, server.warmup = 0, warmup  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_http_wait_polls_until_ready(local, tmp_path: Path) -> None:
    server = _server(warmup=3)  # the probe and two polls see 503
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/models"
        args = {"url": url, "timeout": 60, "contains": "demo-model", "interval": 0.05}
        plan, applied = converge(local, "http_wait", args, tmp_path)
        assert server.hits == 4  # type: ignore[attr-defined]
        assert plan.will_change and not applied.changed  # waiting changes nothing on the host
        assert applied.message.startswith("ready after")
        again, _ = converge(local, "http_wait", args, tmp_path)
        assert not again.will_change and again.reason == f"{url} answered 200"
    finally:
        server.shutdown()
        server.server_close()


def test_http_wait_times_out(local, tmp_path: Path) -> None:
    server = _server(warmup=10**6)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/health"
        with pytest.raises(StepFailed, match=r"timed out after .*status 503"):
            converge(local, "http_wait", {"url": url, "timeout": 0.6, "interval": 0.2}, tmp_path)
    finally:
        server.shutdown()
        server.server_close()


def test_facts_on_this_machine(local, tmp_path: Path) -> None:
    plan, applied = converge(local, "facts", {}, tmp_path)
    assert not plan.will_change and not applied.changed
    assert plan.data["cpu"]["count"] == os.cpu_count()
    assert plan.data["python"]["version"].startswith("3.")
    assert plan.data["disk"]["free_gib"] is not None  # base does not exist yet: nearest parent is used


def test_tuned_settings_hand_over_a_cost_table_only_for_the_models_it_was_measured_for(
    local, tmp_path: Path
) -> None:
    host, _ = local
    layout = HostLayout(host.base)
    Path(layout.run).mkdir(parents=True)
    Path(layout.tuned).write_text(json.dumps({"serve": {"mode": "ddtree", "budget": 8}, "tuned_at": "t"}))
    argv = ["python", "-m", "ddtree_runtime", "cost-table", "--target", "/m/t", "--drafter", "/m/d"]
    argv += ["--device", "cpu", "--max-batch", "4", "--out", layout.cost_table]
    costs = {"rows": [1, 2], "seconds": [0.1, 0.2], "measured_for": {"argv": argv, "release": "r1"}}
    Path(layout.cost_table).write_text(json.dumps(costs))
    args = {"base": host.base, "target": "/m/t", "drafter": "/m/d", "serve": {"device": "cpu"}}
    args["serve_env"] = {"SPECOPS_SERVE_MAX_BATCH": 4, "SPECOPS_SERVE_BUDGET_POLICY": "load"}

    plan, _ = converge(local, "tuned_settings", args, tmp_path)
    assert plan.data["serve"] == {"mode": "ddtree", "budget": 8, "cost_table": layout.cost_table}

    plan, _ = converge(local, "tuned_settings", {**args, "drafter": "/m/d2"}, tmp_path)
    assert plan.data["serve"] == {"mode": "ddtree", "budget": 8}
    assert f"{layout.cost_table} left out, it was measured for drafter /m/d (now /m/d2)" in plan.reason

    served_fp8 = {**args["serve_env"], "SPECOPS_SERVE_DRAFT_HEAD": "fp8"}  # the drafts' cost changes
    plan, _ = converge(local, "tuned_settings", {**args, "serve_env": served_fp8}, tmp_path)
    assert plan.data["serve"] == {"mode": "ddtree", "budget": 8}
    assert "it was measured for draft-head unset (now fp8)" in plan.reason

    Path(layout.cost_table).write_text(json.dumps({"rows": [1, 2], "seconds": [0.1, 0.2]}))  # by hand
    plan, _ = converge(local, "tuned_settings", {**args, "drafter": "/m/d2"}, tmp_path)
    assert plan.data["serve"]["cost_table"] == layout.cost_table and "served unchecked" in plan.reason
