"""Bad input to the controller: every case is one clear message (a host's failure, or exit 2 before
any host is touched), never a traceback, a hang or a silent success. Real sshd daemons, real fab."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from ops.errors import InputFileError
from ops.inventory import load_inventory
from ops.playbook import load_playbook
from ops.runner import run_playbook

REPO = Path(__file__).resolve().parents[2]
FAB = Path(sys.executable).parent / "fab"

ENV_PLAYBOOK = """\
name: env
steps:
  - name: run directory
    step: directory
    args: {path: "{{ base }}/run", mode: "0700"}
  - name: env file
    step: template
    args: {src: env.j2, dest: "{{ base }}/run/demo.env", mode: "0600"}
"""


def fab(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FAB), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def bomb(indent: str = "", prefix: str = "x-", levels: int = 9) -> str:
    """A "billion laughs" YAML fragment: anchor l{levels} expands to 9**levels strings."""
    lines = [f'{indent}{prefix}l0: &l0 "lol"']
    lines += [f"{indent}{prefix}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_with_file_and_line(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(bomb() + "hosts:\n  local:\n    connection: local\n    vars: {big: *l9}\n")
    start = time.monotonic()
    with pytest.raises(
        InputFileError,
        match=rf"{inventory}:7: YAML aliases expand to more than 100,000 values "
        r"at '\*l5' \(fix: an alias bomb\?",
    ):
        load_inventory(inventory)
    playbook = tmp_path / "play.yaml"
    playbook.write_text(
        "name: bomb\nsteps:\n  - step: template\n    args:\n      src: env.j2\n      dest: /tmp/x\n"
        "      vars:\n" + bomb(indent="        ", prefix="")
    )
    with pytest.raises(InputFileError, match=rf"{playbook}:14: YAML aliases expand"):
        load_playbook(playbook)
    playbook.write_text("name: deep\nsteps: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(InputFileError, match=r"play\.yaml:2: \[ and \{ nested deeper than 64 levels"):
        load_playbook(playbook)
    assert time.monotonic() - start < 5


def test_when_or_argument_that_raises_fails_that_host_alone(sshd_hosts, make_inventory, tmp_path):
    (h1,) = sshd_hosts(1)
    inventory = make_inventory([h1], local=True, host_vars={"h1": {"zero": 0}})
    (tmp_path / "local-base").mkdir()
    book = tmp_path / "divide.yaml"
    book.write_text(
        "name: divide\nsteps:\n"
        "  - name: marker\n    step: directory\n    args: {path: '{{ base }}/marker'}\n"
        "  - name: guarded\n    step: directory\n    args: {path: '{{ base }}/guarded'}\n"
        "    when: '{{ 1 / (zero | default(1)) > 0 }}'\n"
        "  - name: computed\n    step: directory\n"
        "    args: {path: '{{ base }}/n{{ 10 // (zero | default(1)) }}'}\n"
    )
    result = run_playbook(
        load_playbook(book),
        load_inventory(inventory).select(None),
        results_root=tmp_path / "results",
        live=False,
    )
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert set(summary["hosts"]) == {"h1", "local"} and summary["failed"] == 1
    h1_steps = summary["hosts"]["h1"]["steps"]
    assert [s["status"] for s in h1_steps] == ["changed", "failed", "skipped"]
    assert "'when'" in h1_steps[1]["message"] and "raised ZeroDivisionError" in h1_steps[1]["message"]
    assert summary["hosts"]["local"]["status"] == "changed"
    assert (tmp_path / "local-base" / "n10").is_dir()
    no_when = tmp_path / "compute.yaml"
    no_when.write_text(book.read_text().replace("    when: '{{ 1 / (zero | default(1)) > 0 }}'\n", ""))
    again = run_playbook(
        load_playbook(no_when),
        load_inventory(inventory).select("h1"),
        results_root=tmp_path / "results",
        live=False,
    )
    (failed,) = [s for s in again.hosts["h1"].steps if s.status == "failed"]
    assert (
        failed.name == "computed" and "raised ZeroDivisionError" in failed.message and "h1" in failed.message
    )


def test_unresolvable_secrets_fail_the_host_before_any_step(
    sshd_hosts, make_inventory, tmp_path, monkeypatch
):
    h1, h2, h3 = sshd_hosts(3)
    loose = tmp_path / "loose.token"
    loose.write_text("hf_loose\n")
    loose.chmod(0o644)
    monkeypatch.delenv("SPECOPS_TEST_UNSET", raising=False)
    monkeypatch.setenv("SPECOPS_TEST_TWO_LINES", "hf_abc\nEVIL=1")
    inventory = make_inventory(
        [h1, h2, h3],
        local=True,
        host_fields={
            "h1": {"secrets": {"HF_TOKEN": {"env": "SPECOPS_TEST_UNSET"}}},
            "h2": {"secrets": {"HF_TOKEN": {"file": str(loose)}}},
            "h3": {"secrets": {"HF_TOKEN": {"env": "SPECOPS_TEST_TWO_LINES"}}},
        },
    )
    book = tmp_path / "env.yaml"
    book.write_text(ENV_PLAYBOOK)
    result = run_playbook(
        load_playbook(book),
        load_inventory(inventory).select(None),
        results_root=tmp_path / "results",
        live=False,
    )
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["failed"] == 3 and summary["hosts"]["local"]["status"] == "changed"
    expected = {
        "h1": "environment variable SPECOPS_TEST_UNSET, which is not set on the controller (fix: export",
        "h2": f"readable by others (fix: chmod 600 {loose})",
        "h3": "contains a line break, which could add lines to the host's env file (fix:",
    }
    for host in (h1, h2, h3):
        (step,) = summary["hosts"][host.name]["steps"]
        assert step["step"] == "secrets" and step["status"] == "failed"
        assert "'HF_TOKEN'" in step["message"] and expected[host.name] in step["message"], step["message"]
        assert list(host.base.iterdir()) == []  # no step ran: nothing was written
    assert "EVIL" not in (result.run_dir / "run.log").read_text()


def test_mode_that_is_not_octal_is_refused(tmp_path, make_inventory):
    book = tmp_path / "mode.yaml"
    book.write_text("name: mode\nsteps:\n  - step: directory\n    args: {path: /tmp/x, mode: 999}\n")
    with pytest.raises(InputFileError, match=r"mode\.yaml:4: .*mode 999 is not octal"):
        load_playbook(book)
    book.write_text("name: mode\nsteps:\n  - step: directory\n    args: {path: /tmp/x, mode: 0x1ed}\n")
    with pytest.raises(InputFileError, match="mode 0x1ed is not octal"):
        load_playbook(book)
    book.write_text(
        "name: mode\nsteps:\n  - step: directory\n    args: {path: '{{ base }}/d', mode: '{{ m }}'}\n"
    )
    inventory = make_inventory([], local=True)
    hosts = [dataclasses.replace(h, vars={"m": 999}) for h in load_inventory(inventory).select(None)]
    result = run_playbook(load_playbook(book), hosts, results_root=tmp_path / "results", live=False)
    (step,) = result.hosts["local"].steps
    assert step.status == "failed" and "mode 999 is not octal" in step.message
    assert not (tmp_path / "local-base" / "d").exists()
    book.write_text("name: mode\nsteps:\n  - step: directory\n    args: {path: '{{ base }}/d', mode: 750}\n")
    (tmp_path / "local-base").mkdir(exist_ok=True)
    assert run_playbook(load_playbook(book), hosts, results_root=tmp_path / "results", live=False).ok
    assert oct((tmp_path / "local-base" / "d").stat().st_mode & 0o7777) == "0o750"


def test_input_errors_exit_2_with_one_line_before_any_host(sshd_hosts, make_inventory, tmp_path):
    (h1,) = sshd_hosts(1)
    book = tmp_path / "env.yaml"
    book.write_text(ENV_PLAYBOOK)
    good = make_inventory([h1])
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"hosts:\n  local:\n    connection: local\n    vars: {city: M\xfcnchen}\n")
    missing_key = make_inventory([h1], host_fields={"h1": {"key_file": str(tmp_path / "no-such-key")}})
    a_file = tmp_path / "results-file"
    a_file.write_text("not a folder")
    cases = [
        (["--inventory", str(latin1)], f"{latin1}:4: inventory is not UTF-8 text (byte 0xfc"),
        (
            ["--inventory", str(good), "--forks", "abc"],
            "--forks must be a whole number of hosts in parallel, got 'abc'",
        ),
        (["--inventory", str(good), "--results", str(a_file)], f"cannot create the run folder {a_file}/"),
        (["--inventory", str(missing_key)], f"host 'h1': key_file {tmp_path / 'no-such-key'} does not exist"),
    ]
    for args, message in cases:
        start = time.monotonic()
        done = fab("play", str(book), *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert time.monotonic() - start < 10
    assert not (h1.base / "run").exists()  # no host was touched
    assert "Accepted" not in h1.log_path.read_text()


@pytest.fixture
def tarpit():
    """A TCP port that accepts connections and then trickles junk lines, never an SSH banner."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()
    clients: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                clients.append(server.accept()[0])
            for client in list(clients):
                try:
                    client.sendall(b"not ssh\r\n")
                except OSError:
                    clients.remove(client)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for client in clients:
        client.close()
    server.close()


