"""`python -m ddtree_runtime.train`: the whole resumable pipeline (see pipeline.py) from flags."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import torch

from ddtree_runtime.config import ConfigError
from ddtree_runtime.train.curate import CurationError, Filters
from ddtree_runtime.train.extract import ExtractionError
from ddtree_runtime.train.pipeline import RunSpec, run
from ddtree_runtime.train.trainer import TrainSpec


def _ints(text: str | None) -> list[int] | None:
    return None if not text else [int(x) for x in text.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    """The pipeline's flags; most train and filter defaults come from `TrainSpec` and `Filters`."""
    p = argparse.ArgumentParser(prog="python -m ddtree_runtime.train", description=__doc__)
    p.add_argument("--target", required=True, help="target checkpoint directory (HF Qwen3 + tokenizer)")
    p.add_argument(
        "--prompts",
        required=True,
        action="append",
        help="JSONL/text file or directory, or an HF dataset name (repeatable)",
    )
    p.add_argument("--out", required=True, help="run directory (rerun the same command to resume)")
    p.add_argument(
        "--held-out-prompts",
        action="append",
        default=[],
        help="prompt sources kept wholly for evaluation (repeatable)",
    )
    p.add_argument("--limit", type=int, help="read at most this many prompts")
    p.add_argument("--min-chars", type=int, default=Filters.min_chars)
    p.add_argument("--max-chars", type=int, default=Filters.max_chars)
    p.add_argument("--near-dup", type=float, default=Filters.near_dup_threshold, help="Jaccard threshold")
    p.add_argument("--held-out", type=float, default=Filters.held_out_fraction, help="held-out fraction")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--response-tokens", type=int, default=128, help="tokens the target regenerates")
    p.add_argument("--extraction", choices=("online", "offline"), default="online")
    p.add_argument("--shard-size", type=int, default=256, help="offline: samples per shard")
    p.add_argument("--draft-layers", type=int, default=1)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--target-layer-ids", help="comma-separated (default: z-lab's spread)")
    p.add_argument("--mask-token-id", type=int, help="default: the tokenizer's <|mask|>")
    t = TrainSpec()
    p.add_argument("--steps", type=int, default=t.steps)
    p.add_argument("--lr", type=float, default=t.lr)
    p.add_argument("--warmup-steps", type=int, default=t.warmup_steps)
    p.add_argument("--micro-batch", type=int, default=t.micro_batch)
    p.add_argument("--grad-accum", type=int, default=t.grad_accum)
    p.add_argument("--anchors", type=int, default=t.anchors, help="blocks per sequence")
    p.add_argument("--loss-gamma", type=float, default=t.loss_gamma)
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (default: on for CUDA)",
    )
    p.add_argument("--save-every", type=int, default=t.save_every)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--eval-prompts", type=int, default=16)
    p.add_argument("--eval-budgets", default="16,64")
    p.add_argument("--eval-tokens", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p


def parse_args(argv: Sequence[str] | None) -> RunSpec:
    a = _parser().parse_args(argv)
    device = a.device
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        device = f"cuda:{os.environ['LOCAL_RANK']}"
    return RunSpec(
        target=a.target,
        out=a.out,
        prompts=a.prompts,
        held_out_prompts=a.held_out_prompts,
        limit=a.limit,
        filters=Filters(a.min_chars, a.max_chars, a.near_dup, a.held_out),
        max_prompt_tokens=a.max_prompt_tokens,
        response_tokens=a.response_tokens,
        extraction=a.extraction,
        shard_size=a.shard_size,
        draft_layers=a.draft_layers,
        block_size=a.block_size,
        target_layer_ids=_ints(a.target_layer_ids),
        mask_token_id=a.mask_token_id,
        train=_train_spec(a),
        save_dtype=a.save_dtype,
        eval_prompts=a.eval_prompts,
        eval_budgets=_ints(a.eval_budgets) or [],
        eval_tokens=a.eval_tokens,
        device=device,
    )


def _train_spec(a: argparse.Namespace) -> TrainSpec:
    """The trainer's settings from the flags; bf16 defaults to on for a CUDA device."""
    return TrainSpec(
        steps=a.steps,
        lr=a.lr,
        warmup_steps=a.warmup_steps,
        micro_batch=a.micro_batch,
        grad_accum=a.grad_accum,
        anchors=a.anchors,
        loss_gamma=a.loss_gamma,
        bf16=a.device.startswith("cuda") if a.bf16 is None else a.bf16,
        save_every=a.save_every,
        seed=a.seed,
    )


def main(argv: Sequence[str] | None = None) -> int:
    spec = parse_args(argv)
    try:
        summary = run(spec)
    except (ConfigError, CurationError, ExtractionError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if summary:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
