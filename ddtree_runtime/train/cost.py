"""What a run will cost, printed before it starts, from a short measured warm-up on this machine.

Two measurements on one rank: the target regenerating a response with the runtime's engine, and
training micro-batches (forward and backward, no optimizer step, so the drafter is unchanged) on
random sequences of the run's expected length, the target's features timed apart from the drafter's
pass. The job's rates are one rank's times the number of ranks: DDP's gradient all-reduce overlaps
the backward pass, so this holds while the interconnect keeps up. With the offline shards' disk
need (`extract.disk_need`), that gives the hours of each stage for the run's sample count.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass

import torch

from ddtree_runtime.engine import Engine
from ddtree_runtime.train.extract import Sample, human_bytes
from ddtree_runtime.train.forward import TargetFeatures
from ddtree_runtime.train.trainer import Batches, BlockLoss, TrainSpec


@dataclass(frozen=True)
class Cost:
    samples: int
    prompt_tokens: float  # mean
    response_tokens: int  # at most
    ranks: int
    regen_tokens_per_s: float  # every rank together, as the rest
    features_tokens_per_s: float  # the target's forward alone (offline extraction)
    drafter_tokens_per_s: float  # the drafter's forward and backward alone
    features_bytes: int  # offline shards of every sample
    steps: int
    step_tokens: float  # sequence tokens per optimizer step

    @property
    def sample_tokens(self) -> float:
        return self.prompt_tokens + self.response_tokens

    def train_tokens_per_s(self, offline: bool) -> float:
        """Sequence tokens per second of training: the drafter's pass, plus the target's online."""
        if offline:
            return self.drafter_tokens_per_s
        return 1.0 / (1.0 / self.features_tokens_per_s + 1.0 / self.drafter_tokens_per_s)

    def hours(self, offline: bool) -> dict[str, float]:
        train = self.train_tokens_per_s(offline)
        tokens = self.samples * self.sample_tokens
        return {
            "regenerate": self.samples * self.response_tokens / self.regen_tokens_per_s / 3600,
            "extract": tokens / self.features_tokens_per_s / 3600 if offline else 0.0,
            "train": self.steps * self.step_tokens / train / 3600,
            "epoch": tokens / train / 3600,
        }

    def lines(self, offline: bool) -> list[str]:
        h, train = self.hours(offline), self.train_tokens_per_s(offline)
        epochs = self.steps * self.step_tokens / max(1.0, self.samples * self.sample_tokens)
        per_token = self.features_bytes / max(1.0, self.samples * self.sample_tokens)
        features = (
            f"offline shards {human_bytes(self.features_bytes)} on disk ({human_bytes(per_token)} per "
            f"token), extraction {self.features_tokens_per_s:,.0f} tok/s -> {h['extract']:.2f} h"
            if offline
            else f"online (no disk; offline would need {human_bytes(self.features_bytes)})"
        )
        return [
            f"cost: {self.samples:,} samples of ~{self.sample_tokens:,.0f} tokens (prompt "
            f"~{self.prompt_tokens:,.0f} + response <= {self.response_tokens}), {self.ranks} rank(s), "
            "measured on one rank, scaled by the ranks",
            f"cost: regenerate {self.regen_tokens_per_s:,.0f} tok/s -> {h['regenerate']:.2f} h",
            f"cost: features {features}",
            f"cost: train {train:,.0f} tok/s -> {self.steps:,} steps {h['train']:.2f} h "
            f"({epochs:.2f} epochs; one epoch {h['epoch']:.2f} h)",
        ]

    def as_json(self, offline: bool) -> dict[str, object]:
        return {**asdict(self), "offline": offline, "hours": self.hours(offline)}


def regen_tokens_per_s(engine: Engine, prompt: list[int], new_tokens: int) -> float:
    """One rank's greedy decode rate, after a short untimed generation (caches, graphs, kernels)."""
    engine.generate(prompt, mode="ar", max_new_tokens=2, eos_ids=())
    result = engine.generate(prompt, mode="ar", max_new_tokens=new_tokens, eos_ids=())
    return len(result.output_ids) / result.total_s


def train_rates(
    loss: BlockLoss,
    features: TargetFeatures,
    spec: TrainSpec,
    prompt_len: int,
    length: int,
    vocab: int,
    timed: int = 2,
) -> tuple[float, float]:
    """One rank's (features, drafter) sequence tokens per second over `timed` micro-batches of
    random `length`-token sequences, after one untimed."""
    gen = torch.Generator().manual_seed(0)
    samples = [
        Sample(torch.randint(0, vocab, (length,), generator=gen), prompt_len) for _ in range(spec.micro_batch)
    ]
    drafter = loss.drafter
    data = Batches(samples, features, drafter, spec, random.Random(0), 0)
    device = data.device
    t_feat = t_draft = 0.0
    tokens = 0
    for i in range(1 + timed):
        _sync(device)
        t0 = time.perf_counter()
        batch, seen = data.take()
        _sync(device)
        t1 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec.bf16):
            loss_sum, w_sum = loss(batch)
        (loss_sum / w_sum.clamp(min=1.0)).backward()
        _sync(device)
        if i:
            t_feat, t_draft, tokens = t_feat + t1 - t0, t_draft + time.perf_counter() - t1, tokens + seen
    drafter.zero_grad(set_to_none=True)
    return tokens / max(t_feat, 1e-9), tokens / max(t_draft, 1e-9)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
