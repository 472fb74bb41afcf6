"""Whole-round speed against the hardware floor, on the GPU machine itself (issue: runtime speed).

Builds Qwen3-8B-shaped models with random weights on the GPU (no downloads: target 36 layers,
hidden 4096, 32/8 heads, head_dim 128, intermediate 12288, vocab 151936; DFlash drafter 5 layers,
block 16, target_layer_ids [1, 9, 17, 25, 33]), measures the ceilings in the same run, and times:

- the `ar` step, one round per token (wall time of `Engine.generate`, host sync included, and the
  GPU time of the replayed graph);
- the verify pass alone over 257 tree nodes (the target's forward, one CUDA graph);
- `dflash` and `ddtree` rounds, with the per-phase split of the ddtree B=256 round;
- the grid: budgets x contexts, each round as a multiple of one `ar` step at that context;
- peak GPU memory per context against weights + KV cache.

Each figure is printed next to its floor (`ddtree_runtime/roofline.py`) as a ratio, all rows go to
`--json`, and `--results` appends a table to benchmarks/RESULTS.md.

    python benchmarks/roofline.py [--contexts 1024,4096,16384,32768] [--budgets 16,64,256,512]
                                  [--json OUT.json] [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch
from triton.testing import do_bench

from ddtree_runtime.config import DFlashConfig, Qwen3Config
from ddtree_runtime.engine import Engine
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.qwen3 import Qwen3
from ddtree_runtime.roofline import Ceilings, measure_ceilings, pass_cost, phase_times_s, round_floor_s

TARGET = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
}
DRAFTER = {
    **TARGET,
    "architectures": ["DFlashDraftModel"],
    "num_hidden_layers": 5,
    "block_size": 16,
    "num_target_layers": 36,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "layer_types": ["full_attention"] * 5,
}


def random_pair(device: torch.device, dtype: torch.dtype) -> tuple[Qwen3, DFlashDrafter]:
    """The two models with random weights drawn on the device (norms near 1, matrices ~1/sqrt(fan-in))."""
    tcfg = Qwen3Config.from_dict(TARGET, Path("<qwen3-8b shapes>"))
    dcfg = DFlashConfig.from_dict(DRAFTER, Path("<qwen3-8b-dflash shapes>"))
    models = []
    for cls, cfg in ((Qwen3, tcfg), (DFlashDrafter, dcfg)):
        with torch.device(device):
            model = cls(cfg).to(dtype)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim == 1:
                    p.normal_(1.0, 0.05)
                else:
                    p.normal_(0.0, 1.0 if "embed" in name else p.shape[1] ** -0.5)
        model.fuse()
        models.append(model.eval())
    return models[0], models[1]


def verify_pass_ms(engine: Engine, context: int, nodes: int) -> float:
    """The target's forward over a random `nodes`-node tree at `context`, one graph, median."""
    target, backend, device = engine.target, engine.backend, engine.device
    gen = torch.Generator().manual_seed(nodes)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, nodes)])
    depth = torch.zeros(nodes, dtype=torch.int64)
    for i in range(1, nodes):
        depth[i] = depth[parents[i]] + 1
    parents, depth = parents.to(device), depth.to(device)
    tokens = torch.randint(0, target.config.vocab_size, (nodes,), device=device)
    ctx = torch.full((), context, dtype=torch.int64, device=device)
    bound = context + nodes

    def run() -> None:
        vis = backend.tree_visibility(parents, depth)
        target(tokens, ctx + depth, ctx, vis, backend, key_bound=bound, logits_dtype=None)

    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return do_bench(graph.replay, warmup=25, rep=100, return_mode="median")


