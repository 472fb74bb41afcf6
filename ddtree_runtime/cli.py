"""`python -m ddtree_runtime generate|bench|cost-table|serve|tiny`: one generation, an offline decode
benchmark, the batched rounds' cost table for `serve --budget-policy load` (`cost_table.py`), the
HTTP server (whose flags and loop live in `server/`), or the tiny demo pair's writer.

Both load the pair once (refusing a drafter that does not fit, with the lint's findings), size the
caches for the request, and print the engine's statistics; `bench` prints one JSON object per run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ddtree_runtime import server
from ddtree_runtime.batching import BatchEngine
from ddtree_runtime.config import ConfigError
from ddtree_runtime.cost_table import batch_sizes, measure, table_of, write_table
from ddtree_runtime.engine import FP8_DRAFT_HEAD, Engine, GenerationError
from ddtree_runtime.host_memory import keep_freed_memory
from ddtree_runtime.loader import default_device, default_dtype, default_threads, load_pair
from ddtree_runtime.roofline import head_elem, measure_ceilings, phase_times_s, round_floor_s
from ddtree_runtime.tiny import write_tiny_pair
from ddtree_runtime.tokenizer import Tokenizer
from specops_contract import MODES, SERVE_OPTIONS


def _serve_option(p: argparse.ArgumentParser, name: str, *, any_value: bool = False) -> None:
    """A flag `generate` and `bench` share with `serve`: type, default, choices and help from the contract."""
    option = SERVE_OPTIONS[name]
    choices = None if any_value or not option.choices else option.choices
    p.add_argument(
        f"--{name.replace('_', '-')}",
        type=option.kind,
        default=option.default,
        choices=choices,
        help=option.describe(),
    )


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target checkpoint directory (HF Qwen3)")
    _serve_option(p, "drafter")
    _serve_option(p, "budget")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-context", type=int, help="cache size in tokens (default: what the request needs)")
    _serve_option(p, "device", any_value=True)  # any torch device (cuda:1 too); None: resolved after parsing
    _serve_option(p, "dtype")
    _serve_option(p, "draft_head")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (through the chat template when the model has one)")
    prompt.add_argument("--prompt-ids", help="comma-separated token ids, used as they are")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ddtree_runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate once and print the tokens and statistics")
    _common(gen)
    _serve_option(gen, "mode")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--format", choices=("text", "json"), default="text")
    bench = sub.add_parser("bench", help="offline decode benchmark: one JSON object per run")
    _common(bench)
    bench.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    bench.add_argument("--budgets", help="ddtree: comma-separated budgets (default: --budget)")
    bench.add_argument("--runs", type=int, default=3, help="timed runs per mode and budget")
    bench.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    bench.add_argument(
        "--profile",
        action="store_true",
        help="the per-phase split of a round (on CUDA: each phase's GPU time, next to the round's hardware floor)",
    )
    costs = sub.add_parser(
        "cost-table", help="time batched rounds here: the table --budget-policy load reads"
    )
    costs.add_argument("--target", required=True, help="target checkpoint directory (HF Qwen3)")
    costs.add_argument("--drafter", required=True, help="DFlash drafter checkpoint directory")
    _serve_option(costs, "device", any_value=True)
    _serve_option(costs, "dtype")
    _serve_option(costs, "draft_head")
    costs.add_argument("--max-batch", type=int, default=16, help="the server's --max-batch (default 16)")
    costs.add_argument("--budgets", default="1,2,4,8,16", help="ddtree budgets to time, two or more")
    costs.add_argument("--context", type=int, default=512, help="prompt tokens of every sequence")
    costs.add_argument("--reps", type=int, default=5, help="timed rounds per point (the median counts)")
    costs.add_argument(
        "--threads", type=int, help="torch CPU threads (default: the server's, all cores but one)"
    )
    costs.add_argument("--out", required=True, help="the JSON file to write (serve --cost-table FILE)")
    tiny = sub.add_parser("tiny", help="write the tiny fitted demo pair (no download) and print its paths")
    tiny.add_argument("--out", required=True, help="directory for target/ and drafter/ (kept if complete)")
    tiny.add_argument("--seed", type=int, default=0)
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (ddtree_runtime/server/)")
    server.add_arguments(serve)
    args = parser.parse_args(argv)
    if args.command in ("generate", "bench", "cost-table"):
        args.device = args.device or default_device()
        args.dtype = args.dtype or default_dtype(args.device)
    return args


def _prompt_ids(args: argparse.Namespace, tokenizer: Tokenizer | None) -> list[int]:
    if args.prompt_ids is not None:
        try:
            return [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError:
            raise GenerationError(
                f"--prompt-ids {args.prompt_ids!r} is not a comma-separated list of ints"
            ) from None
    if tokenizer is None:
        raise GenerationError(
            f"{args.target}: no tokenizer.json, so --prompt cannot be encoded (fix: use --prompt-ids)"
        )
    return tokenizer.prompt_ids(args.prompt)


def _device(name: str) -> torch.device:
    """The device asked for, refused when torch cannot see it; on the CPU, freed memory kept for
    the next round (`host_memory`)."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GenerationError("--device cuda, but torch sees no CUDA device (fix: --device cpu)")
    if device.type == "cpu":
        keep_freed_memory()
    return device


