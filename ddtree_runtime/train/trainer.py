"""DFlash drafter training: random anchors in the response, `[anchor, MASK x (B - 1)]` blocks, a
loss that weights early block positions more, the target's embeddings and head shared and frozen.

The same command runs on one process or under `torchrun` (DDP: NCCL on GPUs, gloo on the CPU);
each rank takes every world-th sample. Parameters and optimizer state stay fp32 (the master copy)
and the forward runs under bf16 autocast where asked. Checkpoints (`train_state.pt`) are written
atomically every `save_every` optimizer steps and a rerun resumes from the last one.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.qwen3 import Qwen3
from ddtree_runtime.train.extract import Sample, hidden_states
from ddtree_runtime.train.forward import drafter_blocks


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
    """The drafter plus the frozen target pieces it borrows; `forward` is one sequence's loss."""

    def __init__(self, drafter: DFlashDrafter, target: Qwen3, gamma: float) -> None:
        super().__init__()
        self.drafter = drafter
        self.embed = target.embed_tokens.weight.detach()
        self.head = target.lm_head
        self.gamma = gamma

    def forward(self, batch: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        """(weighted loss sum, weight sum) over the draft positions of every (features, tokens,
        anchors) sequence; one call per micro-step, as DDP wants."""
        block = self.drafter.config.block_size
        weights = position_weights(block, self.gamma, self.head.weight.device)[None]
        loss_sum = weight_sum = self.head.weight.new_zeros((), dtype=torch.float32)
        for features, tokens, anchors in batch:
            hidden = drafter_blocks(self.drafter, features, tokens, anchors, self.embed)  # [K, B, h]
            logits = self.drafter.logits(hidden[:, 1:], self.head)  # [K, B-1, V]
            pos = anchors[:, None] + torch.arange(1, block, device=tokens.device)  # [K, B-1]
            valid = pos < tokens.shape[0]
            labels = tokens[pos.clamp(max=tokens.shape[0] - 1)]
            ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none").view_as(
                pos
            )
            w = weights * valid
            loss_sum, weight_sum = loss_sum + (ce * w).sum(), weight_sum + w.sum()
        return loss_sum, weight_sum


def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def init_distributed(device: torch.device) -> None:
    """Join the torchrun group when launched by torchrun (WORLD_SIZE set), else stay single."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def _fmt_s(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def train(
    drafter: DFlashDrafter,
    target: Qwen3,
    samples: Callable[[], Iterator[Sample]],
    spec: TrainSpec,
    ckpt: Path,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> list[float]:
    """Train `drafter` in place for `spec.steps` optimizer steps; returns the logged losses.

    `samples()` yields the (rank-local) sequences afresh each epoch; without stored features each
    one's hidden states are computed here with the frozen target (online extraction)."""
    rank, world = _rank_world()
    target.requires_grad_(False)
    drafter.train()
    model: nn.Module = BlockLoss(drafter, target, spec.loss_gamma)
    if world > 1:
        model = DistributedDataParallel(model)
    opt = torch.optim.AdamW(
        drafter.parameters(), lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.95)
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: _lr_factor(spec, step))
    gen = random.Random(spec.seed * 1000 + rank)
    step = _resume(ckpt, spec, drafter, opt, sched, gen, log) if ckpt.exists() else 0
    data = _rank_stream(samples, rank, world)
    if rank == 0:
        log(
            f"train: world size {world} ({'DDP' if world > 1 else 'one process'}), {spec.micro_batch} sequences "
            f"x {spec.grad_accum} accumulation per rank per step, {'bf16 autocast' if spec.bf16 else 'fp32'}"
        )
    losses: list[float] = []
    t0, tokens_seen = time.perf_counter(), 0
    start_step = step
    while step < spec.steps:
        opt.zero_grad(set_to_none=True)
        loss, tokens = _accumulate_grads(model, drafter, target, data, spec, gen)
        tokens_seen += tokens
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        losses.append(loss)
        if rank == 0 and (step % spec.log_every == 0 or step == spec.steps):
            el = time.perf_counter() - t0
            eta = el / (step - start_step) * (spec.steps - step)
            log(
                f"train {step}/{spec.steps} loss {loss:.3f} lr {sched.get_last_lr()[0]:.2e} "
                f"{tokens_seen * world / el:.0f} tok/s eta {_fmt_s(eta)}"
            )
        if step % spec.save_every == 0 or step == spec.steps:
            _save(ckpt, drafter, opt, sched, step, gen)
    drafter.eval()
    return losses


