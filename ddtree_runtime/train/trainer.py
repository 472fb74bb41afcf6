"""DFlash drafter training: random anchors in the response, `[anchor, MASK x (B - 1)]` blocks, a
loss that weights early block positions more, the target's embeddings and head shared and frozen.

The same command runs on one process or under torchrun (DDP: NCCL on GPUs, gloo on the CPU, over
one host or many). Each rank reads its own shard of the samples, in order and round after round, so
a step's data is fixed by the step number: a resume skips what the checkpoint's steps consumed and
replays the uninterrupted run. Parameters and optimizer state stay fp32 (the master copy) and the
forward runs under bf16 autocast where asked. The leader writes the checkpoint (`train_state.pt`)
atomically every `save_every` steps, and `train_log.jsonl` (the loss curve over all ranks); a rerun
resumes from the checkpoint, broadcast from the leader.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.target import Target
from ddtree_runtime.train.distributed import Job, barrier, gather, state_from_leader, total
from ddtree_runtime.train.extract import Sample
from ddtree_runtime.train.forward import TargetFeatures, draft_blocks

Log = Callable[[str], None]


def log_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 1000
    lr: float = 6e-4
    warmup_steps: int = 20
    micro_batch: int = 4  # sequences per micro-step (per rank)
    grad_accum: int = 1
    anchors: int = 16  # blocks per sequence
    loss_gamma: float = 4.0  # position weight exp(-(j - 1) / gamma)
    weight_decay: float = 0.0
    bf16: bool = False
    save_every: int = 100
    log_every: int = 10
    seed: int = 0


def position_weights(block: int, gamma: float, device: torch.device) -> Tensor:
    """[B - 1]: block position j (1-based) weighs exp(-(j - 1) / gamma), as a miss at j voids the
    rest of the block's acceptance."""
    return torch.exp(-torch.arange(block - 1, device=device, dtype=torch.float32) / gamma)


def sample_anchors(prompt_len: int, length: int, k: int, gen: random.Random) -> list[int]:
    """Up to k distinct anchors in the response (`prompt_len .. length - 2`), sorted."""
    lo, hi = prompt_len, length - 2
    if hi < lo:
        return []
    return sorted(gen.sample(range(lo, hi + 1), min(k, hi - lo + 1)))


