"""One Gated DeltaNet layer's kernels beside `flash-linear-attention`'s, each timed as a CUDA graph.

Qwen3.6-27B's DeltaNet layer by default: 16 key heads, 48 value heads, Dk = Dv = 128, bf16 inputs,
fp32 state. Rows (median µs of graph replays, `triton.testing.do_bench`):

- `tree N`: our tree kernel over a DDTree-shaped tree of N nodes (a 16-deep trunk, the rest hung off
  the early nodes), the shipped launch config, and one row per launch config (node block, value
  block, warps) when `--sweep`;
- `fla chunk T`: fla's chunked chain over T tokens (the issue's yardstick: tree <= 1.5x chunk at 257);
- `step` / `fla recurrent`: one token (the `ar` step), ours fused with the output norm;
- `plan N`: the per-round tree plan; `commit x48`: every layer's state advance after a verify;
- `trees PxN` / `forest PxN`: the verify trees of a batched round (P = 16 sequences, ddtree at
  budgets 16 and 64), one tree launch pair each against one forest launch pair for all.

    python benchmarks/gdn_bench.py [--sweep] [--json OUT]
    TRITON_INTERPRET=1 python benchmarks/gdn_bench.py --small   # CPU smoke run (eager, no fla)
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ddtree_kernels.gdn_commit import gdn_commit
from ddtree_kernels.gdn_step import gdn_step
from ddtree_kernels.gdn_tree import BLOCK_V, NUM_WARPS, ForestPlan, gdn_forest, gdn_tree, tree_plan


def ddtree_parents(n: int, depth: int, gen: torch.Generator) -> list[int]:
    """A best-first-like tree: a main chain `depth` deep, the other nodes hung off early nodes."""
    parents = [-1, *range(min(n, depth + 1) - 1)]
    while len(parents) < n:
        parents.append(int(torch.randint(0, len(parents), (1,), generator=gen)) // 3)
    return parents


def depths(parents: list[int]) -> list[int]:
    out = [0] * len(parents)
    for i in range(1, len(parents)):
        out[i] = out[parents[i]] + 1
    return out


def timed_us(fn: Callable[[], object], device: torch.device) -> float:
    """Median µs of `fn` replayed as a CUDA graph (eager when capture fails, and on the CPU)."""
    if device.type != "cuda":
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    from triton.testing import do_bench

    fn()  # compile, autotune, allocate
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run: Callable[[], object] = graph.replay
    except RuntimeError:
        run = fn
    return 1e3 * do_bench(run, warmup=25, rep=200, return_mode="median")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hk", type=int, default=16)
    p.add_argument("--hv", type=int, default=48)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--sweep", action="store_true", help="every tree launch config")
    p.add_argument("--small", action="store_true", help="tiny sizes for a CPU smoke run")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hk, hv, d, layers = (1, 2, 16, 2) if args.small else (args.hk, args.hv, args.dim, args.layers)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    rows: list[dict[str, object]] = []

    def row(name: str, us: float, **extra: object) -> None:
        rows.append({"row": name, "us": round(us, 1), **extra})
        print(json.dumps(rows[-1]), flush=True)

    state = rand(hv, d, d, scale=0.1)

    def inputs(t: int) -> tuple[torch.Tensor, ...]:
        """q, k [t, Hk, D] (unit rows, q scaled), v [t, Hv, D] in the model dtype; g, beta [t, Hv] fp32."""
        q = (F.normalize(rand(t, hk, d), dim=-1) * d**-0.5).to(dtype)
        k = F.normalize(rand(t, hk, d), dim=-1).to(dtype)
        g, beta = -torch.rand(t, hv, generator=gen).to(device), torch.rand(t, hv, generator=gen).to(device)
        return q, k, rand(t, hv, d).to(dtype), g, beta

    def fla_us(kernel: Callable[..., object], x: tuple[torch.Tensor, ...]) -> float:
        """One of fla's gated delta rule kernels over `x` (fla's [B, T, H, D] layout) from `state`."""
        batched = [t[None] for t in x]
        return timed_us(
            lambda: kernel(*batched, scale=1.0, initial_state=state[None], output_final_state=True), device
        )

    for n in (17, 65, 257) if not args.small else (9, 40, 65):
        parents = ddtree_parents(n, 15, gen)
        par = torch.tensor(parents, device=device)
        dep = torch.tensor(depths(parents), device=device)
        x = q, k, v, g, beta = inputs(n)
        row(f"plan {n}", timed_us(lambda par=par, dep=dep: tree_plan(par, dep, 4), device))
        configs = [(None, BLOCK_V, NUM_WARPS)]  # the shipped launch
        if args.sweep:
            configs += [(bt, bv, w) for bt in (32, 64) for bv in (32, 64, 128) for w in (4, 8)]
        for block_t, block_v, warps in configs:
            plan = tree_plan(par, dep, 4, block_t)
            try:
                us = timed_us(
                    lambda q=q, k=k, v=v, g=g, beta=beta, plan=plan, bv=block_v, w=warps: gdn_tree(
                        q, k, v, g, beta, state, plan, block_v=bv, num_warps=w
                    ),
                    device,
                )
            except Exception as exc:  # a config that does not compile (registers, shared memory)
                print(
                    json.dumps(
                        {
                            "row": f"tree {n}",
                            "config": [plan.block, block_v, warps],
                            "tail": plan.tail,
                            "error": str(exc)[:200],
                        }
                    )
                )
                continue
            row(f"tree {n}", us, config=[plan.block, block_v, warps], tail=plan.tail)
        chain = tree_plan(torch.arange(-1, n - 1, device=device), torch.arange(n, device=device), 4)
        row(
            f"tree-kernel chain {n}",
            timed_us(
                lambda q=q, k=k, v=v, g=g, beta=beta, c=chain: gdn_tree(q, k, v, g, beta, state, c), device
            ),
        )
        if device.type == "cuda":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule

            row(f"fla chunk {n}", fla_us(chunk_gated_delta_rule, x))
    # a batched round's trees: P trees of one size, each from its own slot's state
    forest_trees = 16 if not args.small else 3
    slot_states, slots = rand(forest_trees, hv, d, d, scale=0.1), torch.arange(forest_trees, device=device)
    for n in (17, 65) if not args.small else (9, 65):
        plans = []
        for _ in range(forest_trees):
            parents = ddtree_parents(n, 15, gen)
            plans.append(
                tree_plan(
                    torch.tensor(parents, device=device), torch.tensor(depths(parents), device=device), 4
                )
            )
        trees = [inputs(n) for _ in range(forest_trees)]
        row(
            f"trees {forest_trees}x{n}",
            timed_us(
                lambda trees=trees, plans=plans: [
                    gdn_tree(*x, slot_states[i], plans[i]) for i, x in enumerate(trees)
                ],
                device,
            ),
        )
        stacked = [torch.stack(t) for t in zip(*trees, strict=True)]
        forest = ForestPlan.of(plans)
        d_out = torch.empty(forest_trees, hv, n, d, device=device)
        g_out = torch.empty(forest_trees, hv, n, device=device)
        row(
            f"forest {forest_trees}x{n}",
            timed_us(
                lambda x=stacked, f=forest, d_out=d_out, g_out=g_out: gdn_forest(
                    *x, slot_states, slots, f, d_out, g_out
                ),
                device,
            ),
        )
    if device.type == "cuda":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

        for t in (2048, 4096):
            row(f"fla chunk {t}", fla_us(chunk_gated_delta_rule, inputs(t)))
    # one token: our fused step (recurrence + output norm) against fla's fused recurrent kernel
    x = q, k, v, g, beta = inputs(1)
    proj = rand(1, hv * d, scale=1.0).to(dtype)
    norm_w = torch.ones(d, device=device, dtype=dtype)
    step_state = state.clone()
    row("step", timed_us(lambda: gdn_step(q, k, v, g, beta, step_state, proj, 0, norm_w, 1e-6), device))
    if device.type == "cuda":
        row("fla recurrent", fla_us(fused_recurrent_gated_delta_rule, x))
    # the commit after a 257-node verify (a 16-node accepted path), every layer in one launch pair
    n = 257 if not args.small else 40
    parents = ddtree_parents(n, 15, gen)
    plan = tree_plan(torch.tensor(parents, device=device), torch.tensor(depths(parents), device=device), 4)
    channels = 2 * hk * d + hv * d
    states = rand(layers, hv, d, d, scale=0.1)
    convs = rand(layers, 3, channels).to(dtype)
    k_st = rand(layers, n, hk, d).to(dtype)
    d_st, g_st = rand(layers, hv, n, d), -torch.rand(layers, hv, n, generator=gen).to(device)
    x_st = rand(layers, n, channels).to(dtype)
    path = torch.full((n,), -1, device=device)
    path[:16] = torch.arange(16, device=device)
    path_len = torch.tensor(16, device=device)
    row(
        f"commit x{layers}",
        timed_us(
            lambda: gdn_commit(states, convs, k_st, d_st, g_st, x_st, plan.windows, path, path_len), device
        ),
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
