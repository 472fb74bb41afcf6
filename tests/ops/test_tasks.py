"""The Fabric tasks through a real ``fab`` subprocess from the repo root, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from invoke.exceptions import Exit

from ops.tasks import PLAYBOOKS, run_bench_file

REPO = Path(__file__).resolve().parents[2]
FAB = Path(sys.executable).parent / "fab"
CONVERGE = "tests/ops/playbooks/converge.yaml"


def fab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FAB), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_fab_list_shows_tasks_with_help() -> None:
    done = fab("--list")
    assert done.returncode == 0, done.stderr
    for name in ("facts", "play", "provision", "status"):
        assert f"  {name} " in done.stdout
    assert "Run any playbook FILE over the inventory." in done.stdout
    helped = fab("--help", "play")
    for option in ("--limit", "--check", "--inventory", "--forks", "--tags"):
        assert option in helped.stdout


def test_every_task_refuses_a_bad_option_value_with_one_line_and_exit_2() -> None:
    from ops.tasks import ns

    runs = {  # all at once: each is a fresh fab process
        name: subprocess.Popen(
            [str(FAB), name, *(["missing.yaml"] if name == "play" else []), "--forks", "x"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in sorted(ns.tasks)
    }
    for name, proc in runs.items():
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 2, (name, stderr)
        assert stderr.strip() == (
            "error: --forks must be a whole number of hosts in parallel, got 'x' (fix: --forks 8)"
        ), (name, stderr)
    done = fab("bench", "--matrix", "no-such-matrix.yaml")
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: --matrix no-such-matrix.yaml: no such file (fix: e.g. --matrix playbooks/bench-matrix.yaml)"
    ), done.stderr


def test_fab_play_converges_then_changes_nothing(sshd_hosts, make_inventory, tmp_path: Path) -> None:
    inventory = make_inventory(sshd_hosts(1), local=True)
    results = tmp_path / "results"
    first = fab("play", CONVERGE, "--inventory", str(inventory), "--results", str(results))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 host(s): 2 changed, 0 failed" in first.stdout
    second = fab("play", CONVERGE, "--inventory", str(inventory), "--results", str(results), "--forks", "1")
    assert second.returncode == 0 and "2 host(s): 0 changed, 0 failed" in second.stdout
    summary = json.loads((results / "latest" / "summary.json").read_text())
    assert set(summary["hosts"]) == {"h1", "local"} and summary["changed"] == 0
    limited = fab(
        "play",
        CONVERGE,
        "--inventory",
        str(inventory),
        "--results",
        str(results),
        "--limit",
        "local",
        "--check",
    )
    assert limited.returncode == 0 and "1 host(s): 0 would change, 0 failed" in limited.stdout


def test_fab_exit_codes(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  local: {{connection: local, base: {tmp_path / 'base'}}}\n")
    failing = tmp_path / "fail.yaml"
    failing.write_text(
        "name: fail\nsteps:\n  - name: boom\n    step: command\n    args: {cmd: 'echo bad >&2; exit 7'}\n"
    )
    done = fab("play", str(failing), "--inventory", str(inventory), "--results", str(tmp_path / "r"))
    assert done.returncode == 1
    assert "FAILED local / boom (command): command exited 7" in done.stdout and "stderr: bad" in done.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\nsteps:\n  - step: directory\n    args: {paht: /x}\n")
    done = fab("play", str(broken), "--inventory", str(inventory))
    assert done.returncode == 2
    assert f"error: {broken}:4: step 'directory': unknown argument 'paht'" in done.stderr
    done = fab("play", str(failing), "--inventory", str(inventory), "--limit", "nosuchhost")
    assert done.returncode == 2 and "nosuchhost" in done.stderr


def test_fab_facts_status_and_provision_check(sshd_hosts, make_inventory, tmp_path: Path) -> None:
    hosts = sshd_hosts(1)
    inventory = make_inventory(hosts, local=True, host_vars={"h1": {"profile": "cpu"}})
    results = tmp_path / "results"
    done = fab("facts", "--inventory", str(inventory), "--results", str(results))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "host facts" in done.stdout and "│ h1 " in done.stdout and "│ local " in done.stdout
    saved = json.loads((results / "latest" / "facts.json").read_text())
    assert set(saved) == {"h1", "local"} and saved["h1"]["python"]["version"].startswith("3.")
    assert (results / "latest" / "h1" / "facts.json").exists()
    done = fab("status", "--inventory", str(inventory), "--limit", "h1", "--results", str(results))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "host status" in done.stdout and "release none: not running" in done.stdout
    before = sorted(p.name for p in hosts[0].base.iterdir())
    done = fab(
        "provision", "--check", "--inventory", str(inventory), "--limit", "h1", "--results", str(results)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(check mode)" in done.stdout
    assert sorted(p.name for p in hosts[0].base.iterdir()) == before


def test_bench_resume_is_confined_to_the_results_folder(tmp_path: Path, capsys) -> None:
    """Issue 27, item 8: `fab bench --resume` names a run of the results folder, never another folder
    (which the resumed run would write into): refused with exit 2 before any host is touched."""
    results = tmp_path / "results"
    (results / "20261204-000000-bench-abcd").mkdir(parents=True)
    outside = tmp_path / "x"
    outside.mkdir()
    (results / "latest").symlink_to(outside)  # a latest link that points out
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  local: {{connection: local, base: {tmp_path / 'base'}}}\n")

    def resume(run_id: str) -> str:
        with pytest.raises(Exit) as stopped:
            run_bench_file(
                PLAYBOOKS / "bench.yaml", inventory=str(inventory), results=str(results), resume=run_id
            )
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1
        return err

    for run_id in ("../x", str(outside), "/etc", "latest", "20261204-000000-bench-abcd/.."):
        assert resume(run_id).startswith(f"error: --resume {run_id}: not a run of {results}")
    assert "no run directory" in resume("nope")
    assert not any(outside.iterdir()) and not (tmp_path / "base").exists()