def test_tarpit_host_is_one_clear_message_within_a_bounded_wait(tarpit, tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "tarpit": {
                        "address": "127.0.0.1",
                        "port": tarpit,
                        "connect_timeout": 1,
                        "host_key_policy": "accept-new",
                        "known_hosts": str(tmp_path / "known_hosts"),
                    },
                    "local": {"connection": "local", "base": str(tmp_path / "local-base")},
                }
            }
        )
    )
    book = tmp_path / "env.yaml"
    book.write_text(ENV_PLAYBOOK)
    start = time.monotonic()
    done = fab("play", str(book), "--inventory", str(inventory), "--results", str(tmp_path / "results"))
    elapsed = time.monotonic() - start
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr
    summary = json.loads((tmp_path / "results" / "latest" / "summary.json").read_text())
    step, skipped = summary["hosts"]["tarpit"]["steps"]
    assert skipped["status"] == "skipped"
    assert step["message"] == (
        f"host 'tarpit' unreachable: 127.0.0.1:{tarpit} accepted the connection but no SSH "
        "handshake completed (no SSH banner; gave up within 3s) (fix: check that port "
        f"{tarpit} is the host's sshd, not another service or a tarpit)"
    )
    assert summary["hosts"]["local"]["status"] == "changed"
    assert elapsed < 15
