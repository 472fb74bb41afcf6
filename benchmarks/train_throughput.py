"""DFlash training throughput for the story's pair, on one GPU, and the hours it implies.

Builds a Qwen3.6-27B-shaped hybrid target (`roofline.py`'s `qwen3.6-27b` shapes: 64 layers, 48
Gated DeltaNet + 16 gated full attention, hidden 5120, vocab 248320, bf16) and the drafter a new run
lays out for it (z-lab's Qwen3.6-27B drafter: 5 layers, block 16, [S, S, S, S, F] with a 2048
window, 32/8 heads of 128; fp32 master weights, bf16 autocast), both with random weights drawn on
the device (nothing is downloaded). Then it times the trainer's own code (`ddtree_runtime/train`):

- the target giving hidden states online (`TargetFeatures`: the runtime's prefill, no gradient),
- the drafter's forward and backward over `anchors` blocks per sequence (`BlockLoss`),
- whole optimizer steps (`step_grads` + clip + AdamW), after `--warmup` untimed ones,

on random sequences of `--seq-len` tokens (`--prompt-len` of them prompt), and prints one JSON line
and a short table: sequence tokens/s on this GPU, and the hours for `--samples` samples of that
length on `--gpus` GPUs (data-parallel ranks scale linearly while the gradient all-reduce hides
behind the backward pass; the 8-GPU figure assumes so).

    python benchmarks/train_throughput.py [--seq-len 1024] [--prompt-len 256] [--micro-batch 4]
        [--anchors 16] [--steps 5] [--samples 913000] [--gpus 8]
    python benchmarks/train_throughput.py --tiny --device cpu   # a few-second check of the script
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.roofline import QWEN36_27B, SMALL
from ddtree_runtime.config import DFlashConfig, Qwen3_5Config
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.qwen3_5 import Qwen3_5
from ddtree_runtime.train.checkpoint import Layout, drafter_config
from ddtree_runtime.train.cost import train_rates
from ddtree_runtime.train.distributed import join
from ddtree_runtime.train.extract import Sample
from ddtree_runtime.train.forward import TargetFeatures
from ddtree_runtime.train.trainer import Batches, BlockLoss, TrainSpec, step_grads

MASK = 248070  # the Qwen3.5/3.6 tokenizer's mask id


def random_weights(model: torch.nn.Module) -> None:
    """Norms near their identity (Qwen3.5 stores weight - 1), decays in range, matrices ~1/sqrt(fan-in)."""
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith("norm.weight"):
                w.zero_() if isinstance(model, Qwen3_5) and "linear_attn" not in name else w.fill_(1.0)
            elif name.endswith(("A_log", "dt_bias")):
                w.uniform_(-1.0, 0.0)
            else:
                w.normal_(0.0, (w.shape[-1] if w.ndim > 1 else 1) ** -0.5)


def build(tiny: bool, device: torch.device) -> tuple[Qwen3_5, DFlashDrafter]:
    raw = {**QWEN36_27B, **SMALL["qwen3.6-27b"][0], "num_hidden_layers": 8} if tiny else QWEN36_27B
    cfg = Qwen3_5Config.from_dict(raw, Path("<qwen3.6-27b-shaped>"))
    layout = Layout(layers=2, heads=4, kv_heads=2, head_dim=32, block_size=8) if tiny else Layout()
    draft_raw = drafter_config(cfg, layout.resolve(cfg), cfg.vocab_size - 1 if tiny else MASK)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device("meta"):  # cast before allocating: 27B in fp32 would not fit beside bf16
        target = Qwen3_5(cfg).to(dtype)
        drafter = DFlashDrafter(DFlashConfig.from_dict(draft_raw, Path("<qwen3.6-27b-dflash-shaped>")))
    target = target.to_empty(device=device)
    drafter = drafter.to_empty(device=device)
    random_weights(target)
    random_weights(drafter)
    target.fuse()
    return target.eval().requires_grad_(False), drafter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="small widths and 8 layers, for a CPU check")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=TrainSpec.micro_batch)
    p.add_argument("--anchors", type=int, default=TrainSpec.anchors)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps")
    p.add_argument("--samples", type=int, default=913_000)
    p.add_argument("--gpus", type=int, default=8)
    a = p.parse_args()
    t_start = time.perf_counter()
    job = join(a.device)
    device = job.device
    torch.manual_seed(0)
    target, drafter = build(a.tiny, device)
    built_s = time.perf_counter() - t_start
    spec = TrainSpec(micro_batch=a.micro_batch, anchors=a.anchors, bf16=device.type == "cuda")
    loss = BlockLoss(drafter, target, spec.loss_gamma)
    features = TargetFeatures(target, drafter.config.target_layer_ids)
    vocab = target.config.vocab_size

    # the split: the target's features apart from the drafter's forward and backward
    feat_tps, draft_tps = train_rates(loss, features, spec, a.prompt_len, a.seq_len, vocab, timed=2)

    # whole steps, as `train` runs them
    gen = torch.Generator().manual_seed(1)
    samples = [
        Sample(torch.randint(0, vocab, (a.seq_len,), generator=gen), a.prompt_len)
        for _ in range(a.micro_batch)
    ]
    data = Batches(samples, features, drafter, spec, random.Random(0), 0)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4, betas=(0.9, 0.95))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    tokens, elapsed = 0.0, 0.0
    for i in range(a.warmup + a.steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, seen = step_grads(job, loss, data, spec)
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= a.warmup:
            tokens, elapsed = tokens + seen, elapsed + time.perf_counter() - t0
    tps = tokens / elapsed
    sample_tokens = a.samples * a.seq_len
    row = {
        "model": "small" if a.tiny else "qwen3.6-27b-shaped target + z-lab-27b-shaped drafter",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": "bf16 autocast, fp32 master" if spec.bf16 else "float32",
        "seq_len": a.seq_len,
        "prompt_len": a.prompt_len,
        "micro_batch": a.micro_batch,
        "anchors": a.anchors,
        "block_size": drafter.config.block_size,
        "drafter_params": sum(w.numel() for w in drafter.parameters()),
        "timed_steps": a.steps,
        "step_s": round(elapsed / a.steps, 4),
        "tokens_per_s": round(tps, 1),
        "features_tokens_per_s": round(feat_tps, 1),
        "drafter_tokens_per_s": round(draft_tps, 1),
        "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
        if device.type == "cuda"
        else None,
        "samples": a.samples,
        "gpus": a.gpus,
        "epoch_hours_online": round(sample_tokens / (tps * a.gpus) / 3600, 2),
        "epoch_hours_offline_features": round(sample_tokens / (draft_tps * a.gpus) / 3600, 2),
        "extract_hours_offline": round(sample_tokens / (feat_tps * a.gpus) / 3600, 2),
        "build_s": round(built_s, 1),
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    print(json.dumps(row))
    width = max(len(k) for k in row)
    for key in (
        "device", "tokens_per_s", "features_tokens_per_s", "drafter_tokens_per_s", "step_s", "peak_gib",
        "epoch_hours_online", "epoch_hours_offline_features", "extract_hours_offline", "wall_s",
    ):  # fmt: skip
        print(f"{key:<{width}}  {row[key]}")
    print(
        f"{a.samples:,} samples x {a.seq_len} tokens on {a.gpus} GPUs: "
        f"{row['epoch_hours_online']} h per epoch with online features"
    )


if __name__ == "__main__":
    main()
