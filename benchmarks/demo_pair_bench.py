"""The committed demo pair (demo_pair/) on the direct generate path: tokens/s and τ per mode at T=0.

Each held-out prompt (demo_pair/held_out_prompts.jsonl: code from stdlib files the target never
trained on) is decoded by `Engine.generate`, the call `python -m ddtree_runtime generate` makes,
after one untimed warm-up; EOS is ignored so every mode emits the same number of tokens. Prints one
row per mode and budget with the speedup over `ar` measured in the same run.

    OMP_NUM_THREADS=1 python benchmarks/demo_pair_bench.py [--prompts 8] [--max-new-tokens 96] [--dtype D] [--draft-head fp8]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from ddtree_runtime.engine import FP8_DRAFT_HEAD, Engine
from ddtree_runtime.loader import default_dtype, load_pair
from ddtree_runtime.tokenizer import Tokenizer

PAIR = Path(__file__).resolve().parent.parent / "demo_pair"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pair", default=str(PAIR))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--budgets", default="16,32,64")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=default_dtype("cpu"))
    p.add_argument("--draft-head", choices=tuple(FP8_DRAFT_HEAD), default="auto", help="as serve's")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    pair = Path(a.pair)
    tok = Tokenizer(pair / "target")
    rows = [json.loads(line)["prompt"] for line in (pair / "held_out_prompts.jsonl").read_text().splitlines()]
    prompts = [tok.encode(r)[-128:] for r in rows[: a.prompts]]
    target, drafter = load_pair(
        pair / "target", pair / "drafter", torch.device("cpu"), getattr(torch, a.dtype)
    )
    budgets = [int(b) for b in a.budgets.split(",")]
    fp8_head = FP8_DRAFT_HEAD[a.draft_head]
    engine = Engine(target, drafter, 128 + a.max_new_tokens + max(budgets) + 1, fp8_draft_head=fp8_head)
    runs = [("ar", None), ("dflash", None), *(("ddtree", b) for b in budgets)]
    print(
        f"demo pair, {len(prompts)} held-out prompts, {a.max_new_tokens} new tokens, T=0, {a.dtype}, "
        f"drafts through {type(engine.draft_head).__name__}, "
        f"{a.threads} thread(s), {platform.machine()} x{torch.get_num_threads()} torch {torch.__version__}"
    )
    print(f"{'mode':>7} {'budget':>6} {'tok/s':>8} {'tau':>6} {'vs ar':>7}")
    base = None
    for mode, budget in runs:
        engine.generate(prompts[0], mode=mode, budget=budget or 1, max_new_tokens=8, eos_ids=())
        tokens = seconds = 0.0
        accepted: list[int] = []
        for ids in prompts:
            r = engine.generate(
                ids, mode=mode, budget=budget or 1, max_new_tokens=a.max_new_tokens, eos_ids=()
            )
            tokens, seconds = tokens + len(r.output_ids), seconds + r.total_s
            accepted += r.accepted_per_round
        rate = tokens / seconds
        base = base or rate
        tau = sum(x + 1 for x in accepted) / len(accepted)
        print(f"{mode:>7} {budget or '-':>6} {rate:8.1f} {tau:6.2f} {rate / base:6.2f}x", flush=True)


if __name__ == "__main__":
    main()