def _engine(
    args: argparse.Namespace, modes: Sequence[str], budgets: Sequence[int], prompt_len: int
) -> Engine:
    device = _device(args.device)
    needs_drafter = any(m != "ar" for m in modes)
    if needs_drafter and not args.drafter:
        raise GenerationError("modes dflash and ddtree need --drafter DIR (fix: add it, or use --mode ar)")
    target, drafter = load_pair(
        args.target, args.drafter if needs_drafter else None, device, getattr(torch, args.dtype)
    )
    block = drafter.config.block_size if drafter is not None else 1
    rows = max([block, *(b + 1 for b in budgets)])
    max_context = args.max_context or min(
        target.config.max_position_embeddings, prompt_len + args.max_new_tokens + rows
    )
    return Engine(target, drafter, max_context, fp8_draft_head=FP8_DRAFT_HEAD[args.draft_head])


def _load_tokenizer(target: str) -> Tokenizer | None:
    return Tokenizer(target) if (Path(target) / "tokenizer.json").exists() else None


def generate(args: argparse.Namespace) -> int:
    tokenizer = _load_tokenizer(args.target)
    ids = _prompt_ids(args, tokenizer)
    engine = _engine(args, [args.mode], [args.budget] if args.mode == "ddtree" else [], len(ids))
    result = engine.generate(
        ids,
        mode=args.mode,
        budget=args.budget,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        stop=args.stop,
        decode=tokenizer.decode if tokenizer else None,
    )
    if args.format == "json":
        print(json.dumps(result.as_json()))
    else:
        print(result.text if result.text is not None else " ".join(map(str, result.output_ids)))
        print(
            f"[{result.mode}] {len(result.output_ids)} tokens, {result.rounds} rounds, "
            f"tau {result.mean_accepted:.2f}, {result.tokens_per_s:.1f} tok/s, stop: {result.stop_reason}",
            file=sys.stderr,
        )
    return 0


