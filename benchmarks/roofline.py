"""Whole-round speed against the hardware floor, on the GPU machine itself.

Builds a target and its DFlash drafter with random weights drawn on the GPU (no downloads), in one
of two shapes, measures the ceilings in the same run, and times:

- `qwen3-8b`: Qwen3-8B (36 layers, hidden 4096, 32/8 heads, head_dim 128, intermediate 12288, vocab
  151936) with its drafter (5 layers, block 16, target_layer_ids [1, 9, 17, 25, 33]);
- `qwen3.6-27b`: the hybrid Qwen3.6-27B (64 layers: 48 Gated DeltaNet with 16/48 heads of 128 and
  16 gated full-attention with 24/4 heads of 256, hidden 5120, intermediate 17408, vocab 248320)
  with a 27B-shaped drafter (5 layers [S, S, S, S, F], window 2048, 32/8 heads, block 16).

Rows: the `ar` step, the `dflash` round and `ddtree` rounds at each budget, at each context (wall
time per round of `Engine.generate`: the replayed graph plus the one host sync; beside it the same
graph replayed back to back, the round's GPU time alone), as a ratio to its
floor (`ddtree_runtime/roofline.py`) and to the `ar` step; peak memory per context; at 4096 (or the
first context) the prefill against its compute floor, the verify pass of 257 nodes alone (one
graph) and the per-phase split of the largest budget's round. `--projection` runs the `ar` step and
the ddtree rounds again on the RTX PRO 6000's (sm_120) attention tiles and scales each by the two
GPUs' floors (same efficiency against the floor), with tokens/s at tau 3, 5 and 7.

    python benchmarks/roofline.py --shape qwen3.6-27b [--contexts 1024,4096,16384,32768]
        [--budgets 16,64,256] [--projection] [--json OUT.json] [--results benchmarks/RESULTS.md]
    python benchmarks/roofline.py --shape qwen3.6-27b --small --device cpu   # a smoke run of the script
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddtree_runtime.config import DFlashConfig, Qwen3_5Config, Qwen3Config
from ddtree_runtime.engine import Engine
from ddtree_runtime.graphs import RoundGraphs, key_bound
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.qwen3 import Qwen3
from ddtree_runtime.models.qwen3_5 import Qwen3_5
from ddtree_runtime.models.target import Target
from ddtree_runtime.roofline import (
    Ceilings,
    head_elem,
    measure_ceilings,
    pass_cost,
    phase_times_s,
    round_floor_s,
)
from specops_contract import verify_rows

REPLAYS = 10  # replays of each round's graph timed back to back after its `generate`

QWEN3_8B = {
    "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
}  # fmt: skip
QWEN3_8B_DRAFTER = {
    **QWEN3_8B, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5, "block_size": 16,
    "num_target_layers": 36, "layer_types": ["full_attention"] * 5,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
}  # fmt: skip
QWEN36_27B = {
    "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 64, "full_attention_interval": 4, "num_attention_heads": 24,
    "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
}  # fmt: skip
QWEN36_27B_DRAFTER = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 248320, "hidden_size": 5120,
    "intermediate_size": 17408, "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000000.0, "max_position_embeddings": 262144,
    "block_size": 16, "num_target_layers": 64, "use_sliding_window": True, "sliding_window": 2048,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
}  # fmt: skip
SMALL = {  # the same layouts at toy widths, for `--small` (a smoke run of this script)
    "qwen3-8b": ({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512},
                 {"target_layer_ids": [0, 2], "num_target_layers": 4}),
    "qwen3.6-27b": ({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 1, "linear_num_value_heads": 2,
                     "linear_key_head_dim": 16, "linear_value_head_dim": 16, "vocab_size": 512},
                    {"target_layer_ids": [0, 2], "num_target_layers": 4, "sliding_window": 32}),
}  # fmt: skip
SHAPES = {
    "qwen3-8b": (Qwen3, Qwen3Config, QWEN3_8B, QWEN3_8B_DRAFTER),
    "qwen3.6-27b": (Qwen3_5, Qwen3_5Config, QWEN36_27B, QWEN36_27B_DRAFTER),
}
# The RTX PRO 6000 Blackwell (sm_120), from its datasheet (unmeasured here): memory bandwidth and bf16
# dense tensor throughput, for the projection
RTX_PRO_6000 = Ceilings(copy_bytes_per_s=1.79e12, matmul_flops_per_s=500e12)
STORY_SGLANG_MTP = 73.5  # tok/s, Qwen3.6-27B on one RTX PRO 6000 (the story)


def random_pair(
    shape: str, device: torch.device, dtype: torch.dtype, small: bool
) -> tuple[Target, DFlashDrafter]:
    """Target and drafter of `shape` with random weights drawn on the device (norms near their
    identity, matrices ~1/sqrt(fan-in), slow DeltaNet decays), fused as the loader fuses."""
    target_cls, target_cfg, target_raw, drafter_raw = SHAPES[shape]
    if small:
        t_small, d_small = SMALL[shape]
        target_raw = {**target_raw, **t_small}
        drafter_raw = {**drafter_raw, **t_small, "num_hidden_layers": 2, **d_small}
        drafter_raw["layer_types"] = drafter_raw["layer_types"][-2:]
        ids = {"target_layer_ids": d_small["target_layer_ids"], "mask_token_id": t_small["vocab_size"] - 1}
        drafter_raw["dflash_config"] = {**drafter_raw["dflash_config"], **ids}
    tcfg = target_cfg.from_dict(target_raw, Path(f"<{shape} shapes>"))
    dcfg = DFlashConfig.from_dict(drafter_raw, Path(f"<{shape} drafter shapes>"))
    models = []
    for cls, cfg in ((target_cls, tcfg), (DFlashDrafter, dcfg)):
        with torch.device("meta"):
            model = cls(cfg).to(dtype)
        model = model.to_empty(device=device)  # straight into the dtype: no fp32 copy of 27B weights
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("A_log"):
                    p.uniform_(-3.0, -1.0)
                elif name.endswith("dt_bias"):
                    p.uniform_(-1.0, 0.0)
                elif p.ndim == 1:
                    p.normal_(0.0 if target_cls is Qwen3_5 and cls is target_cls else 1.0, 0.05)
                else:
                    p.normal_(0.0, 1.0 if "embed" in name else p[0].numel() ** -0.5)
        model.fuse()
        models.append(model.eval())
    return models[0], models[1]


class Clock:
    """Seconds of device work: CUDA events on a GPU, the host clock on the CPU (a smoke run)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def median_ms(self, fn, reps: int = 20) -> float:
        if self.cuda:
            from triton.testing import do_bench

            return do_bench(fn, warmup=10, rep=max(50, 5 * reps), return_mode="median")
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
        return sorted(times)[1]


