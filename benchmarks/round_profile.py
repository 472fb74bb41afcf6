"""Where a graphed round's GPU time goes: every kernel of one replayed round, summed by name.

The speed goals are whole-round ratios to the floor; this says which kernels hold the rest. It
builds the pair of `roofline.py` (random weights in the real shapes, on the GPU), prefills a
context, then profiles `--reps` replays of the round's CUDA graph with the PyTorch profiler (CUPTI
records the kernels inside a graph) and prints per kernel name: launches per round, µs per round
and share of the round's kernel time, then the kernel sequence of the round's first layers (which
matmul is which) and the wall time per replay.

    python benchmarks/round_profile.py --shape qwen3.6-27b --context 4096 --rounds ar,ddtree/256
    python benchmarks/round_profile.py --shape qwen3-8b --context 32768 --rounds ddtree/64
    python benchmarks/round_profile.py --fp8 block --rounds ar,ddtree/64    # an FP8 target (issue 23)
    python benchmarks/round_profile.py --draft-head both     # the drafts through the bf16 head, then its FP8 copy
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fp8_bench import quantize_linears
from benchmarks.roofline import SHAPES, random_pair, replay_ms, round_key
from ddtree_runtime.engine import FP8_DRAFT_HEAD, Engine


def kernel_events(prof: profile) -> list[tuple[str, float]]:
    """(name, µs) of every GPU kernel the profile saw, in start order."""
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.elapsed_us()) for e in events if "Memcpy" not in e.name]


def profile_round(
    engine: Engine, prompt: list[int], mode: str, budget: int, args: argparse.Namespace
) -> dict:
    """Prefill `prompt`, then time and profile `args.reps` replays of the round's graph."""
    engine.generate(prompt, mode=mode, budget=max(budget, 1), max_new_tokens=2, eos_ids=())
    key = round_key(engine, mode, budget, 2 * args.reps)  # the timed replays, then the profiled ones
    wall_us = 1e3 * replay_ms(engine, key, args.reps)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.reps):
            engine.graphs.replay(key)
        torch.cuda.synchronize()
    kernels = kernel_events(prof)
    total: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, us in kernels:
        total[name][0] += 1
        total[name][1] += us
    busy = sum(us for _, us in kernels) / args.reps
    table = sorted(
        ({"kernel": n, "per_round": c / args.reps, "us": us / args.reps} for n, (c, us) in total.items()),
        key=lambda r: -r["us"],
    )
    print(
        f"\n{args.shape} {mode}{'/' + str(budget) if budget else ''} at {args.context}: {wall_us:.0f} µs a "
        f"replay, {busy:.0f} µs of kernels ({len(kernels) / args.reps:.0f} launches)"
    )
    print(f"{'µs/round':>9} {'share':>6} {'n':>5}  kernel")
    for r in table[: args.top]:
        print(f"{r['us']:>9.1f} {100 * r['us'] / busy:>5.1f}% {r['per_round']:>5.0f}  {r['kernel'][:110]}")
    print("the round's first kernels, in order (µs):")
    for name, us in kernels[: args.sequence]:
        print(f"{us:>8.1f}  {name[:110]}")
    return {"mode": mode, "budget": budget, "wall_us": wall_us, "kernel_us": busy, "kernels": table}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3.6-27b")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--rounds", default="ar,ddtree/64", help="rounds to profile: ar, dflash, ddtree/B")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sequence", type=int, default=60, help="kernels of the round's start to list in order")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--fp8", choices=["block", "channel"], help="quantize the target's decoder linears first")
    p.add_argument(
        "--draft-head",
        choices=[*FP8_DRAFT_HEAD, "both"],
        default="auto",
        help="the drafts' LM head as `serve --draft-head` takes it, or both: the target's, then its FP8 copy",
    )
    p.add_argument("--json", help="write the per-name tables here")
    args = p.parse_args()
    rounds = [(m, int(b or 0)) for m, _, b in (r.partition("/") for r in args.rounds.split(","))]
    target, drafter = random_pair(args.shape, torch.device("cuda"), torch.bfloat16, small=False)
    if args.fp8:
        quantize_linears(target, args.fp8)
    prompt = torch.randint(0, target.config.vocab_size, (args.context,)).tolist()
    heads = [False, True] if args.draft_head == "both" else [FP8_DRAFT_HEAD[args.draft_head]]
    tables = []
    for fp8_head in heads:  # one engine at a time: the next one's caches and graphs replace its own
        engine = Engine(target, drafter, args.context + 2048, fp8_draft_head=fp8_head)
        head = type(engine.draft_head).__name__
        print(f"\n=== drafts through {head} ===", flush=True)
        engine.warmup([m for m, _ in rounds], sorted({max(b, 1) for _, b in rounds}), max_prompt=64)
        tables += [{**profile_round(engine, prompt, m, b, args), "draft_head": head} for m, b in rounds]
        del engine
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(tables, indent=1))


if __name__ == "__main__":
    main()