class BlockLoss(nn.Module):
    """The drafter plus the frozen target pieces it borrows; `forward` is one micro-batch's loss.

    The target's embeddings and head are held outside the module's parameters, so DDP neither
    broadcasts nor watches them."""

    def __init__(self, drafter: DFlashDrafter, target: Target, gamma: float) -> None:
        super().__init__()
        self.drafter = drafter
        self.borrowed = (target.embed_tokens.weight.detach(), target.lm_head)
        self.gamma = gamma

    def forward(self, batch: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        """(weighted loss sum, weight sum) over the draft positions of every (features, tokens,
        anchors) sequence; one call per micro-step, as DDP wants."""
        embed, head = self.borrowed
        block = self.drafter.config.block_size
        weights = position_weights(block, self.gamma, embed.device)[None]
        loss_sum = weight_sum = embed.new_zeros((), dtype=torch.float32)
        if not batch:
            # every sequence was too short for an anchor: a zero loss that still reaches every
            # weight, since DDP's backward must run on every rank
            return sum(p.sum() for p in self.drafter.parameters()) * 0.0, weight_sum
        for features, tokens, anchors in batch:
            hidden = draft_blocks(self.drafter, features, tokens, anchors, embed)  # [K, B, h]
            logits = self.drafter.logits(hidden[:, 1:], head)  # [K, B-1, V]
            pos = anchors[:, None] + torch.arange(1, block, device=tokens.device)  # [K, B-1]
            valid = pos < tokens.shape[0]
            labels = tokens[pos.clamp(max=tokens.shape[0] - 1)]
            ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
            w = weights * valid
            loss_sum, weight_sum = loss_sum + (ce.view_as(pos) * w).sum(), weight_sum + w.sum()
        return loss_sum, weight_sum


class Batches:
    """Micro-batches of one rank: its samples in order from a step's position, each with anchors
    drawn from the rank's generator and features from the target when none are stored."""

    def __init__(
        self,
        samples: Sequence[Sample],
        features: TargetFeatures,
        drafter: DFlashDrafter,
        spec: TrainSpec,
        gen: random.Random,
        step: int,
    ) -> None:
        if not len(samples):
            raise ValueError("no training samples for this rank (fix: more prompts, or fewer ranks)")
        self.samples, self.features, self.spec, self.gen = samples, features, spec, gen
        self.device = drafter.fc.weight.device
        self.dtype = drafter.fc.weight.dtype
        self.block = drafter.config.block_size
        self.next = step * spec.micro_batch * spec.grad_accum  # micro-batches take fixed counts

    def take(self) -> tuple[list[tuple[Tensor, Tensor, Tensor]], int]:
        """(features, tokens, anchors) of `micro_batch` samples (those too short for an anchor
        dropped), and the sequence tokens they hold."""
        batch, seen = [], 0
        for _ in range(self.spec.micro_batch):
            s = self.samples[self.next % len(self.samples)]
            self.next += 1
            tokens = s.tokens.to(self.device)
            anchors = sample_anchors(s.prompt_len, tokens.shape[0], self.spec.anchors, self.gen)
            if not anchors:
                continue
            feats = s.hidden if s.hidden is not None else self.features(tokens)
            batch.append(
                (feats.to(self.device, self.dtype), tokens, torch.tensor(anchors, device=self.device))
            )
            seen += tokens.shape[0]
        return batch, seen


def _fmt_s(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def train(
    job: Job,
    drafter: DFlashDrafter,
    target: Target,
    samples: Sequence[Sample],
    spec: TrainSpec,
    run_dir: Path,
    log: Log = log_stderr,
) -> list[float]:
    """Train `drafter` in place for `spec.steps` optimizer steps on this rank's `samples`; returns
    the losses of the steps run now (means over every rank's draft positions)."""
    target.requires_grad_(False)
    drafter.train()
    model: nn.Module = BlockLoss(drafter, target, spec.loss_gamma)
    if job.world > 1:
        model = DistributedDataParallel(model)
    opt = torch.optim.AdamW(
        drafter.parameters(), lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.95)
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: _lr_factor(spec, step))
    gen = random.Random(spec.seed * 1000 + job.rank)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt, curve = run_dir / "train_state.pt", run_dir / "train_log.jsonl"
    step = _resume(job, ckpt, curve, spec, drafter, opt, sched, gen, log)
    features = TargetFeatures(target, drafter.config.target_layer_ids)
    data = Batches(samples, features, drafter, spec, gen, step)
    if job.is_leader:
        log(
            f"train: world size {job.world} ({'DDP' if job.world > 1 else 'one process'}), "
            f"{spec.micro_batch} sequences x {spec.grad_accum} accumulation per rank per step, "
            f"{'bf16 autocast' if spec.bf16 else 'fp32'}"
        )
    losses: list[float] = []
    t0, tokens_seen, start_step = time.perf_counter(), 0.0, step
    while step < spec.steps:
        opt.zero_grad(set_to_none=True)
        loss, tokens = step_grads(job, model, data, spec)
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        losses.append(loss)
        tokens_seen += tokens
        if job.is_leader and (step % spec.log_every == 0 or step == spec.steps):
            el = time.perf_counter() - t0
            row = {"step": step, "loss": loss, "lr": sched.get_last_lr()[0], "tokens_per_s": tokens_seen / el}
            with curve.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
            eta = el / (step - start_step) * (spec.steps - step)
            log(
                f"train {step}/{spec.steps} loss {loss:.3f} lr {row['lr']:.2e} "
                f"{row['tokens_per_s']:.0f} tok/s eta {_fmt_s(eta)}"
            )
        if step % spec.save_every == 0 or step == spec.steps:
            _save(job, ckpt, drafter, opt, sched, step, gen)
    drafter.eval()
    return losses


def step_grads(job: Job, model: nn.Module, data: Batches, spec: TrainSpec) -> tuple[float, float]:
    """Backward over `spec.grad_accum` micro-batches (DDP syncs only on the last); returns the
    step's mean weighted loss and the sequence tokens it read, both over every rank."""
    device = data.device
    sums = torch.zeros(3, device=device)  # loss sum, weight sum, tokens
    for micro in range(spec.grad_accum):
        batch, tokens = data.take()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec.bf16):
            loss_sum, w_sum = model(batch)
        last = micro == spec.grad_accum - 1
        ddp = isinstance(model, DistributedDataParallel)
        with model.no_sync() if ddp and not last else contextlib.nullcontext():
            (loss_sum / max(1.0, float(w_sum)) / spec.grad_accum).backward()
        sums += torch.stack([loss_sum.detach(), w_sum.detach(), torch.tensor(float(tokens), device=device)])
    loss, weight, tokens = total(job, sums).tolist()
    return loss / max(weight, 1.0), tokens


def _lr_factor(spec: TrainSpec, step: int) -> float:
    """Linear warmup to 1, then a cosine decay to 0.1 at `spec.steps`."""
    if step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    t = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def _resume(
    job: Job,
    ckpt: Path,
    curve: Path,
    spec: TrainSpec,
    drafter: DFlashDrafter,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    gen: random.Random,
    log: Log,
) -> int:
    """The leader's checkpoint (written by `_save`) into every rank's drafter, optimizer, schedule
    and generator; returns the step to continue from (0 without one). The loss curve loses the
    rows a killed run logged after it."""
    state = None
    if job.is_leader and ckpt.exists():
        state = torch.load(ckpt, map_location=job.device, weights_only=False)
    state = state_from_leader(job, state)
    if state is None:
        if job.is_leader:
            curve.unlink(missing_ok=True)
        return 0
    drafter.load_state_dict(state["drafter"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    step = int(state["step"])
    gen.setstate(state["rng"][job.rank % len(state["rng"])])
    if job.is_leader:
        _keep_curve(curve, step)
        log(f"resumed at step {step}/{spec.steps} from {ckpt}")
    return step


def _keep_curve(curve: Path, step: int) -> None:
    if curve.exists():
        rows = [line for line in curve.read_text(encoding="utf-8").splitlines() if line.strip()]
        kept = [line for line in rows if json.loads(line)["step"] <= step]
        curve.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def _save(
    job: Job,
    ckpt: Path,
    drafter: DFlashDrafter,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    step: int,
    gen: random.Random,
) -> None:
    """The leader writes atomically; every rank's generator travels so a resume replays the anchors."""
    states = gather(job, gen.getstate())
    if job.is_leader:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        tmp = ckpt.with_suffix(".tmp")
        torch.save(
            {
                "drafter": drafter.state_dict(),
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
                "step": step,
                "rng": states,
            },
            tmp,
        )
        os.replace(tmp, ckpt)
    barrier(job)