def round_key(engine: Engine, mode: str, budget: int, reps: int) -> tuple[str, int, int]:
    """The graph key of the engine's next `reps` rounds from where its last `generate` stopped (each
    round may add up to a block and its bonus to the context)."""
    rows = verify_rows(mode, engine.buffers.feats.shape[0], budget)
    needed = int(engine.buffers.ctx) + rows + reps * (engine.buffers.feats.shape[0] + 1)
    key = (mode, budget, key_bound(needed, engine.max_context, bucketed=True))
    assert engine.graphs is not None and key in engine.graphs, f"no graph {key}"
    return key


def replay_ms(engine: Engine, key: tuple[str, int, int], reps: int) -> float:
    """ms per replay of the round graph `key`, `reps` back to back: the round's GPU time with no host
    turnaround between rounds, which `generate`'s wall time per round adds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        engine.graphs.replay(key)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


@torch.inference_mode()
def verify_pass_ms(engine: Engine, clock: Clock, context: int, nodes: int) -> float:
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
    restore = target.snapshot()

    def run() -> None:
        tree = target.plan(parents, depth, backend, chain=False)
        target(tokens, ctx + depth, ctx, tree, backend, key_bound=bound, logits_dtype=None)

    run()
    if not clock.cuda:
        return clock.median_ms(run)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    ms = clock.median_ms(graph.replay)
    restore()
    return ms


def peak_gib(device: torch.device) -> float:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else 0.0


def measure_context(
    engine: Engine, ceil: Ceilings, context: int, budgets: list[int], new_tokens: int
) -> list[dict]:
    """Every mode at one context: wall and GPU time per round, floors, ratios, peak memory."""
    tcfg, dcfg = engine.target.config, engine.drafter.config
    prompt = torch.randint(
        0, tcfg.vocab_size, (context,), generator=torch.Generator().manual_seed(context)
    ).tolist()
    rows, ar_ms = [], None
    for mode, budget in [("ar", 0), ("dflash", 0), *(("ddtree", b) for b in budgets)]:
        engine.generate(prompt[:64], mode=mode, budget=max(budget, 1), max_new_tokens=4, eos_ids=())
        if engine.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        res = engine.generate(prompt, mode=mode, budget=max(budget, 1), max_new_tokens=new_tokens, eos_ids=())
        round_s = sum(v for k, v in res.phase_s.items() if k != "prefill")  # graphed: "round"; eager: phases
        wall_ms = 1e3 * round_s / max(1, res.rounds)
        floor = round_floor_s(ceil, tcfg, dcfg, mode, budget, context, head_elem(engine))
        floor_ms = 1e3 * (floor["target"] + floor["drafter"])
        ar_ms = wall_ms if mode == "ar" else ar_ms
        replay = None
        if engine.graphs is not None:
            replay = replay_ms(engine, round_key(engine, mode, budget, REPLAYS), REPLAYS)
        row = {
            "context": context,
            "mode": mode,
            "budget": budget or None,
            "rounds": res.rounds,
            "tau": round(res.mean_accepted, 2),
            "round_ms": round(wall_ms, 3),
            "replay_ms": None if replay is None else round(replay, 3),
            "floor_ms": round(floor_ms, 3),
            "ratio": round(wall_ms / floor_ms, 2),
            "x_ar_step": round(wall_ms / ar_ms, 2),
            "peak_gib": peak_gib(engine.device),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def projection(
    engine: Engine, ceil: Ceilings, context: int, budgets: list[int], new_tokens: int, h200_rows: list[dict]
) -> list[dict]:
    """The `ar` step and ddtree rounds on the sm_120 attention tiles, scaled to the RTX PRO 6000 by
    floor (the round keeps its measured efficiency against the floor), with tokens/s at tau 3, 5, 7."""
    os.environ["SPECOPS_ARCH_ROW"] = "sm_120"
    engine.graphs = RoundGraphs(engine.device)  # re-captured on the sm_120 tiles
    rows = []
    for r in measure_context(engine, ceil, context, budgets, new_tokens):
        if r["mode"] == "dflash":
            continue
        rtx_floor = round_floor_s(
            RTX_PRO_6000,
            engine.target.config,
            engine.drafter.config,
            r["mode"],
            r["budget"] or 0,
            context,
            head_elem(engine),
        )
        rtx_ms = r["round_ms"] / r["floor_ms"] * 1e3 * (rtx_floor["target"] + rtx_floor["drafter"])
        h200 = next(
            x
            for x in h200_rows
            if x["context"] == context and x["mode"] == r["mode"] and x["budget"] == r["budget"]
        )
        taus = (1,) if r["mode"] == "ar" else (3, 5, 7)
        rows.append(
            {
                "mode": r["mode"],
                "budget": r["budget"],
                "h200_round_ms": h200["round_ms"],
                "sm120_tiles_on_h200_ms": r["round_ms"],
                "rtx_pro_6000_ms": round(rtx_ms, 2),
                **{f"h200_tok_s_tau{t}": round(1e3 * t / h200["round_ms"], 1) for t in taus},
                **{f"rtx_tok_s_tau{t}": round(1e3 * t / rtx_ms, 1) for t in taus},
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    del os.environ["SPECOPS_ARCH_ROW"]
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3.6-27b")
    p.add_argument("--contexts", default="1024,4096,16384,32768")
    p.add_argument("--budgets", default="16,64,256")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per timed run")
    p.add_argument("--projection", action="store_true", help="RTX PRO 6000 projection (sm_120 tiles)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="toy widths: a smoke run of the script")
    p.add_argument("--json", help="write every row here")
    p.add_argument("--results", help="append a dated table to this RESULTS.md")
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    contexts = [int(c) for c in args.contexts.split(",")]
    budgets = [int(b) for b in args.budgets.split(",")]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (smoke run)"
    clock = Clock(device)
    # on the CPU (a smoke run) the ceilings are placeholders: only the script's paths are checked
    ceil = measure_ceilings(device) if device.type == "cuda" else Ceilings(5e10, 5e11)
    print(
        f"{name}: copy {ceil.copy_bytes_per_s / 1e12:.2f} TB/s, matmul {ceil.matmul_flops_per_s / 1e12:.0f} TFLOP/s"
    )

    target, drafter = random_pair(args.shape, device, dtype, args.small)
    weights = sum(t.numel() * t.element_size() for m in (target, drafter) for t in m.parameters())
    max_context = max(contexts) + 1024
    engine = Engine(target, drafter, max_context)
    kv = 2 * sum(c.numel() * c.element_size() for c in (target.k_cache, drafter.k_cache))
    t0 = time.perf_counter()
    engine.warmup(["ar", "dflash", "ddtree"], budgets, max_prompt=64)
    warm_s = time.perf_counter() - t0
    graphs = len(engine.graphs.graphs) if engine.graphs is not None else 0
    print(
        f"weights {weights / 2**30:.2f} GiB, KV at {max_context} {kv / 2**30:.2f} GiB, warm-up {warm_s:.1f} s ({graphs} graphs)"
    )

    rows = []
    for context in contexts:
        rows += measure_context(engine, ceil, context, budgets, args.new_tokens)

    # at 4096 (or the first context): the prefill, the verify pass alone and the largest round's phases
    context = 4096 if 4096 in contexts else contexts[0]
    tcfg, dcfg = target.config, drafter.config
    prompt = list(range(100, 100 + context))
    prefill_s = engine.generate(prompt, mode="ar", max_new_tokens=1, eos_ids=()).phase_s["prefill"]
    prefill_floor = ceil.floor_s(*pass_cost(tcfg, context, 0, 1))
    verify_ms = verify_pass_ms(engine, clock, context, 257)
    verify_floor = 1e3 * ceil.floor_s(*pass_cost(tcfg, 257, context, 257))
    summary = {
        "shape": args.shape,
        "device": name,
        "copy_tb_s": round(ceil.copy_bytes_per_s / 1e12, 2),
        "matmul_tflop_s": round(ceil.matmul_flops_per_s / 1e12, 0),
        "weights_gib": round(weights / 2**30, 2),
        "kv_gib": round(kv / 2**30, 2),
        "warmup_s": round(warm_s, 1),
        "graphs": graphs,
        f"prefill_{context}_ms": round(1e3 * prefill_s, 1),
        f"prefill_{context}_floor_ms": round(1e3 * prefill_floor, 1),
        "prefill_ratio": round(prefill_s / prefill_floor, 2),
        "verify_257_ms": round(verify_ms, 3),
        "verify_257_floor_ms": round(verify_floor, 3),
        "verify_257_ratio": round(verify_ms / verify_floor, 2),
    }
    if device.type == "cuda":
        engine.generate(prompt, mode="ddtree", budget=max(budgets), max_new_tokens=2, eos_ids=())
        for budget in sorted({64, max(budgets)} & set(budgets)):
            phases = phase_times_s(engine, "ddtree", budget)
            floor = round_floor_s(ceil, tcfg, dcfg, "ddtree", budget, context, head_elem(engine))
            summary[f"ddtree{budget}_phases_ms"] = {k: round(1e3 * v, 3) for k, v in phases.items()}
            summary[f"ddtree{budget}_floor_ms"] = {k: round(1e3 * v, 3) for k, v in floor.items()}
    print(json.dumps(summary), flush=True)
    projected = projection(engine, ceil, context, budgets, args.new_tokens, rows) if args.projection else []

    print(
        f"\n{'context':>7} {'mode':7} {'B':>4} {'round ms':>9} {'replay ms':>9} {'floor ms':>9} {'ratio':>6} "
        f"{'x ar':>6} {'peak GiB':>8}"
    )
    for r in rows:
        replay = "-" if r["replay_ms"] is None else f"{r['replay_ms']:.3f}"
        print(
            f"{r['context']:>7} {r['mode']:7} {r['budget'] or '':>4} {r['round_ms']:>9.3f} {replay:>9} "
            f"{r['floor_ms']:>9.3f} {r['ratio']:>6.2f} {r['x_ar_step']:>6.2f} {r['peak_gib']:>8.2f}"
        )
    print(
        f"prefill {context}: {1e3 * prefill_s:.1f} ms (floor {1e3 * prefill_floor:.1f}, {summary['prefill_ratio']}x); "
        f"verify 257: {verify_ms:.3f} ms (floor {verify_floor:.3f}, {summary['verify_257_ratio']}x)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"summary": summary, "rows": rows, "projection": projected}, indent=1)
        )
    if args.results:
        append_results(Path(args.results), args, summary, rows, projected)


def append_results(
    path: Path, args: argparse.Namespace, summary: dict, rows: list[dict], projected: list[dict]
) -> None:
    """A dated table of this run's rows for RESULTS.md."""
    lines = [
        f"\n### Roofline, {datetime.date.today().isoformat()}, {summary['device']}, bf16, {args.shape} shapes (random weights)\n",
        f"`python benchmarks/roofline.py --shape {args.shape} --contexts {args.contexts} --budgets {args.budgets}"
        f"{' --projection' if args.projection else ''}`; ceilings copy {summary['copy_tb_s']} TB/s, matmul "
        f"{summary['matmul_tflop_s']:.0f} TFLOP/s; weights {summary['weights_gib']} GiB; warm-up {summary['warmup_s']} s.\n",
        "| context | mode | B | round ms | replay ms | floor ms | ratio | × ar step | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['context']} | {r['mode']} | {r['budget'] or ''} | {r['round_ms']} | {r['replay_ms'] or '-'} | "
        f"{r['floor_ms']} | {r['ratio']} | {r['x_ar_step']} | {r['peak_gib']} |"
        for r in rows
    ]
    lines.append(f"\nSummary: `{json.dumps(summary)}`\n")
    if projected:
        lines.append(
            "Projection (sm_120 tiles on the H200, scaled by floor to the RTX PRO 6000): `"
            + json.dumps(projected)
            + "`\n"
        )
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
