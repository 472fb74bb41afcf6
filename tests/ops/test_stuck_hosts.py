"""No host can hang a run (issue 27, item 2): a host whose sshd freezes with TCP up (SIGSTOP, as a
stopped process or a dead NAT leaves it) is dropped by the keepalive that expects an answer, a
second Ctrl-C abandons the hosts still busy, a step's commands have a default timeout, and a full
results disk on the controller ends the run with one line, never a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ops.inventory import load_inventory
from ops.playbook import load_playbook
from ops.runner import run_playbook
from ops.wheel import REPO_ROOT
from tests.diskfull import fill

FAB = Path(sys.executable).with_name("fab")
PLAYBOOK = """\
name: stuck
steps:
  - name: start
    step: command
    args: {cmd: "touch {{ base }}/started && sleep 2"}
  - name: finish
    step: command
    args: {cmd: "touch {{ base }}/finished"}
"""


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def fab_play(playbook: Path, inventory: Path, results: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(FAB), "play", str(playbook), "--inventory", str(inventory), "--results", str(results)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


@pytest.mark.slow
def test_a_frozen_host_fails_alone_and_the_run_ends_with_its_summary(sshd_hosts, make_inventory, tmp_path):
    h1, h2 = sshd_hosts(2)  # connect_timeout 3: keepalives every 3 s, answered within 6 s
    book = tmp_path / "stuck.yaml"
    book.write_text(PLAYBOOK)
    hosts = load_inventory(make_inventory([h1, h2])).select(None)
    outcome = {}

    def run() -> None:
        outcome["result"] = run_playbook(
            load_playbook(book), hosts, results_root=tmp_path / "results", live=False
        )

    worker = threading.Thread(target=run, daemon=True)
    began = time.monotonic()
    worker.start()
    wait_for(h2.base / "started")
    h2.freeze()  # mid-command: the session never reports its exit, and TCP stays up
    worker.join(60)
    assert not worker.is_alive(), "the run waited on the frozen host"
    assert time.monotonic() - began < 30
    result = outcome["result"]
    assert result.hosts["h1"].status == "changed" and (h1.base / "finished").exists()
    failed = result.hosts["h2"].steps[0]
    assert failed.status == "failed" and result.hosts["h2"].steps[1].status == "skipped"
    assert failed.message.startswith(f"host 'h2' unreachable: no answer from {h2.address}:{h2.port} for 9s")
    assert "\n" not in failed.message
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert set(summary["hosts"]) == {"h1", "h2"} and summary["failed"] == 1
    h2.thaw()


def test_a_second_ctrl_c_abandons_the_stuck_host_and_still_writes_the_summary(
    sshd_hosts, make_inventory, tmp_path
):
    h1, h2 = sshd_hosts(2)
    book = tmp_path / "stuck.yaml"
    book.write_text(PLAYBOOK)
    # a long connect_timeout: the keepalive would take minutes, so only the second Ctrl-C ends it
    inventory = make_inventory([h1, h2], host_fields={"h2": {"connect_timeout": 60}})
    results = tmp_path / "results"
    proc = fab_play(book, inventory, results)
    wait_for(h2.base / "started")
    h2.freeze()
    wait_for(h1.base / "finished")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in out + err and "abandoning the hosts still busy" in err
    summary = json.loads((results / "latest" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["hosts"]["h1"]["status"] == "changed"
    stuck = summary["hosts"]["h2"]
    assert stuck["status"] == "failed" and stuck["steps"][0]["message"].startswith(
        "host 'h2': abandoned: a second Ctrl-C stopped waiting for this host"
    )
    h2.thaw()


def test_a_step_timeout_bounds_its_commands(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  local: {{connection: local, base: {tmp_path / 'base'}}}\n")
    book = tmp_path / "slow.yaml"
    book.write_text("name: slow\nsteps:\n  - step: command\n    timeout: 1\n    args: {cmd: 'sleep 30'}\n")
    began = time.monotonic()
    result = run_playbook(
        load_playbook(book), load_inventory(inventory).select(None), results_root=tmp_path / "r", live=False
    )
    step = result.hosts["local"].steps[0]
    assert step.status == "failed" and "exited 124" in step.message and "timed out after 1s" in step.stderr
    assert time.monotonic() - began < 15


def test_a_full_results_disk_ends_the_run_with_one_line(tmp_path, small_fs):
    results = small_fs(tmp_path / "results", "64k")
    fill(results)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  local: {{connection: local, base: {tmp_path / 'base'}}}\n")
    book = tmp_path / "quick.yaml"
    book.write_text("name: quick\nsteps:\n  - step: command\n    args: {cmd: 'true'}\n")
    proc = fab_play(book, inventory, results)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert "Traceback" not in out + err and not err.strip()
    assert "warning: cannot write " in out and "run.log (No space left on device); going on" in out
    last = out.strip().splitlines()[-1]
    assert "1 host(s): 1 changed, 0 failed; error: cannot write " in last
    assert "summary.json: No space left on device (fix: free space in" in last
