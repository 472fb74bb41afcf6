"""`fab deploy` end to end: real sshd hosts, the real DDTree server on the CPU, real HTTP.

The playbooks run through ``run_file``, the function the fab tasks call. Each host's venv reuses
this controller's torch (``venv_site_packages: [controller]``); the server loads the tiny pair.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from ops.steps.release import COMPLETE
from ops.tasks import run_file
from ops.wheel import REPO_ROOT
from tests.deploy.helpers import (
    CRASH_AT_START,
    CRASH_ON_IMPORT,
    MAIN,
    Sampler,
    argv_holding,
    complete,
    deploy,
    free_port,
    healthy,
    host_vars,
    link,
    running_release,
    server_pid,
    step,
    with_crash,
)

pytestmark = pytest.mark.slow  # each test deploys real releases and servers (20-90 s)


def test_deploy_redeploy_new_commit_broken_release_and_rollback(
    sshd_hosts, make_inventory, tiny_pair, checkout, servers, tmp_path, monkeypatch
):
    token = "hf_" + secrets.token_hex(20)
    monkeypatch.setenv("SPECOPS_TEST_HF_TOKEN", token)
    (h1,) = sshd_hosts(1)
    base = servers(h1.base)
    port = free_port()
    inventory = make_inventory(
        [h1],
        host_vars={"h1": host_vars(tiny_pair, checkout, port)},
        host_fields={"h1": {"secrets": {"HF_TOKEN": {"env": "SPECOPS_TEST_HF_TOKEN"}}}},
    )
    results = tmp_path / "results"

    # First deploy, then a second one that changes nothing: same pid. No process ever holds the
    # token on its command line meanwhile.
    with Sampler(lambda: argv_holding(token), interval=0.05) as argv:
        first = deploy(inventory, results)
        assert first.ok, first.summary()
        pid = step(first, "h1", "service").data["pid"]
        release_a = link(base, "current")
        assert running_release(pid) == release_a and complete(port)["choices"]
        second = deploy(inventory, results)
    assert second.ok and second.hosts["h1"].status == "ok", second.summary()
    assert all(not s.changed for s in second.hosts["h1"].steps)
    assert server_pid(base) == pid == step(second, "h1", "service").data["pid"]
    assert not [hit for hits in argv.samples for hit in hits], "the token appeared on a command line"

    # The token reached the server through the 0600 environment file only, and no log holds it.
    env_file = base / "run" / "specops-ddtree.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600 and token in env_file.read_text()
    assert f"HF_TOKEN={token}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    logs = [*results.rglob("*.log"), *results.rglob("*.json"), *(base / "logs").iterdir(), h1.log_path]
    assert logs and not [p for p in logs if token in p.read_text(errors="replace")]

    # A new commit, with new settings: a new release, a new process running it, answering.
    env_a = env_file.read_text()
    checkout.commit(
        "a new commit",
        {"ddtree_runtime/__init__.py": checkout.read("ddtree_runtime/__init__.py") + "# release B\n"},
    )
    inventory = make_inventory(
        [h1],
        host_vars={"h1": host_vars(tiny_pair, checkout, port, serve_env={"SPECOPS_SERVE_TEMPERATURE": 0.5})},
        host_fields={"h1": {"secrets": {"HF_TOKEN": {"env": "SPECOPS_TEST_HF_TOKEN"}}}},
    )
    third = deploy(inventory, results)
    assert third.ok, third.summary()
    release_b = link(base, "current")
    pid_b = server_pid(base)
    assert release_b != release_a and pid_b != pid and running_release(pid_b) == release_b
    assert link(base, "previous") == release_a and complete(port)["choices"]

    original_main = checkout.read(MAIN)
    # A release that cannot even import is refused before anything stops: B answers throughout.
    checkout.commit("broken on import", {MAIN: with_crash(original_main, CRASH_ON_IMPORT)})
    with Sampler(lambda: healthy(port), interval=0.05) as health:
        refused = deploy(inventory, results)
    failure = step(refused, "h1", "service")
    assert not refused.ok and "refused before any restart" in failure.message
    assert "crashes on import" in failure.stderr
    assert all(health.samples) and server_pid(base) == pid_b and link(base, "current") == release_b

    # A release that crashes at start-up: switched, started, dead -> back to B automatically,
    # with the broken release's log tail in the report.
    checkout.commit("broken at start-up", {MAIN: with_crash(original_main, CRASH_AT_START)})
    with Sampler(lambda: healthy(port), interval=0.05) as health:
        broken = deploy(inventory, results)
    failure = step(broken, "h1", "service")
    assert not broken.ok and f"rolled back to {release_b}" in failure.message, failure.message
    assert "crashes at start-up" in failure.stderr
    assert health.samples[0] and health.samples[-1]
    assert link(base, "current") == release_b and link(base, "previous") == release_a
    assert running_release(server_pid(base)) == release_b and complete(port)["choices"]

    # fab rollback: back one release on purpose, with the settings it answered with (its env file
    # without the newer SPECOPS_SERVE_TEMPERATURE); fab status reports it.
    assert "SPECOPS_SERVE_TEMPERATURE=0.5\n" in env_file.read_text()
    back = deploy(inventory, results, "rollback.yaml")
    assert back.ok, back.summary()
    assert link(base, "current") == release_a and link(base, "previous") == release_b
    assert env_file.read_text() == env_a
    pid_a = server_pid(base)
    assert running_release(pid_a) == release_a and complete(port)["choices"]
    status = deploy(inventory, results, "status.yaml")  # fab status
    info = status.hosts["h1"].registered["service_status"]
    assert info["release"] == release_a == info["running_release"] and info["pid"] == pid_a
    assert info["health"] == 200 and info["uptime_s"] >= 0 and info["backend"] == "supervisor"
    assert info["metrics"]["requests"] >= 1 and "mean_acceptance_length" in info["metrics"]

    # Pruning to one release still keeps current (A) and previous (B); the broken ones go.
    prune = tmp_path / "prune.yaml"
    prune.write_text(
        "name: prune\nsteps:\n  - step: release_prune\n    args: {base: '{{ base }}', keep: 1}\n"
    )
    assert run_file(prune, inventory=str(inventory), results=str(results)).ok
    assert sorted(p.name for p in (base / "releases").iterdir()) == sorted([release_a, release_b])


def test_link_cut_mid_deploy_then_rerun_converges(
    sshd_hosts, make_inventory, tiny_pair, checkout, servers, tmp_path
):
    (h1,) = sshd_hosts(1)
    base = servers(h1.base)
    port = free_port()
    inventory = make_inventory([h1], host_vars={"h1": host_vars(tiny_pair, checkout, port)})
    results = tmp_path / "results"
    assert deploy(inventory, results).ok
    release_a = link(base, "current")

    def current_is_complete() -> bool:
        target = link(base, "current")
        return target is not None and (base / "releases" / target / COMPLETE).is_file()

    def deploy_cut_when(condition) -> tuple[object, bool]:
        """Deploy, killing the host's sshd (and its sessions) as soon as ``condition`` holds."""
        done, cut = threading.Event(), threading.Event()

        def watch() -> None:
            while not done.is_set():
                if condition():
                    h1.stop()
                    cut.set()
                    return
                time.sleep(0.002)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        result = deploy(inventory, results)
        done.set()
        watcher.join()
        return result, cut.is_set()

    checkout.commit(
        "release B",
        {"ddtree_runtime/__init__.py": checkout.read("ddtree_runtime/__init__.py") + "# release B\n"},
    )
    with Sampler(current_is_complete, interval=0.005) as links:
        # Cut 1: while the release is being assembled on the host.
        cut, was_cut = deploy_cut_when(
            lambda: any(p.name.startswith(".partial-") for p in (base / "releases").iterdir())
        )
        assert was_cut and not cut.ok and link(base, "current") == release_a
        h1.start()
        # Cut 2: right after `current` moved, while the server is being restarted.
        cut, was_cut = deploy_cut_when(lambda: link(base, "current") != release_a)
        assert was_cut and not cut.ok
        h1.start()
        rerun = deploy(inventory, results)
    assert rerun.ok, rerun.summary()
    assert all(links.samples), "current pointed at an incomplete release"
    release_b = link(base, "current")
    assert release_b != release_a and running_release(server_pid(base)) == release_b
    assert complete(port)["choices"]
    assert deploy(inventory, results).hosts["h1"].status == "ok"