def _lr_factor(spec: TrainSpec, step: int) -> float:
    """Linear warmup to 1, then a cosine decay to 0.1 at `spec.steps`."""
    if step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    t = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def _resume(
    ckpt: Path,
    spec: TrainSpec,
    drafter: DFlashDrafter,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    gen: random.Random,
    log: Callable[[str], None],
) -> int:
    """Load `ckpt` (written by `_save`) into the drafter, optimizer, schedule and this rank's RNG;
    returns the step to continue from."""
    rank, _ = _rank_world()
    state = torch.load(ckpt, map_location=drafter.fc.weight.device, weights_only=False)
    drafter.load_state_dict(state["drafter"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    step = state["step"]
    gen.setstate(state["rng"][rank] if rank < len(state["rng"]) else state["rng"][0])
    log(f"resumed at step {step}/{spec.steps} from {ckpt}")
    return step


def _rank_stream(samples: Callable[[], Iterator[Sample]], rank: int, world: int) -> Iterator[Sample]:
    """Every world-th sample from `rank` on, epoch after epoch, forever."""
    while True:
        got = False
        for i, s in enumerate(samples()):
            if i % world == rank:
                got = True
                yield s
        if not got:
            raise ValueError("no training samples for this rank (fix: more prompts, or fewer ranks)")


def _accumulate_grads(
    model: nn.Module,
    drafter: DFlashDrafter,
    target: Qwen3,
    data: Iterator[Sample],
    spec: TrainSpec,
    gen: random.Random,
) -> tuple[float, int]:
    """Backward over `spec.grad_accum` micro-batches (DDP syncs only on the last); returns the
    step's mean weighted loss and the draft tokens it trained on."""
    device = drafter.fc.weight.device
    total, weight = torch.zeros((), device=device), torch.zeros((), device=device)
    tokens_seen = 0
    for micro in range(spec.grad_accum):
        batch, tokens = _micro_batch(drafter, target, data, spec, gen)
        tokens_seen += tokens
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec.bf16):
            loss_sum, w_sum = model(batch)
        last = micro == spec.grad_accum - 1
        ddp = isinstance(model, DistributedDataParallel)
        ctx = model.no_sync() if ddp and not last else contextlib.nullcontext()
        with ctx:
            (loss_sum / max(1.0, float(w_sum)) / spec.grad_accum).backward()
        total, weight = total + loss_sum.detach(), weight + w_sum.detach()
    return float(total / weight.clamp(min=1)), tokens_seen


def _micro_batch(
    drafter: DFlashDrafter,
    target: Qwen3,
    data: Iterator[Sample],
    spec: TrainSpec,
    gen: random.Random,
) -> tuple[list[tuple[Tensor, Tensor, Tensor]], int]:
    """`spec.micro_batch` samples as (features, tokens, anchors) on the drafter's device (those too
    short for an anchor dropped), plus their draft-token count; features come from the target
    when the sample has none stored."""
    device = drafter.fc.weight.device
    batch, tokens_seen = [], 0
    for _ in range(spec.micro_batch):
        s = next(data)
        tokens = s.tokens.to(device)
        anchors = sample_anchors(s.prompt_len, tokens.shape[0], spec.anchors, gen)
        if not anchors:
            continue
        feats = s.hidden
        if feats is None:
            feats = hidden_states(target, tokens, drafter.config.target_layer_ids)
        batch.append(
            (feats.to(device, drafter.fc.weight.dtype), tokens, torch.tensor(anchors, device=device))
        )
        tokens_seen += len(anchors) * (drafter.config.block_size - 1)
    return batch, tokens_seen


def _save(
    ckpt: Path,
    drafter: DFlashDrafter,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    step: int,
    gen: random.Random,
) -> None:
    """Rank 0 writes atomically; every rank's RNG state travels so a resume replays the same anchors."""
    rank, world = _rank_world()
    states: list[object] = [gen.getstate()]
    if world > 1:
        gathered: list[object] = [None] * world
        dist.all_gather_object(gathered, gen.getstate())
        states = gathered
    if rank == 0:
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
    if world > 1:
        dist.barrier()
