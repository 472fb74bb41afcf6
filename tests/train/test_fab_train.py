"""`fab train-drafter` against a real sshd host on the CPU: the pipeline runs detached on the host,
progress and results come home to results/<run-id>/<host>/, and a second run changes nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ddtree_runtime.tiny import TinyPair
from ops.runner import REPO_ROOT
from ops.tasks import PLAYBOOKS, run_bench_file
from tests.train.test_pipeline import write_prompts


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
    inventory = make_inventory(
        [h1],
        host_vars={
            "h1": {
                "train_python": sys.executable,
                "train_site": str(REPO_ROOT),
                "train_target": str(raw_pair.target),
                "train_prompts": str(prompts),
                "train_name": "tiny",
                "train_options": options,
            }
        },
    )
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
