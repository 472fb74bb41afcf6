"""The runner end to end over real sshd daemons on 127.0.0.x (fixtures in tests/sshd.py).

Covered: parallel and serial runs, the second run changing nothing, --check writing nothing
(tree listings of every base before/after), summary.json / run.log / results/latest, a secret
never shown anywhere, and a host that goes down mid-run failing alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from ops.inventory import load_inventory
from ops.playbook import load_playbook
from ops.results import RunResult
from ops.runner import run_playbook

PLAYBOOKS = Path(__file__).parent / "playbooks"
TOKEN = "hf_TestToken_0123456789abcdef"


def tree(base: Path) -> list[tuple[str, str, str]]:
    """Every path under base with its mode and content checksum: the host's observable state."""
    rows = []
    for root, dirs, files in os.walk(base):
        for name in sorted(dirs + files):
            path = Path(root) / name
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            rows.append((str(path.relative_to(base)), oct(path.stat().st_mode), digest))
    return sorted(rows)


def play(name: str, inventory: Path, results: Path, **options) -> RunResult:
    hosts = load_inventory(inventory).select(options.pop("limit", None))
    return run_playbook(load_playbook(PLAYBOOKS / name), hosts, results_root=results, live=False, **options)


def statuses(result: RunResult) -> dict[str, list[str]]:
    return {name: [s.status for s in host.steps] for name, host in result.hosts.items()}


def test_converge_parallel_check_serial_idempotent(
    sshd_hosts, make_inventory, tmp_path: Path, capsys
) -> None:
    hosts = sshd_hosts(3)
    inventory = make_inventory(hosts, host_vars={"h2": {"mode": "dflash"}})
    results = tmp_path / "results"
    empty = {h.name: tree(h.base) for h in hosts}

    checked = play("converge.yaml", inventory, results, check=True, forks=8)
    assert {h.name: tree(h.base) for h in hosts} == empty, "--check wrote on a host"
    assert checked.ok and checked.changed == 3
    out = capsys.readouterr().out
    assert "h2 | changed [3/9] env file" in out and "+MODE=dflash" in out  # would-be diff, host-prefixed

    first = play("converge.yaml", inventory, results, forks=8)
    assert first.ok and first.changed == 3
    for h in hosts:
        assert (h.base / "run" / "demo.env").stat().st_mode & 0o777 == 0o600
        assert f"host={h.name}" in (h.base / "app.conf").read_text()
        assert first.hosts[h.name].registered["host_facts"]["cpu"]["count"] == os.cpu_count()
    assert statuses(first)["h1"][7] == "skipped"  # no GPU: the when: is false
    converged = {h.name: tree(h.base) for h in hosts}

    second = play("converge.yaml", inventory, results, forks=1)
    assert second.ok and second.changed == 0
    assert all(s in ("ok", "skipped") for steps in statuses(second).values() for s in steps)
    rechecked = play("converge.yaml", inventory, results, check=True, forks=2)
    assert rechecked.changed == 0
    assert {h.name: tree(h.base) for h in hosts} == converged

    summary = json.loads((second.run_dir / "summary.json").read_text())
    assert set(summary) == {"run_id", "playbook", "check", "hosts", "changed", "failed"}
    assert summary["playbook"] == "converge" and summary["check"] is False
    assert summary["changed"] == 0 and summary["failed"] == 0
    step = summary["hosts"]["h1"]["steps"][0]
    assert set(step) == {"name", "step", "status", "changed", "message"}
    assert step["message"].startswith("directory exists with mode 0755")
    assert (results / "latest").resolve() == rechecked.run_dir.resolve()
    assert "h3 | ok      [5/9] config line" in (second.run_dir / "run.log").read_text()


def test_secret_never_appears(sshd_hosts, make_inventory, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPECOPS_TEST_TOKEN", TOKEN)
    hosts = sshd_hosts(1)
    inventory = make_inventory(
        hosts, host_fields={"h1": {"secrets": {"HF_TOKEN": {"env": "SPECOPS_TEST_TOKEN"}}}}
    )
    results = tmp_path / "results"
    checked = play("leak.yaml", inventory, results, check=True)
    result = play("leak.yaml", inventory, results)
    assert (hosts[0].base / "run" / "demo.env").read_text().count(f"HF_TOKEN={TOKEN}") == 1  # it did arrive
    assert not result.ok and statuses(result)["h1"] == ["changed", "changed", "changed", "changed", "failed"]
    out = capsys.readouterr().out
    shown = [out]
    for run in (checked, result):
        shown += [(run.run_dir / "run.log").read_text(), (run.run_dir / "summary.json").read_text()]
    for text in shown:
        assert TOKEN not in text
    assert "HF_TOKEN=********" in out  # the check-mode diff and the failure's stderr tail, masked
    assert "stderr: HF_TOKEN=********" in shown[3]


def test_host_down_mid_run_fails_alone(sshd_hosts, make_inventory, tmp_path: Path) -> None:
    hosts = sshd_hosts(3)
    gate = tmp_path / "gate"
    inventory = make_inventory(hosts, defaults={"vars": {"victim": "h2", "gate": str(gate)}})
    outcome: dict[str, RunResult] = {}
    runner = threading.Thread(
        target=lambda: outcome.setdefault("run", play("gate.yaml", inventory, tmp_path / "results", forks=3))
    )
    runner.start()
    deadline = time.monotonic() + 30
    while not (hosts[1].base / "at-gate").exists():
        assert time.monotonic() < deadline, "the victim never reached the gate"
        time.sleep(0.02)
    hosts[1].stop()  # the daemon and the session running the gate command die
    gate.touch()
    runner.join(timeout=60)
    result = outcome["run"]
    assert result.failed == 1 and not result.ok
    assert result.hosts["h2"].status == "failed"
    assert statuses(result)["h2"] == ["changed", "failed", "skipped", "skipped"]
    assert "unreachable" in result.hosts["h2"].steps[1].message
    for name in ("h1", "h3"):
        assert result.hosts[name].status == "changed"
        assert statuses(result)[name] == ["changed", "skipped", "changed", "changed"]
        assert (hosts[int(name[1]) - 1].base / "after" / "again").is_dir()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["failed"] == 1 and summary["hosts"]["h2"]["status"] == "failed"


@pytest.mark.parametrize("forks", [1, 4])
def test_many_hosts_serial_and_parallel_same_outcome(
    sshd_hosts, make_inventory, tmp_path: Path, forks: int
) -> None:
    hosts = sshd_hosts(4)
    inventory = make_inventory(hosts, defaults={"vars": {"victim": "nobody", "gate": "/nonexistent"}})
    result = play("gate.yaml", inventory, tmp_path / "results", forks=forks, limit="h1,h3,h4")
    assert (
        list(result.hosts) == ["h1", "h3", "h4"] and result.ok
    )  # in inventory order, whatever finished first
    assert statuses(result) == {
        name: ["changed", "skipped", "changed", "changed"] for name in ("h1", "h3", "h4")
    }
    assert not (hosts[1].base / "before").exists()  # not selected by --limit
