"""Decode benchmark of the three modes on the tiny fitted pair, plus token agreement with `ar`.

Prints, per mode (and budget): tokens/s, τ (mean accepted drafts + 1), the phase split, and how
often the mode's tokens equal `ar`'s. At float32 they must all be equal; in bf16, near-ties may send
a mode down another path, so each divergence is listed with the target's logit margin there
(|logit(ar token) - logit(mode token)| from a fresh prefill of the shared prefix).

    python benchmarks/runtime_bench.py --device cuda --dtype bfloat16 [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.engine import Engine
from ddtree_runtime.loader import default_device, load_pair
from ddtree_runtime.tiny import SPECIALS, write_tiny_pair


def margin_at(engine: Engine, prompt: list[int], shared: list[int], a: int, b: int) -> float:
    ids = torch.tensor(prompt + shared, device=engine.device)
    with torch.inference_mode():
        logits, _ = engine.target(
            ids, torch.arange(len(ids), device=engine.device), 0, None, engine.backend, False
        )
    return abs(float(logits[-1, a] - logits[-1, b]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default=default_device())
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--backend", default="auto", choices=["auto", "torch"])
    p.add_argument("--pair", help="tiny pair directory (written there if missing)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--budgets", default="8,32,128")
    p.add_argument("--json", help="write all rows here too")
    args = p.parse_args()

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    pair_dir = Path(args.pair or Path(tempfile.gettempdir()) / "specops-tiny-pair")
    t0 = time.perf_counter()
    pair = write_tiny_pair(pair_dir)
    fit_s = time.perf_counter() - t0
    target, drafter = load_pair(pair.target, pair.drafter, device, dtype)
    engine = Engine(target, drafter, 1024, TorchBackend() if args.backend == "torch" else None)
    rng = random.Random(0)
    prompts = [
        [len(SPECIALS) + rng.randrange(64) for _ in range(rng.randint(4, 16))] for _ in range(args.prompts)
    ]
    configs = [("ar", 1), ("dflash", 1), *(("ddtree", int(b)) for b in args.budgets.split(","))]

    refs: dict[int, list[int]] = {}
    rows = []
    for mode, budget in configs:
        engine.generate(prompts[0], mode=mode, budget=budget, max_new_tokens=8, eos_ids=())  # warm-up
        tokens = seconds = 0.0
        accepted: list[int] = []
        phases = dict.fromkeys(("prefill", "draft", "tree", "verify", "walk", "compact"), 0.0)
        same = matched = 0
        divergences = []
        for i, prompt in enumerate(prompts):
            run = engine.generate(
                prompt, mode=mode, budget=budget, max_new_tokens=args.max_new_tokens, eos_ids=()
            )
            tokens += len(run.output_ids)
            seconds += run.total_s
            accepted += run.accepted_per_round
            prof = engine.generate(
                prompt, mode=mode, budget=budget, max_new_tokens=args.max_new_tokens, eos_ids=(), profile=True
            )
            for k, v in prof.phase_s.items():
                phases[k] += v
            ref = refs.setdefault(i, run.output_ids)
            k = next((j for j, (a, b) in enumerate(zip(ref, run.output_ids, strict=True)) if a != b), None)
            same += k is None
            matched += len(ref) if k is None else k
            if k is not None:
                m = margin_at(engine, prompt, ref[:k], ref[k], run.output_ids[k])
                divergences.append({"prompt": i, "position": k, "logit_margin": round(m, 4)})
        row = {
            "mode": mode,
            "budget": budget if mode == "ddtree" else None,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "dtype": args.dtype,
            "backend": engine.backend.name,
            "prompts": len(prompts),
            "tokens": int(tokens),
            "tokens_per_s": round(tokens / seconds, 1),
            "tau": round(sum(a + 1 for a in accepted) / len(accepted), 3),
            "exact_match_vs_ar": f"{same}/{len(prompts)}",
            "token_match_rate_vs_ar": round(matched / (len(prompts) * args.max_new_tokens), 4),
            "divergences": divergences,
            "phase_share": {k: round(v / max(sum(phases.values()), 1e-12), 3) for k, v in phases.items()},
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\npair written/fitted in {fit_s:.1f} s; {args.device} {args.dtype} backend={engine.backend.name}")
    print(f"{'mode':8} {'B':>4} {'tok/s':>9} {'tau':>6} {'match':>7} {'exact':>6}  divergence margins")
    for r in rows:
        margins = ",".join(str(d["logit_margin"]) for d in r["divergences"]) or "-"
        print(
            f"{r['mode']:8} {r['budget'] or '':>4} {r['tokens_per_s']:>9.1f} {r['tau']:>6.2f} "
            f"{r['token_match_rate_vs_ar']:>7.3f} {r['exact_match_vs_ar']:>6}  {margins}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
