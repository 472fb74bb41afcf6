"""DFlash training on the tiny target: the loss falls on a fixed batch, the trained drafter's first
draft matches the target's argmax more often than the untrained one's, and a resumed run continues
from its checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from ddtree_runtime.engine import Engine
from ddtree_runtime.loader import load_target
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.qwen3 import Qwen3
from ddtree_runtime.tiny import TinyPair
from ddtree_runtime.train.checkpoint import drafter_config, find_mask_token, new_drafter
from ddtree_runtime.train.extract import Sample
from ddtree_runtime.train.forward import drafter_blocks, target_forward
from ddtree_runtime.train.trainer import TrainSpec, position_weights, sample_anchors, train


def _setup(pair: TinyPair) -> tuple[Qwen3, DFlashDrafter, dict[str, object]]:
    target = load_target(pair.target, torch.device("cpu"), torch.float32)
    raw = drafter_config(pair.target, 1, 6, find_mask_token(pair.target), [1, 2])
    return target, new_drafter(target, raw, pair.target / "unused"), raw


def _greedy(target: Qwen3, n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    engine = Engine(target, None, max_context=64)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(5, 69) for _ in range(rng.randint(2, 6))]
        ids = prompt + engine.generate(prompt, mode="ar", max_new_tokens=24, eos_ids=()).output_ids
        out.append(Sample(torch.tensor(ids), len(prompt)))
    return out


def _first_position_agreement(target: Qwen3, drafter: DFlashDrafter, samples: list[Sample]) -> float:
    hits = total = 0
    with torch.no_grad():
        for s in samples:
            logits, feats = target_forward(target, s.tokens[None], drafter.config.target_layer_ids)
            anchors = torch.arange(s.prompt_len, s.tokens.shape[0] - 1)
            hidden = drafter_blocks(drafter, feats[0], s.tokens, anchors, target.embed_tokens.weight)
            draft = drafter.logits(hidden[:, 1], target.lm_head).argmax(-1)
            hits += int((draft == logits[0, anchors].argmax(-1)).sum())
            total += anchors.shape[0]
    return hits / total


def test_helpers() -> None:
    w = position_weights(5, 2.0, torch.device("cpu"))
    assert w[0] == 1.0 and torch.all(w[1:] < w[:-1])
    anchors = sample_anchors(4, 10, 3, random.Random(0))
    assert len(anchors) == 3 and all(4 <= a <= 8 for a in anchors) and anchors == sorted(anchors)
    assert sample_anchors(9, 10, 3, random.Random(0)) == []


def test_loss_decreases_on_a_fixed_batch(raw_pair: TinyPair, tmp_path: Path) -> None:
    target, drafter, _ = _setup(raw_pair)
    batch = _greedy(target, 2, seed=0)
    spec = TrainSpec(
        steps=30, lr=3e-3, warmup_steps=2, micro_batch=2, anchors=8, save_every=1000, log_every=1000
    )
    losses = train(drafter, target, lambda: iter(batch), spec, tmp_path / "state.pt")
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


@pytest.mark.slow
def test_training_beats_untrained_and_resumes(raw_pair: TinyPair, tmp_path: Path) -> None:
    target, drafter, _ = _setup(raw_pair)
    data, held = _greedy(target, 24, seed=1), _greedy(target, 6, seed=2)
    before = _first_position_agreement(target, drafter, held)
    spec = TrainSpec(
        steps=60, lr=3e-3, warmup_steps=5, micro_batch=4, anchors=8, save_every=20, log_every=1000
    )
    ckpt = tmp_path / "state.pt"
    train(drafter, target, lambda: iter(data), TrainSpec(**{**spec.__dict__, "steps": 40}), ckpt)
    assert torch.load(ckpt, weights_only=False)["step"] == 40
    _, resumed, _ = _setup(raw_pair)  # a fresh process: new drafter, state from the checkpoint
    lines: list[str] = []
    train(resumed, target, lambda: iter(data), spec, ckpt, log=lines.append)
    assert lines[0].startswith("resumed at step 40/60")
    after = _first_position_agreement(target, resumed, held)
    assert after > before + 0.2, (before, after)
