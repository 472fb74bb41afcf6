"""DFlash training on the tiny target: the loss falls on a fixed batch, the trained drafter's first
draft matches the target's argmax more often than the untrained one's, and a run stopped at a
checkpoint and resumed replays the uninterrupted run step for step."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.engine import Engine
from ddtree_runtime.loader import load_target
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.target import Target
from ddtree_runtime.tiny import TinyPair
from ddtree_runtime.train.checkpoint import Layout, drafter_config, find_mask_token, new_drafter
from ddtree_runtime.train.distributed import join
from ddtree_runtime.train.extract import Sample
from ddtree_runtime.train.forward import draft_blocks
from ddtree_runtime.train.trainer import BlockLoss, TrainSpec, position_weights, sample_anchors, train

JOB = join("cpu")


class Killed(Exception):
    pass


def _setup(pair: TinyPair) -> tuple[Target, DFlashDrafter]:
    target = load_target(pair.target, torch.device("cpu"), torch.float32)
    layout = Layout(layers=1, block_size=6, target_layer_ids=[1, 2]).resolve(target.config)
    raw = drafter_config(target.config, layout, find_mask_token(pair.target))
    return target, new_drafter(target.config, pair.target, raw, torch.device("cpu"))


def _greedy(target: Target, n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    engine = Engine(target, None, max_context=64)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(5, 69) for _ in range(rng.randint(2, 6))]
        ids = prompt + engine.generate(prompt, mode="ar", max_new_tokens=24, eos_ids=()).output_ids
        out.append(Sample(torch.tensor(ids), len(prompt)))
    return out


def _first_position_agreement(target: Target, drafter: DFlashDrafter, samples: list[Sample]) -> float:
    hits = total = 0
    with torch.no_grad():
        for s in samples:
            t = s.tokens.shape[0]
            target.setup_caches(t, drafter.config.target_layer_ids)
            logits, feats = target(s.tokens, torch.arange(t), 0, None, TorchBackend())
            anchors = torch.arange(s.prompt_len, t - 1)
            hidden = draft_blocks(drafter, feats, s.tokens, anchors, target.embed_tokens.weight)
            draft = drafter.logits(hidden[:, 1], target.lm_head).argmax(-1)
            hits += int((draft == logits[anchors].argmax(-1)).sum())
            total += anchors.shape[0]
    return hits / total


def test_helpers() -> None:
    w = position_weights(5, 2.0, torch.device("cpu"))
    assert w[0] == 1.0 and torch.all(w[1:] < w[:-1])
    anchors = sample_anchors(4, 10, 3, random.Random(0))
    assert len(anchors) == 3 and all(4 <= a <= 8 for a in anchors) and anchors == sorted(anchors)
    assert sample_anchors(9, 10, 3, random.Random(0)) == []


def test_a_micro_batch_without_anchors_still_reaches_every_weight(raw_pair: TinyPair) -> None:
    target, drafter = _setup(raw_pair)
    loss, weight = BlockLoss(drafter, target, 4.0)([])  # every sequence was too short
    loss.backward()
    assert float(weight) == 0 and all(p.grad is not None for p in drafter.parameters())


def test_loss_decreases_on_a_fixed_batch(raw_pair: TinyPair, tmp_path: Path) -> None:
    target, drafter = _setup(raw_pair)
    batch = _greedy(target, 2, seed=0)
    spec = TrainSpec(
        steps=30, lr=3e-3, warmup_steps=2, micro_batch=2, anchors=8, save_every=1000, log_every=1000
    )
    losses = train(JOB, drafter, target, batch, spec, tmp_path)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


@pytest.mark.slow
def test_training_beats_untrained_and_a_resume_replays_the_run(raw_pair: TinyPair, tmp_path: Path) -> None:
    target, drafter = _setup(raw_pair)
    data, held = _greedy(target, 24, seed=1), _greedy(target, 6, seed=2)
    before = _first_position_agreement(target, drafter, held)
    spec = TrainSpec(steps=60, lr=3e-3, warmup_steps=5, micro_batch=4, anchors=8, save_every=20, log_every=1)
    whole = train(JOB, drafter, target, data, spec, tmp_path / "whole")
    after = _first_position_agreement(target, drafter, held)
    assert after > before + 0.2, (before, after)

    def killed_after_41(message: str) -> None:  # the checkpoint of step 40 is the last one
        if message.startswith("train 41/"):
            raise Killed

    _, stopped = _setup(raw_pair)
    with pytest.raises(Killed):
        train(JOB, stopped, target, data, spec, tmp_path / "cut", log=killed_after_41)
    _, resumed = _setup(raw_pair)  # a fresh process: new drafter, state from the checkpoint
    lines: list[str] = []
    rest = train(JOB, resumed, target, data, spec, tmp_path / "cut", log=lines.append)
    assert lines[0].startswith("resumed at step 40/60")
    assert rest == whole[40:]  # the same anchors on the same samples: the same run
    curve = [json.loads(line) for line in (tmp_path / "cut" / "train_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in curve] == list(range(1, 61))
    assert [row["loss"] for row in curve] == whole
