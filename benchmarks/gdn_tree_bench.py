"""Tree Gated DeltaNet (ddtree_kernels/gdn_tree.py) beside the chain over the same number of tokens.

One Qwen3.6-27B DeltaNet layer by default: 48 value heads (16 key heads, repeated), Dk = Dv = 128,
fp32 recurrence, a 257-node DDTree-shaped tree (B = 256) from a cached state. Prints one JSON row
per implementation with the median µs; the issue's goal is tree kernel <= 1.5 x the chain kernel
(the `flash-linear-attention` chunked chain when installed, else our PyTorch WY chain).

    python benchmarks/gdn_tree_bench.py [--nodes 257] [--heads 48] [--depth 16]
    TRITON_INTERPRET=1 python benchmarks/gdn_tree_bench.py --nodes 40 --heads 2 --dim 16  # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddtree_kernels.gdn_tree import gdn_tree
from ddtree_runtime.models.gdn import gdn_chain, gdn_tree_torch


def timed_us(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median wall µs per call (synchronized on CUDA), after two warm-up calls."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t) * 1e6)
    return statistics.median(samples)


def ddtree_parents(n: int, depth: int, gen: torch.Generator) -> torch.Tensor:
    """A best-first-like tree: a main chain `depth` deep, the other nodes hung off early nodes."""
    parents = [-1, *range(min(n, depth + 1) - 1)]
    while len(parents) < n:
        parents.append(int(torch.randint(0, len(parents), (1,), generator=gen)) // 2)
    return torch.tensor(parents)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=257)
    p.add_argument("--heads", type=int, default=48)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(0)
    h, n, d = args.heads, args.nodes, args.dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device)

    q = F.normalize(rand(h, n, d), dim=-1) * d**-0.5
    k = F.normalize(rand(h, n, d), dim=-1)
    v, state = rand(h, n, d), rand(h, d, d) * 0.1
    g = -torch.rand(h, n, generator=gen).to(device)
    beta = torch.rand(h, n, generator=gen).to(device)
    parents = ddtree_parents(n, args.depth, gen).to(device)
    chain = torch.arange(-1, n - 1, device=device)

    rows = {
        "tree_triton": lambda: gdn_tree(q, k, v, g, beta, parents, state),
        "chain_triton": lambda: gdn_tree(q, k, v, g, beta, chain, state),
        "tree_torch_wy": lambda: gdn_tree_torch(q, k, v, g, beta, parents, state),
        "chain_torch_chunked": lambda: gdn_chain(q, k, v, g, beta, state),
    }
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        def fla_chain() -> object:  # fla layout: [B, T, H, D], log-decays g, an initial state
            return chunk_gated_delta_rule(
                q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                g.t()[None], beta.t()[None], scale=1.0, initial_state=state[None], output_final_state=True,
            )  # fmt: skip

        rows["chain_fla"] = fla_chain
    except ImportError:
        pass
    for name, fn in rows.items():
        us = timed_us(fn, device, args.reps)
        print(json.dumps({"impl": name, "nodes": n, "heads": h, "dim": d, "depth": args.depth,
                          "device": str(device), "median_us": round(us, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
