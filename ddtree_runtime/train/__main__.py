"""`python -m ddtree_runtime.train`: the whole resumable pipeline (see pipeline.py) from flags.

Under torchrun the same command runs on every process: `--standalone` on one host, or the c10d
rendezvous over several (`fab train-drafter` over a group of hosts starts one such job)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ddtree_runtime.config import ConfigError
from ddtree_runtime.loader import default_device
from ddtree_runtime.train.checkpoint import Layout
from ddtree_runtime.train.curate import CurationError, Filters
from ddtree_runtime.train.distributed import exit_process, leave
from ddtree_runtime.train.extract import ExtractionError
from ddtree_runtime.train.pipeline import LintFailed, RunSpec, run
from ddtree_runtime.train.trainer import TrainSpec


def _ints(text: str | None) -> list[int] | None:
    return None if not text else [int(x) for x in text.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    """The pipeline's flags; most train and filter defaults come from `TrainSpec` and `Filters`."""
    p = argparse.ArgumentParser(prog="python -m ddtree_runtime.train", description=__doc__)
    p.add_argument(
        "--target", required=True, help="target checkpoint directory (HF Qwen3 or Qwen3.5/3.6 + tokenizer)"
    )
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
    p.add_argument(
        "--init-from",
        help="an existing DFlash drafter to fine-tune (linted against the target first; it fixes the "
        "drafter's layout, so the layout flags below are ignored)",
    )
    layout = p.add_argument_group(
        "a new drafter's layout",
        "defaults: z-lab's for the target's kind; hybrid Qwen3.5/3.6: 5 layers, block 16, "
        "[S, S, S, S, F] with a 2048 window, 32/8 heads of 128; dense Qwen3: 1 layer, block 8, "
        "full attention, the target's heads",
    )
    layout.add_argument("--draft-layers", type=int)
    layout.add_argument("--block-size", type=int)
    layout.add_argument("--draft-heads", type=int)
    layout.add_argument("--draft-kv-heads", type=int)
    layout.add_argument("--draft-head-dim", type=int)
    layout.add_argument("--sliding-window", type=int, help="window of the sliding layers; 0: all full")
    layout.add_argument("--target-layer-ids", help="comma-separated (default: z-lab's spread)")
    layout.add_argument("--mask-token-id", type=int, help="default: the tokenizer's <|mask|>")
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
    p.add_argument("--log-every", type=int, default=t.log_every)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--eval-prompts", type=int, default=16)
    p.add_argument("--eval-budgets", default="16,64")
    p.add_argument("--eval-tokens", type=int, default=64)
    p.add_argument("--device", default=default_device())
    p.add_argument(
        "--leader",
        action="store_true",
        help="this host keeps the run's state (checkpoints, drafter, evaluation): in a multi-node "
        "job, pass it on the rank-0 host only (default: global rank 0)",
    )
    p.add_argument("--estimate", action="store_true", help="print the cost (disk, tokens/s, hours) and stop")
    return p


def parse_args(argv: Sequence[str] | None) -> RunSpec:
    a = _parser().parse_args(argv)
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
        layout=Layout(
            layers=a.draft_layers,
            block_size=a.block_size,
            heads=a.draft_heads,
            kv_heads=a.draft_kv_heads,
            head_dim=a.draft_head_dim,
            sliding_window=a.sliding_window,
            target_layer_ids=_ints(a.target_layer_ids),
        ),
        mask_token_id=a.mask_token_id,
        init_from=a.init_from,
        train=_train_spec(a),
        save_dtype=a.save_dtype,
        eval_prompts=a.eval_prompts,
        eval_budgets=_ints(a.eval_budgets) or [],
        eval_tokens=a.eval_tokens,
        device=a.device,
        leader=a.leader,
        estimate=a.estimate,
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
        log_every=a.log_every,
        seed=a.seed,
    )


def main(argv: Sequence[str] | None = None) -> int:
    spec = parse_args(argv)
    try:
        summary = run(spec)
    except (ConfigError, CurationError, ExtractionError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except LintFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        leave()
    if summary:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    exit_process(main())
