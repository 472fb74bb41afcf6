"""The batched rounds' cost on this machine: the table `serve --budget-policy load` reads.

`python -m ddtree_runtime cost-table --target DIR --drafter DIR --out FILE` fills N cache slots with
random prompts of `--context` tokens and times `ar` rounds and ddtree rounds of each budget at each
N (the median of `--reps` rounds, after one untimed round: on CUDA the first captures its graph),
then writes them as `budgets.CostTable.load` reads them (`table_of`). It runs where the server will
run (the surface is the machine's, not the model's), before the server starts: on a GPU the two
would share its memory. `benchmarks/batch_bench.py --cost-table` measures through the same code.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ddtree_runtime.batching import BatchEngine

Row = dict[str, Any]  # {"config": "ar" | "ddtree/B", "batch": N, "budget": B (0: ar), "round_ms": ms}


def round_ms(engine: BatchEngine, n: int, mode: str, budget: int, context: int, reps: int) -> float:
    """Median wall ms of one batched round of `n` sequences in `mode`, after their prefills."""
    vocab = engine.target.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    for _ in range(n):
        prompt = torch.randint(0, vocab, (context,), generator=gen).tolist()
        engine.add(prompt, mode=mode, budget=budget, max_new_tokens=(reps + 2) * engine.block, eos_ids=())
    while any(not s.decoding for s in engine.live):
        engine.step()
    engine.step()  # one round untimed: on CUDA the first round of n sequences captures its graph
    times = []
    for _ in range(reps):
        sync(engine.device)
        t = time.perf_counter()
        engine.step()
        sync(engine.device)
        times.append(time.perf_counter() - t)
    engine.abort()  # the slots back for the next row
    return 1e3 * sorted(times)[len(times) // 2]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    engine: BatchEngine,
    batches: Sequence[int],
    budgets: Sequence[int],
    context: int,
    reps: int,
    progress: Callable[[Row], None] = lambda row: None,
) -> list[Row]:
    """At each batch size, the `ar` round and a ddtree round of each budget; `progress` sees each
    row as it is measured (a sweep takes minutes)."""
    rows = []
    for n in batches:
        for budget in (0, *budgets):
            mode = "ddtree" if budget else "ar"
            ms = round_ms(engine, n, mode, budget or 1, context, reps)
            rows.append(
                {
                    "config": f"ddtree/{budget}" if budget else "ar",
                    "batch": n,
                    "budget": budget,
                    "round_ms": ms,
                }
            )
            progress(rows[-1])
    return rows


def table_of(rows: Sequence[Row]) -> dict[str, list[float]]:
    """The rounds as a cost table. At each N, the ddtree rounds, extended along their least-squares
    line against verify rows to budget 0 (N rows), cost more than the `ar` round of N rows by what
    drafting itself costs: the drafter's pass and each slot's tree (build, plan, walk, commit);
    that share goes against N drafting slots, and the rest of each round at the largest N against
    its verify rows (the table keys on rows alone, and a round of fewer slots costs less at the
    same rows: the batch the policy has to narrow is the largest)."""
    shares: dict[int, float] = {}  # N -> seconds
    for n in sorted({r["batch"] for r in rows}):
        ar = next(r["round_ms"] for r in rows if r["batch"] == n and not r["budget"])
        trees = [(n * (r["budget"] + 1), r["round_ms"]) for r in rows if r["batch"] == n and r["budget"]]
        slope, intercept = statistics.linear_regression(*zip(*trees, strict=True))
        shares[n] = max(intercept + slope * n - ar, 1e-3) / 1e3
    n = max(shares)
    table = sorted(
        (n * (r["budget"] + 1), max(r["round_ms"] / 1e3 - (shares[n] if r["budget"] else 0.0), 1e-6))
        for r in rows
        if r["batch"] == n
    )
    return {
        "rows": [r for r, _ in table],
        "seconds": [s for _, s in table],
        "draft_slots": sorted(shares),
        "draft_seconds": [shares[n] for n in sorted(shares)],
    }


def write_table(path: str | Path, table: dict[str, list[float]]) -> None:
    """The table into `path` whole or not at all (a server may read it at any time)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(table) + "\n")
    os.replace(tmp, path)


def batch_sizes(max_batch: int) -> list[int]:
    """1, 4, 16, ... below `max_batch`, then `max_batch`: the draft share's points and the batch
    whose rows the table keeps."""
    sizes, n = [], 1
    while n < max_batch:
        sizes.append(n)
        n *= 4
    return [*sizes, max_batch]
