"""What asking for logprobs costs per mode: tokens/s without them and with `logprobs` 20.

On CUDA a request with logprobs runs its rounds eagerly (the captured graphs hold no logprobs
step), so this measures that choice: graphed greedy rounds against eager rounds plus the
log_softmax and top-20 of the emitted rows. Greedy, the same prompts for both.

    python benchmarks/logprobs_bench.py --device cuda --dtype bfloat16 [--target DIR --drafter DIR]

Without --target it writes and uses the tiny fitted pair.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from ddtree_runtime.engine import Engine
from ddtree_runtime.loader import default_device, load_pair
from ddtree_runtime.logprobs import MAX_LOGPROBS
from ddtree_runtime.tiny import write_tiny_pair


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default=default_device())
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--target", help="target checkpoint (default: the tiny pair)")
    p.add_argument("--drafter", help="drafter checkpoint (with --target)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--budget", type=int, default=32)
    p.add_argument("--max-context", type=int, default=2048)
    args = p.parse_args()

    if args.target is None:
        pair = write_tiny_pair(Path(tempfile.gettempdir()) / "specops-tiny-pair")
        args.target, args.drafter = pair.target, pair.drafter
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    target, drafter = load_pair(args.target, args.drafter, device, dtype)
    engine = Engine(target, drafter, args.max_context)
    modes = ("ar", "dflash", "ddtree") if drafter is not None else ("ar",)
    engine.warmup(modes, (args.budget,), max_prompt=64)
    vocab = target.config.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(32)] for _ in range(args.prompts)]

    print(f"{'mode':8} {'tok/s':>10} {'tok/s lp20':>11} {'ratio':>6}")
    for mode in modes:
        rates = []
        for logprobs in (None, min(MAX_LOGPROBS, vocab)):
            engine.generate(prompts[0], mode=mode, budget=args.budget, max_new_tokens=8, logprobs=logprobs)
            tokens, start = 0, time.perf_counter()
            for prompt in prompts:
                out = engine.generate(
                    prompt,
                    mode=mode,
                    budget=args.budget,
                    max_new_tokens=args.max_new_tokens,
                    eos_ids=(),
                    logprobs=logprobs,
                )
                tokens += len(out.output_ids)
            rates.append(tokens / (time.perf_counter() - start))
        print(f"{mode:8} {rates[0]:10.1f} {rates[1]:11.1f} {rates[1] / rates[0]:6.2f}")


if __name__ == "__main__":
    main()
