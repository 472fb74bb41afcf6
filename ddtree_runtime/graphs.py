"""CUDA graphs of whole rounds: captured once per (mode, budget, key bound) at warm-up, replayed.

At batch 1 a round is hundreds of small launches; launched one by one from Python they cost ~8x
the GPU work (benchmarks/RESULTS.md). A graph replays them with no host work. Lengths live on the
device (`RoundBuffers`), so one graph serves every context length under its key bound; the bounds
are buckets (powers of two from `MIN_BUCKET` up to the cache size), so a handful of graphs cover
the whole context range. Every graph shares one memory pool: they never run at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ddtree_runtime.rounds import Phase

MIN_BUCKET = 1024

GraphKey = tuple[str, int, int]  # (mode, budget, key bound)
# a graph's key: a `GraphKey` (`Engine`), or a batched round's `batching.StepKey`
AnyKey = tuple[str | int, ...]


def key_bound(needed: int, max_context: int, bucketed: bool) -> int:
    """The static key bound a round needing `needed` keys runs under: the next bucket on CUDA
    (graphs), the exact count elsewhere (no padding to pay for)."""
    if not bucketed:
        return needed
    bound = MIN_BUCKET
    while bound < needed:
        bound *= 2
    return min(bound, max_context)


def buckets(max_context: int) -> list[int]:
    """Every key bound `key_bound` can return on CUDA for a cache of `max_context` rows."""
    out, bound = [], MIN_BUCKET
    while bound < max_context:
        out.append(bound)
        bound *= 2
    return [*out, max_context]


class RoundGraphs:
    """Captured rounds, keyed by (mode, budget, key bound), or for a batched round by (mode,
    sequences, budget, key bound)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        # each graph with its phases: their closures own tensors made before the capture (mask
        # tokens, chain parents), which the graph reads by address and so must outlive it
        self.graphs: dict[AnyKey, tuple[torch.cuda.CUDAGraph, list[Phase]]] = {}

    def __contains__(self, key: AnyKey) -> bool:
        return key in self.graphs

    def capture(self, key: AnyKey, phases: list[Phase], reset: Callable[[], None]) -> None:
        """Run the round once on a side stream (compiles kernels, sets up cuBLAS), then capture
        it. `reset` puts the buffers back into a valid state before each run."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            reset()
            for _, run in phases:
                run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            for _, run in phases:
                run()
        self.graphs[key] = (graph, phases)

    def replay(self, key: AnyKey) -> None:
        self.graphs[key][0].replay()
