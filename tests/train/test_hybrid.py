"""Training for a hybrid (Qwen3.5-layout) target, end to end on the CPU through the command: a new
drafter with sliding and full layers beats an untrained one in τ measured by the runtime; fine-tuning
it (`--init-from`) lints it first and starts from its weights; a drafter that does not fit is refused
before any work; `--estimate` prints the cost and stops; a new drafter for Qwen3.6-27B has z-lab's
layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from ddtree_runtime.config import Qwen3_5Config
from ddtree_runtime.loader import load_drafter, load_target
from ddtree_runtime.tiny import TinyPair
from ddtree_runtime.tokenizer import Tokenizer
from ddtree_runtime.train.__main__ import main
from ddtree_runtime.train.checkpoint import Layout, drafter_config, find_mask_token, new_drafter, save_drafter
from ddtree_runtime.train.evaluate import measure_tau
from tests.lint import qwen36
from tests.train.test_pipeline import write_prompts

REPO = Path(__file__).resolve().parents[2]

LAYOUT = Layout(
    layers=2, block_size=6, heads=4, kv_heads=2, head_dim=16, sliding_window=8, target_layer_ids=[1, 2]
)
FLAGS = [
    "--device", "cpu", "--min-chars", "4", "--held-out", "0.15", "--response-tokens", "16",
    "--draft-layers", "2", "--block-size", "6", "--draft-heads", "4", "--draft-kv-heads", "2",
    "--draft-head-dim", "16", "--sliding-window", "8", "--target-layer-ids", "1,2", "--lr", "3e-3",
    "--micro-batch", "2", "--anchors", "8", "--save-every", "20", "--log-every", "1",
    "--eval-prompts", "4", "--eval-budgets", "16", "--eval-tokens", "24", "--save-dtype", "float32",
]  # fmt: skip


def _curve(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "train_log.jsonl").read_text().splitlines()]


def _untrained_tau(pair: TinyPair, run: Path, where: Path) -> dict[str, float]:
    target = load_target(pair.target, torch.device("cpu"), torch.float32)
    raw = drafter_config(target.config, LAYOUT.resolve(target.config), find_mask_token(pair.target))
    save_drafter(new_drafter(target.config, pair.target, raw, torch.device("cpu")), raw, where, torch.float32)
    tok = Tokenizer(pair.target)
    held = [
        json.loads(line)["prompt"]
        for line in (run / "data" / "prompts.held_out.jsonl").read_text().splitlines()
    ]
    drafter = load_drafter(where, torch.device("cpu"), torch.float32)
    return measure_tau(target, drafter, [tok.prompt_ids(p) for p in held[:4]], [16], 24)


def test_hybrid_target_trains_end_to_end_and_fine_tunes(
    hybrid_raw_pair: TinyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = write_prompts(tmp_path / "prompts.txt", n=32)
    target = str(hybrid_raw_pair.target)
    run = tmp_path / "run"
    assert (
        main(["--target", target, "--prompts", str(prompts), "--out", str(run), "--steps", "60", *FLAGS]) == 0
    )
    out, err = capsys.readouterr()
    tau = json.loads(out.strip().splitlines()[-1])["eval"]["tau"]
    assert "cost: train" in err and "lint: clean" in err
    config = json.loads((run / "drafter" / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    assert config["use_sliding_window"] and config["sliding_window"] == 8 and config["rope_theta"] == 10000.0
    base = _untrained_tau(hybrid_raw_pair, run, tmp_path / "untrained")
    assert tau["ddtree@16"] > base["ddtree@16"] + 0.5 and tau["dflash"] > base["dflash"], (tau, base)

    fine = tmp_path / "fine"
    start = ["--target", target, "--prompts", str(prompts), "--limit", "16", "--steps", "5"]
    assert main([*start, "--out", str(fine), "--init-from", str(run / "drafter"), *FLAGS]) == 0
    _, err = capsys.readouterr()
    assert "lint (--init-from): clean" in err and f"init: {run / 'drafter'}" in err and "lint: clean" in err
    assert _curve(fine)[0] < 0.5 * _curve(run)[0]  # it starts where the first run ended, not afresh
    tuned = json.loads((fine / "drafter" / "config.json").read_text())
    assert {k: v for k, v in tuned.items() if k != "torch_dtype"} == {
        k: v for k, v in config.items() if k != "torch_dtype"
    }

    bad = tmp_path / "bad"
    shutil.copytree(run / "drafter", bad)
    config["dflash_config"]["mask_token_id"] = 2  # <|im_end|>, the target's EOS: DFL012
    (bad / "config.json").write_text(json.dumps(config))
    assert main([*start, "--out", str(tmp_path / "never"), "--init-from", str(bad), *FLAGS]) == 2
    _, err = capsys.readouterr()
    assert "does not fit the target" in err and "DFL012" in err
    assert not (tmp_path / "never").exists()


def test_estimate_prints_the_cost_and_stops(
    hybrid_raw_pair: TinyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = write_prompts(tmp_path / "prompts.txt", n=20)
    run = tmp_path / "run"
    args = ["--target", str(hybrid_raw_pair.target), "--prompts", str(prompts), "--out", str(run)]
    assert main([*args, "--steps", "500", "--extraction", "offline", "--estimate", *FLAGS]) == 0
    out, err = capsys.readouterr()
    cost = json.loads(out.strip().splitlines()[-1])
    assert cost["samples"] == 17 and cost["steps"] == 500 and cost["offline"]
    assert cost["hours"]["train"] > 0 and cost["features_bytes"] > 0
    assert "cost: features offline shards" in err and "cost: regenerate" in err
    assert not (run / "data" / "responses").exists() and not (run / "train_state.pt").exists()


def test_a_new_drafter_for_qwen36_27b_has_z_labs_layout() -> None:
    cfg = Qwen3_5Config.from_dict(qwen36.target(), Path("<qwen3.6-27b>/config.json"))
    raw = drafter_config(cfg, Layout().resolve(cfg), qwen36.MASK)
    spec = yaml.safe_load((REPO / "drafter_config" / "specs" / "qwen3.6-27b-dflash.yaml").read_text())
    got = {**raw, **raw["dflash_config"]}
    assert {k: got.get(k) for k in spec["values"]} == spec["values"]