def bench(args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    budgets = [int(b) for b in args.budgets.split(",")] if args.budgets else [args.budget]
    tokenizer = _load_tokenizer(args.target)
    ids = _prompt_ids(args, tokenizer)
    engine = _engine(args, modes, budgets if "ddtree" in modes else [], len(ids))
    on_gpu = engine.device.type == "cuda"
    ceilings = measure_ceilings(engine.device) if args.profile and on_gpu else None
    for mode in modes:
        for budget in budgets if mode == "ddtree" else [None]:
            runs = []
            for i in range(args.warmup + args.runs):
                result = engine.generate(
                    ids,
                    mode=mode,
                    budget=budget or 1,
                    max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature,
                    seed=args.seed + i,
                    eos_ids=(),
                    profile=args.profile and not on_gpu,  # the CPU's split: phases timed one by one
                )
                if i >= args.warmup:
                    runs.append(result)
            tokens = sum(len(r.output_ids) for r in runs)
            seconds = sum(r.total_s for r in runs)
            rounds = [a for r in runs for a in r.accepted_per_round]
            row = {
                "mode": mode,
                "budget": budget,
                "device": str(engine.device),
                "dtype": args.dtype,
                "prompt_tokens": len(ids),
                "max_new_tokens": args.max_new_tokens,
                "runs": len(runs),
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds if seconds else 0.0,
                "rounds": len(rounds),
                "mean_accepted": sum(a + 1 for a in rounds) / len(rounds) if rounds else 0.0,
                "phase_s": {k: sum(r.phase_s[k] for r in runs) for k in runs[0].phase_s} if runs else {},
            }
            if ceilings is not None:
                phases = phase_times_s(engine, mode, budget or 1)
                context = len(ids) + args.max_new_tokens // 2
                floor = round_floor_s(
                    ceilings,
                    engine.target.config,
                    engine.drafter and engine.drafter.config,
                    mode,
                    budget or 1,
                    context,
                    head_elem(engine),
                )
                row["phase_ms"] = {k: round(1e3 * v, 3) for k, v in phases.items()}
                row["floor_ms"] = {k: round(1e3 * v, 3) for k, v in floor.items()}
                row["round_over_floor"] = round(sum(phases.values()) / sum(floor.values()), 2)
            print(json.dumps(row), flush=True)
    return 0


def cost_table(args: argparse.Namespace) -> int:
    """Time the batched rounds of the pair here and write the load policy's table."""
    try:
        budgets = sorted({int(b) for b in args.budgets.split(",") if b.strip()})
    except ValueError:
        raise GenerationError(f"--budgets {args.budgets!r} is not a comma-separated list of ints") from None
    if len(budgets) < 2 or budgets[0] < 1:
        raise GenerationError(
            f"--budgets {args.budgets}: two budgets of 1 or more tell drafting's share from the rows' "
            "(fix: e.g. --budgets 1,2,4,8,16)"
        )
    for name in ("max_batch", "context", "reps"):
        if getattr(args, name) < 1:
            raise GenerationError(f"--{name.replace('_', '-')} {getattr(args, name)}: at least 1")
    device = _device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads or default_threads())
    target, drafter = load_pair(args.target, args.drafter, device, getattr(torch, args.dtype))
    assert drafter is not None
    block = drafter.config.block_size
    batches = batch_sizes(args.max_batch)
    max_context = args.context + (args.reps + 4) * block + budgets[-1] + 1
    engine = BatchEngine(
        target, drafter, max_context, batches[-1], fp8_draft_head=FP8_DRAFT_HEAD[args.draft_head]
    )
    print(
        f"timing {len(batches) * (len(budgets) + 1)} round shapes on {device} ({args.dtype})", file=sys.stderr
    )

    def shown(row: dict[str, Any]) -> None:
        print(
            f"  {row['config']:>10} x {row['batch']:>3}: {row['round_ms']:8.2f} ms a round", file=sys.stderr
        )

    table = table_of(measure(engine, batches, budgets, args.context, args.reps, shown))
    write_table(args.out, table)
    print(json.dumps({"out": args.out, **table}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "serve":
        return server.run(args)
    if args.command == "tiny":
        pair = write_tiny_pair(args.out, seed=args.seed)
        print(json.dumps({"target": str(pair.target), "drafter": str(pair.drafter)}))
        return 0
    try:
        if args.command == "cost-table":
            return cost_table(args)
        return generate(args) if args.command == "generate" else bench(args)
    except (ConfigError, GenerationError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
