"""Batched round cost against batch size: `ar` steps and `ddtree` rounds of `BatchEngine`.

Random weights in the shapes of `benchmarks/roofline.py` (no downloads). For each batch size N and
each config (`ar`, `ddtree` at each budget) it fills N slots with prompts of `--context` tokens,
prefills them, then times `--reps` rounds of all N together (wall time per `step`, a round of
every slot: drafting, the one verify pass over all slots' trees, the walks and the commits). On
CUDA the `ar` rounds replay the engine's captured step (`ar`), and the same engine's eager `ar`
round is timed too (`ar eager`); the ddtree rounds (one budget for all) replay its captured tree
rounds. Rows: ms per round, ms per round
per sequence, the ratio to the `ar` step at the same N (the issue's goal: <= 2x at N = 16 for the
load-chosen budget) and projected tokens/s in total at tau 3, 5 and 7 (random drafts are never
accepted, so tau is projected, not measured).
`--cost-table` writes these rows as the cost table `--budget-policy load` reads
(`ddtree_runtime/budgets.py`; `ddtree_runtime/cost_table.py`'s `table_of`, which `python -m
ddtree_runtime cost-table` also runs on a host): the rounds less their drafting share against
their total verify rows, and that share (the drafter's pass and the slots' trees, told from the
rows' cost by two budgets or more) against the slots that draft; with `--pair` too, it measures that
pair's rounds instead of the end-to-end rows below (e.g. the demo pair's table for a CPU server).

    python benchmarks/batch_bench.py --shape qwen3-8b [--batches 1,4,16] [--budgets 16,64,256]
        [--context 1024] [--json OUT.json] [--cost-table costs.json]
    python benchmarks/batch_bench.py --small --device cpu     # a CPU smoke run of the script

The rounds batch attention, a hybrid's DeltaNet `ar` steps and verify trees of one size and the
greedy walks over the slots (`attention_parts`, `gdn_steps`, `gdn_forest`, `tree_walk_parts`: one
Triton launch (set) per layer on CUDA). (The per-slot comparison, `--per-slot`, went when tree
rounds came to need those seams: RESULTS.md keeps its rows.)

`--pair DIR` (e.g. `demo_pair`) measures end to end on a real pair instead: N held-out prompts
decoded together (`BatchEngine.run`, T = 0, EOS ignored) for `ar`, each ddtree budget and the load
policy (`--load-costs FILE`: its cost table, else the simple model), as total tokens/s, tau, the
share of the load policy's rounds that ran no drafter pass, and the ratio to the same config one
request at a time (`Engine.generate`, the `--max-batch 1` server's path):

    OMP_NUM_THREADS=1 python benchmarks/batch_bench.py --pair demo_pair --device cpu --batches 1,4,16
    OMP_NUM_THREADS=1 python benchmarks/batch_bench.py --pair demo_pair --device cpu --batches 16 \
        --budgets 1,2,4,8,16 --context 128 --reps 5 --cost-table costs.json   # the pair's table
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.roofline import SHAPES, random_pair
from ddtree_runtime.backend import select_backend
from ddtree_runtime.batching import BatchEngine
from ddtree_runtime.budgets import BudgetPolicy, CostTable, CostTableError
from ddtree_runtime.cost_table import round_ms, table_of, write_table
from ddtree_runtime.host_memory import keep_freed_memory
from ddtree_runtime.loader import default_device, load_pair
from ddtree_runtime.tokenizer import Tokenizer
from specops_contract import verify_rows

TAUS = (3, 5, 7)


def pair_rows(
    args: argparse.Namespace,
    batches: list[int],
    budgets: list[int],
    costs: CostTable | None,
    dtype: torch.dtype,
) -> None:
    """End to end on a real pair: total tokens/s of N requests together against one at a time."""
    pair, device = Path(args.pair), torch.device(args.device)
    tok = Tokenizer(pair / "target")
    texts = [
        json.loads(line)["prompt"] for line in (pair / "held_out_prompts.jsonl").read_text().splitlines()
    ]
    prompts = [tok.encode(t)[-128:] for t in texts]
    target, drafter = load_pair(pair / "target", pair / "drafter", device, dtype)
    rows = verify_rows("ddtree", drafter.config.block_size, max(budgets))  # at least the drafter's block
    engine = BatchEngine(target, drafter, 128 + args.max_new_tokens + rows, max(batches))
    print(f"{pair} on {device}, {dtype}, {args.max_new_tokens} new tokens, T=0, eager batched rounds")
    print(f"{'config':>12} {'N':>4} {'tok/s':>8} {'tau':>6} {'x alone':>8} {'no draft':>8}")
    for mode, budget, policy in [("ar", 1, None), *(("ddtree", b, None) for b in budgets),
                                 ("ddtree", max(budgets), BudgetPolicy(tuple(budgets), costs))]:  # fmt: skip
        engine.policy = policy
        name = "ar" if mode == "ar" else (f"ddtree/{budget}" if policy is None else "ddtree/load")

        def request(i: int, mode: str = mode, budget: int = budget) -> dict[str, object]:
            ids = prompts[i % len(prompts)]
            return {
                "prompt_ids": ids,
                "mode": mode,
                "budget": budget,
                "max_new_tokens": args.max_new_tokens,
                "eos_ids": (),
            }

        engine.run([request(0)])  # warm-up
        t = time.perf_counter()
        alone = [engine.generate(**request(i)) for i in range(min(4, len(prompts)))]  # type: ignore[arg-type]
        alone_rate = sum(len(r.output_ids) for r in alone) / (time.perf_counter() - t)
        for n in batches:
            t, rounds_before, drafts_before = time.perf_counter(), engine.rounds, engine.drafts
            results = engine.run([request(i) for i in range(n)])
            rate = sum(len(r.output_ids) for r in results) / (time.perf_counter() - t)
            rounds = [a + 1 for r in results for a in r.accepted_per_round]
            spec_rounds = engine.rounds - rounds_before
            undrafted = 1 - (engine.drafts - drafts_before) / spec_rounds if mode != "ar" else 0.0
            print(
                f"{name:>12} {n:>4} {rate:>8.1f} {sum(rounds) / len(rounds):>6.2f} "
                f"{rate / alone_rate:>7.2f}x {undrafted:>8.0%}",
                flush=True,
            )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--device", default=default_device())
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: bfloat16 on CUDA, else float32")
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--budgets", default="16,64,256")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--small", action="store_true", help="tiny sizes for a CPU smoke run")
    p.add_argument("--json", help="write the rows here too")
    p.add_argument(
        "--cost-table", help="write the rows as a --budget-policy load cost table (with --pair too)"
    )
    p.add_argument("--pair", help="a real pair directory (with held_out_prompts.jsonl): end-to-end rows")
    p.add_argument("--load-costs", help="with --pair: the cost table the ddtree/load row reads")
    p.add_argument("--max-new-tokens", type=int, default=96, help="with --pair")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":  # as the server and the CLI run on the CPU
        keep_freed_memory()
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    batches = [int(b) for b in args.batches.split(",")]
    budgets = [int(b) for b in args.budgets.split(",")]
    if args.cost_table and len(budgets) < 2:
        p.error(
            "--cost-table needs two budgets or more, to tell drafting's share from the rows' (fix: --budgets 1,2,4,8,16)"
        )
    try:
        costs = CostTable.load(args.load_costs) if args.load_costs else None
    except CostTableError as e:
        p.error(f"--load-costs {e}")
    if args.pair and not args.cost_table:
        pair_rows(args, batches, budgets, costs, dtype)
        return
    context = 16 if args.small else args.context
    if args.pair:
        target, drafter = load_pair(Path(args.pair) / "target", Path(args.pair) / "drafter", device, dtype)
    else:
        target, drafter = random_pair(args.shape, device, dtype, args.small)
    max_context = context + (args.reps + 4) * drafter.config.block_size + max(budgets) + 1
    backend = select_backend(device)
    engine = BatchEngine(target, drafter, max_context, max(batches), backend)
    models = args.pair or f"{args.shape}{' (small)' if args.small else ''}"
    print(
        f"{models} on {device}, {dtype}, context {context}, "
        f"{'graphed rounds' if engine.step_graphs else 'eager rounds'}, "
        f"{backend.name} backend, batched attention, DeltaNet steps and trees, and walks"
    )
    print(
        f"{'config':>12} {'N':>4} {'ms/round':>9} {'ms/seq':>8} {'x ar':>6}  "
        + "  ".join(f"tok/s@tau{t}" for t in TAUS)
    )
    rows = []
    graphs = engine.step_graphs
    for n in batches:
        measured = {"ar": round_ms(engine, n, "ar", 1, context, args.reps)}
        if graphs is not None:  # the same engine without its step graphs: the eager `ar` round
            engine.step_graphs = None
            measured["ar eager"] = round_ms(engine, n, "ar", 1, context, args.reps)
            engine.step_graphs = graphs
        ar = measured["ar"]
        for mode, budget in [*((m, 0) for m in measured), *(("ddtree", b) for b in budgets)]:
            ms = measured[mode] if mode in measured else round_ms(engine, n, mode, budget, context, args.reps)
            rates = [n * (1 if mode.startswith("ar") else tau) / ms * 1e3 for tau in TAUS]
            name = mode if mode.startswith("ar") else f"ddtree/{budget}"
            print(
                f"{name:>12} {n:>4} {ms:>9.2f} {ms / n:>8.2f} {ms / ar:>6.2f}  "
                + "  ".join(f"{r:>11.0f}" for r in rates)
            )
            rows.append({"config": name, "batch": n, "budget": budget, "round_ms": ms, "x_ar": ms / ar})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if args.cost_table:
        # a load policy's rounds between probes replay graphs as these rows do (tree rounds, and at
        # budget 0 the step of every root): the eager `ar` round is no point of the table
        table = table_of([r for r in rows if r["config"] != "ar eager"])
        write_table(args.cost_table, table)
        shares = zip(table["draft_slots"], table["draft_seconds"], strict=True)
        print(
            f"cost table written to {args.cost_table}: "
            + ", ".join(f"drafting {n} slots {1e3 * t:.2f} ms" for n, t in shares)
        )


if __name__ == "__main__":
    main()