def test_fab_deploy_on_the_local_demo_host(servers, tmp_path):
    """The embedded default: the local demo host, no checkpoints given -> the committed demo pair
    (demo_pair/) is uploaded to the host, the runtime deployed from this checkout, proven by one
    completion."""
    base = servers(tmp_path / "demo")
    port = free_port()
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "local": {
                        "connection": "local",
                        "base": str(base),
                        "vars": {
                            "profile": "cpu",
                            "serve": {"port": port},
                            "min_tau": 2,  # the acceptance gate, on the pair's own held-out prompts
                            "acceptance": {
                                "prompts": "../demo_pair/held_out_prompts.jsonl",
                                "requests": 2,
                                "max_tokens": 32,
                            },
                        },
                    }
                }
            }
        )
    )
    fab = [
        str(Path(sys.executable).with_name("fab")),
        "deploy",
        "--inventory",
        str(inventory),
        "--results",
        str(tmp_path / "results"),
    ]

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*fab, *extra],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "COLUMNS": "200"},
        )

    checked = run("--check")  # probes and plans only: the host stays untouched
    assert checked.returncode == 0 and "would change" in checked.stdout, checked.stdout[-3000:]
    assert not base.exists()
    done = run()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (base / "models" / "demo" / "DONE").read_text().startswith("source ")  # the committed pair
    assert (base / "models" / "demo" / "drafter" / "model.safetensors").read_bytes() == (
        REPO_ROOT / "demo_pair" / "drafter" / "model.safetensors"
    ).read_bytes()
    assert complete(port)["choices"]
    # The acceptance gate measured the committed pair's real tau from our server's own counters.
    gate = json.loads((base / "run" / "specops-ddtree.acceptance.json").read_text())["modes"]["ddtree"]
    assert gate["tau"] >= 2 and gate["source"] == "inventory min_tau", gate
    assert f"acceptance: ddtree tau {gate['tau']:.2f} >= 2 (inventory min_tau)" in done.stdout