def measure_context(
    engine: Engine, ceil: Ceilings, context: int, budgets: list[int], new_tokens: int
) -> list[dict]:
    """Every mode at one context: wall and GPU time per round, floors, ratios, peak memory."""
    tcfg, dcfg = engine.target.config, engine.drafter.config
    prompt = torch.randint(
        0, tcfg.vocab_size, (context,), generator=torch.Generator().manual_seed(context)
    ).tolist()
    rows = []
    ar_ms = None
    for mode, budget in [("ar", 0), ("dflash", 0), *(("ddtree", b) for b in budgets)]:
        engine.generate(prompt[:64], mode=mode, budget=max(budget, 1), max_new_tokens=4, eos_ids=())
        torch.cuda.reset_peak_memory_stats()
        res = engine.generate(prompt, mode=mode, budget=max(budget, 1), max_new_tokens=new_tokens, eos_ids=())
        wall_ms = 1e3 * res.phase_s["round"] / max(1, res.rounds)
        floor = round_floor_s(ceil, tcfg, dcfg, mode, budget, context)
        floor_ms = 1e3 * (floor["target"] + floor["drafter"])
        row = {
            "context": context,
            "mode": mode,
            "budget": budget or None,
            "rounds": res.rounds,
            "tau": round(res.mean_accepted, 2),
            "round_ms": round(wall_ms, 3),
            "floor_ms": round(floor_ms, 3),
            "ratio": round(wall_ms / floor_ms, 2),
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        }
        if mode == "ar":
            ar_ms = wall_ms
        row["x_ar_step"] = round(wall_ms / ar_ms, 2) if ar_ms else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--contexts", default="1024,4096,16384,32768")
    p.add_argument("--budgets", default="16,64,256,512")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per timed run")
    p.add_argument("--json", help="write every row here")
    p.add_argument("--results", help="append a dated table to this RESULTS.md")
    args = p.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    contexts = [int(c) for c in args.contexts.split(",")]
    budgets = [int(b) for b in args.budgets.split(",")]
    name = torch.cuda.get_device_name(device)

    ceil = measure_ceilings(device)
    print(
        f"{name}: copy {ceil.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 matmul {ceil.matmul_flops_per_s / 1e12:.0f} TFLOP/s"
    )
    target, drafter = random_pair(device, dtype)
    weights = sum(t.numel() * t.element_size() for m in (target, drafter) for t in m.parameters())
    max_context = max(contexts) + 1024
    engine = Engine(target, drafter, max_context)
    kv = 2 * sum(c.numel() * c.element_size() for c in (target.k_cache, drafter.k_cache))
    t0 = time.perf_counter()
    engine.warmup(["ar", "dflash", "ddtree"], budgets, max_prompt=64)
    warm_s = time.perf_counter() - t0
    print(
        f"weights {weights / 2**30:.2f} GiB, KV at {max_context} {kv / 2**30:.2f} GiB, warm-up {warm_s:.1f} s "
        f"({len(engine.graphs.graphs)} graphs), allocated {torch.cuda.memory_allocated() / 2**30:.2f} GiB"
    )

    rows = []
    for context in contexts:
        rows += measure_context(engine, ceil, context, budgets, args.new_tokens)

    # the verify pass alone and the round's phases, at 4096 (or the first context)
    context = 4096 if 4096 in contexts else contexts[0]
    tcfg = target.config
    verify_ms = verify_pass_ms(engine, context, 257)
    verify_floor = 1e3 * ceil.floor_s(*pass_cost(tcfg, 257, context, 257))
    prompt = list(range(100, 100 + context))
    engine.generate(prompt, mode="ddtree", budget=256, max_new_tokens=2, eos_ids=())
    phases = {k: 1e3 * v for k, v in phase_times_s(engine, "ddtree", 256).items()}
    floor = round_floor_s(ceil, tcfg, drafter.config, "ddtree", 256, context)
    outside = sum(v for k, v in phases.items() if k in ("tree", "walk", "compact"))
    summary = {
        "device": name,
        "copy_tb_s": round(ceil.copy_bytes_per_s / 1e12, 2),
        "matmul_tflop_s": round(ceil.matmul_flops_per_s / 1e12, 0),
        "verify_257_ms": round(verify_ms, 3),
        "verify_257_floor_ms": round(verify_floor, 3),
        "verify_257_ratio": round(verify_ms / verify_floor, 2),
        "ddtree256_phases_ms": {k: round(v, 3) for k, v in phases.items()},
        "ddtree256_floor_ms": {k: round(1e3 * v, 3) for k, v in floor.items()},
        "outside_model_passes_share": round(outside / sum(phases.values()), 3),
        "weights_gib": round(weights / 2**30, 2),
        "kv_gib": round(kv / 2**30, 2),
        "warmup_s": round(warm_s, 1),
        "graphs": len(engine.graphs.graphs),
    }
    print(json.dumps(summary), flush=True)

    print(
        f"\n{'context':>7} {'mode':7} {'B':>4} {'round ms':>9} {'floor ms':>9} {'ratio':>6} {'x ar':>6} {'tau':>5} {'peak GiB':>8}"
    )
    for r in rows:
        print(
            f"{r['context']:>7} {r['mode']:7} {r['budget'] or '':>4} {r['round_ms']:>9.3f} {r['floor_ms']:>9.3f} "
            f"{r['ratio']:>6.2f} {r['x_ar_step'] or 0:>6.2f} {r['tau']:>5.2f} {r['peak_gib']:>8.2f}"
        )
    print(
        f"verify 257 @ {context}: {verify_ms:.3f} ms, floor {verify_floor:.3f} ms, ratio {verify_ms / verify_floor:.2f}"
    )
    print(
        f"ddtree B=256 phases (ms): {summary['ddtree256_phases_ms']}; floor {summary['ddtree256_floor_ms']}; "
        f"outside the model passes {100 * summary['outside_model_passes_share']:.1f}%"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    if args.results:
        day = datetime.date.today().isoformat()
        lines = [
            f"\n### Roofline, {day}, {name}, bf16, Qwen3-8B shapes (random weights)\n",
            f"`python benchmarks/roofline.py --contexts {args.contexts} --budgets {args.budgets}`; "
            f"ceilings copy {summary['copy_tb_s']} TB/s, matmul {summary['matmul_tflop_s']:.0f} TFLOP/s.\n",
            "| context | mode | B | round ms | floor ms | ratio | × ar step | peak GiB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['context']} | {r['mode']} | {r['budget'] or ''} | {r['round_ms']} | {r['floor_ms']} | "
            f"{r['ratio']} | {r['x_ar_step']} | {r['peak_gib']} |"
            for r in rows
        ]
        lines.append(
            f"\nVerify pass, 257 nodes at {context}: {summary['verify_257_ms']} ms against a floor of "
            f"{summary['verify_257_floor_ms']} ms ({summary['verify_257_ratio']}×). ddtree B=256 phases (ms): "
            f"{summary['ddtree256_phases_ms']}, floors {summary['ddtree256_floor_ms']}.\n"
        )
        with open(args.results, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
