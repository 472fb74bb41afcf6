"""`fab train-drafter` against real sshd hosts on the CPU: the pipeline runs detached on the host,
progress and results come home to results/<run-id>/<host>/, a second run changes nothing, and
`estimate: true` brings the cost home without training. Over
two hosts it is one gloo job (torchrun's c10d rendezvous on the rank-0 host) whose loss curve is
the single-host run's, and after a host drops mid-training a rerun resumes from the checkpoint."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from ddtree_runtime.tiny import TinyPair
from ops.runner import REPO_ROOT
from ops.tasks import PLAYBOOKS, run_bench_file
from tests.sshd import SshdHost, _descendants
from tests.train.test_pipeline import OPTIONS, Reference, loss_curve, write_prompts


def _host_vars(target: Path, prompts: Path, options: dict[str, object]) -> dict[str, object]:
    return {
        "train_python": sys.executable,
        "train_site": str(REPO_ROOT),
        "train_target": str(target),
        "train_prompts": str(prompts),
        "train_name": "tiny",
        "train_options": options,
    }


@pytest.mark.slow
def test_fab_train_drafter_twice(sshd_hosts, make_inventory, raw_pair: TinyPair, tmp_path: Path) -> None:
    (h1,) = sshd_hosts(1)
    prompts = write_prompts(tmp_path / "prompts.txt", n=30)
    options = {
        "steps": 30,
        "block-size": 6,
        "min-chars": 4,
        "held-out": 0.15,
        "response-tokens": 16,
        "lr": 3e-3,
        "micro-batch": 2,
        "anchors": 8,
        "eval-prompts": 2,
        "eval-budgets": 8,
        "eval-tokens": 16,
        "device": "cpu",
    }
    inventory = make_inventory([h1], host_vars={"h1": _host_vars(raw_pair.target, prompts, options)})
    results = tmp_path / "results"

    first, run_dir = run_bench_file(
        PLAYBOOKS / "train-drafter.yaml", inventory=str(inventory), results=str(results), live=False
    )
    assert first.ok, first.summary()
    step = [s for s in first.hosts["h1"].steps if s.step == "train_drafter"][-1]
    assert step.changed and "tau" in step.message
    home = run_dir / "h1"
    assert (home / "drafter" / "model.safetensors").stat().st_size > 0
    assert json.loads((home / "drafter" / "config.json").read_text())["block_size"] == 6
    assert "dflash" in json.loads((home / "eval.json").read_text())["tau"]
    assert "train 30/30 loss" in (home / "train.log").read_text()
    host_run = Path(h1.base) / "train" / "tiny"
    stamps = {p: p.stat().st_mtime_ns for p in host_run.rglob("*") if p.is_file()}

    second, _ = run_bench_file(
        PLAYBOOKS / "train-drafter.yaml", inventory=str(inventory), results=str(results), live=False
    )
    assert second.ok and second.hosts["h1"].status == "ok", second.summary()
    assert all(not s.changed for s in second.hosts["h1"].steps)
    assert {p: p.stat().st_mtime_ns for p in host_run.rglob("*") if p.is_file()} == stamps

    estimate = make_inventory(
        [h1], host_vars={"h1": _host_vars(raw_pair.target, prompts, {**options, "estimate": True})}
    )
    third, run_dir = run_bench_file(
        PLAYBOOKS / "train-drafter.yaml", inventory=str(estimate), results=str(results), live=False
    )
    assert third.ok, third.summary()
    assert "estimate only: regenerate" in third.hosts["h1"].steps[-1].message
    assert json.loads((run_dir / "h1" / "cost.json").read_text())["steps"] == 30


def _drop_when_trained_past(leader_run: Path, step: int, host: SshdHost, run: Path) -> threading.Thread:
    """Kill every process of `host`'s run (the host dropping out) once the leader logged `step`."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        curve = leader_run / "train_log.jsonl"
        while time.monotonic() < deadline:
            if curve.exists() and any(json.loads(x)["step"] >= step for x in curve.read_text().splitlines()):
                pid = int((run / "train.pid").read_text())
                for victim in [*_descendants(pid), pid]:
                    os.kill(victim, signal.SIGKILL)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_two_hosts_are_one_job_with_the_single_host_curve_and_resume_after_a_host_drops(
    sshd_hosts, make_inventory, raw_pair: TinyPair, reference: Reference, tmp_path: Path
) -> None:
    h1, h2 = sshd_hosts(2)
    with socket.socket() as s:
        s.bind((h1.address, 0))
        port = s.getsockname()[1]
    job = {
        **_host_vars(raw_pair.target, reference.prompts, OPTIONS),
        "train_nodes": ["h1", "h2"],
        "train_rdzv": f"{h1.address}:{port}",
    }
    inventory = make_inventory([h1, h2], groups={"trainers": {"hosts": ["h1", "h2"], "vars": job}})
    results = tmp_path / "results"
    runs = {h.name: Path(h.base) / "train" / "tiny" for h in (h1, h2)}

    def fab():
        return run_bench_file(
            PLAYBOOKS / "train-drafter.yaml", inventory=str(inventory), results=str(results), live=False
        )

    dropper = _drop_when_trained_past(runs["h1"], 21, h2, runs["h2"])  # the checkpoint of step 20 is out
    dropped, _ = fab()
    dropper.join()
    assert not dropped.ok
    assert "stopped without an exit code" in dropped.hosts["h2"].steps[-1].message
    assert "training run exited" in dropped.hosts["h1"].steps[-1].message

    resumed, run_dir = fab()
    assert resumed.ok, "\n".join((run / "train.log").read_text()[-3000:] for run in runs.values())
    log = (runs["h1"] / "train.log").read_text()
    assert "train: world size 2 (DDP)" in log and "resumed at step" in log
    curve, want = loss_curve(runs["h1"]), loss_curve(reference.run)
    assert [s for s, _ in curve] == [s for s, _ in want] == list(range(1, 61))
    assert max(abs(a - b) for (_, a), (_, b) in zip(curve, want, strict=True)) < 1e-4, (curve, want)
    assert (run_dir / "h1" / "drafter" / "model.safetensors").exists()
    assert json.loads((run_dir / "h2" / "summary.json").read_text())["eval"]["tau"]
    assert not (run_dir / "h2" / "drafter").exists() and not (runs["h2"] / "train_state.pt").exists()

    again, _ = fab()
    assert again.ok and not any(s.changed for h in again.hosts.values() for s in h.steps), again.summary()
