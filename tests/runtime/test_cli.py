"""`python -m ddtree_runtime generate|bench|cost-table` through real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_runtime.budgets import CostTable
from ddtree_runtime.tiny import TinyPair

pytestmark = pytest.mark.slow  # each test starts the CLI in a new process (torch import, load)

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ddtree_runtime", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture(scope="module")
def pair_args(tiny_pair: TinyPair) -> list[str]:
    """float32: the exactness the tests assert (the default is bf16 on CPUs with native bf16)."""
    return [
        "--target",
        str(tiny_pair.target),
        "--drafter",
        str(tiny_pair.drafter),
        "--device",
        "cpu",
        "--dtype",
        "float32",
    ]


def test_generate_json_matches_ar(pair_args: list[str]) -> None:
    outs = {}
    for run, mode, head in (("ar", "ar", "auto"), ("ddtree", "ddtree", "auto"), ("fp8", "ddtree", "fp8")):
        proc = cli(
            "generate",
            *pair_args,
            "--draft-head",
            head,
            "--mode",
            mode,
            "--budget",
            "16",
            "--prompt",
            "the city of war",
            "--max-new-tokens",
            "12",
            "--format",
            "json",
        )
        assert proc.returncode == 0, proc.stderr
        outs[run] = json.loads(proc.stdout)
    tree = outs["ddtree"]
    for key in (
        "output_ids",
        "text",
        "rounds",
        "accepted_per_round",
        "mean_accepted",
        "tokens_per_s",
        "phase_s",
    ):
        assert key in tree
    assert tree["output_ids"] == outs["ar"]["output_ids"] and len(tree["output_ids"]) == 12
    assert outs["fp8"]["output_ids"] == outs["ar"]["output_ids"]  # drafted through the head's FP8 copy
    assert tree["text"] == outs["ar"]["text"] and len(tree["text"].split()) == 12
    assert tree["rounds"] == len(tree["accepted_per_round"]) and tree["mean_accepted"] > 1
    assert set(tree["phase_s"]) == {"prefill", "draft", "tree", "verify", "walk", "compact", "round"}


def test_bench_prints_one_json_object_per_run(pair_args: list[str]) -> None:
    proc = cli(
        "bench",
        *pair_args,
        "--modes",
        "ar,dflash,ddtree",
        "--budgets",
        "4,16",
        "--prompt-ids",
        "5,6,7",
        "--max-new-tokens",
        "16",
        "--runs",
        "1",
        "--warmup",
        "0",
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["mode"], r["budget"]) for r in rows] == [
        ("ar", None),
        ("dflash", None),
        ("ddtree", 4),
        ("ddtree", 16),
    ]
    assert all(r["tokens"] == 16 and r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["mean_accepted"] == 1.0 and rows[3]["mean_accepted"] > 1.0


def test_errors_exit_2_with_the_fix(pair_args: list[str], tiny_pair: TinyPair, tmp_path: Path) -> None:
    proc = cli("generate", *pair_args, "--prompt-ids", ",".join(["5"] * 40), "--max-context", "48")
    assert proc.returncode == 2 and "max_context is 48" in proc.stderr and "Traceback" not in proc.stderr
    bad = tmp_path / "drafter"
    bad.mkdir()
    raw = json.loads((tiny_pair.drafter / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**raw, "hidden_size": 48}))
    (bad / "model.safetensors").write_bytes((tiny_pair.drafter / "model.safetensors").read_bytes())
    proc = cli("generate", "--target", str(tiny_pair.target), "--drafter", str(bad), "--prompt", "the")
    assert proc.returncode == 2 and "DFL040" in proc.stderr and "Traceback" not in proc.stderr


def test_tiny_reuses_a_complete_pair(tiny_pair: TinyPair) -> None:
    """The writer itself runs in the session fixture; here the CLI wiring, which must not refit."""
    proc = cli("tiny", "--out", str(tiny_pair.target.parent))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"target": str(tiny_pair.target), "drafter": str(tiny_pair.drafter)}


def test_cost_table_times_the_batched_rounds_into_the_table_the_load_policy_reads(
    pair_args: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "costs" / "table.json"
    proc = cli("cost-table", *pair_args, "--max-batch", "3", "--budgets", "1,2", "--context", "8", "--reps", "1",
               "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ddtree/2 x   3" in proc.stderr  # progress, one line a round shape (batches 1 and 3)
    table = CostTable.load(out)  # what `serve --cost-table` loads
    assert table.rows == (3, 6, 9) and table.draft_slots == (1, 3)
    assert json.loads(proc.stdout)["out"] == str(out)
    bad = cli("cost-table", *pair_args, "--budgets", "4", "--out", str(tmp_path / "x.json"))
    assert bad.returncode == 2 and "fix: e.g. --budgets 1,2,4,8,16" in bad.stderr
    assert not (tmp_path / "x.json").exists()
