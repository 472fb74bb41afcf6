"""The skinny matmul (T <= 16 rows) against cuBLAS on Qwen3-8B's projection shapes, with a sweep of
launch configurations (the five best printed), each timed as a CUDA graph (as the runtime replays it); prints the fraction of
the copy ceiling measured in the same run.

    python benchmarks/skinny_matmul_bench.py [--sweep] [--shape qwen3-8b|qwen3.6-27b] [--rows 1,16]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from ddtree_kernels.host import num_sms
from ddtree_kernels.skinny_matmul import SkinnyConfig, default_config, skinny_matmul
from ddtree_runtime.roofline import measure_ceilings

SHAPES = {  # name: (N, K)
    "qkv": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up": (24576, 4096),
    "down": (4096, 12288),
    "drafter_fc": (4096, 20480),
}
SHAPES_27B = {  # Qwen3.6-27B's projections and its 27B-shaped drafter's (`--shape qwen3.6-27b`)
    "gdn_in": (16480, 5120),
    "gdn_out": (5120, 6144),
    "attn_qkv": (14336, 5120),
    "gate_up": (34816, 5120),
    "down": (5120, 17408),
    "drafter_fc": (5120, 25600),
    "drafter_o": (5120, 4096),
}


def graphed_ms(matmul, x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    """Median time of one call, from a CUDA graph of one call per weight (4 of them, together past
    the L2, so no call reads from cache): as the runtime launches it, with no host launch cost. An
    eager `do_bench` of a ~20 us Triton launch would time the host, not the kernel."""
    for w in weights:
        matmul(x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            matmul(x, w)
    return do_bench(graph.replay, warmup=25, rep=100, return_mode="median") / len(weights)


def measure(name: str, n: int, k: int, t: int, grid: list[SkinnyConfig], bw: float, sms: int) -> dict:
    dev = torch.device("cuda")
    weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(4)]
    x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
    ref = F.linear(x, weights[0])
    err = float((skinny_matmul(x, weights[0]).float() - ref.float()).norm() / ref.float().norm())
    cublas = graphed_ms(F.linear, x, weights)
    ours = graphed_ms(skinny_matmul, x, weights)
    timed = [(ours, default_config(n, k, sms))]
    for cfg in grid:
        timed.append((graphed_ms(lambda x, w, cfg=cfg: skinny_matmul(x, w, cfg), x, weights), cfg))
    timed.sort(key=lambda b: b[0])
    best = timed[0]

    def of_copy(ms: float) -> float:
        return round(n * k * 2 / (ms * 1e-3) / bw, 2)

    return {
        "shape": name,
        "T": t,
        "rel_err": round(err, 5),
        "cublas_us": round(cublas * 1e3, 1),
        "cublas_of_copy": of_copy(cublas),
        "skinny_us": round(ours * 1e3, 1),
        "skinny_of_copy": of_copy(ours),
        "best_us": round(best[0] * 1e3, 1),
        "best_of_copy": of_copy(best[0]),
        "best_config": best[1].__dict__,
        "default_config": default_config(n, k, sms).__dict__,
        "top5": [[c.block_n, c.block_k, c.num_warps, c.split_k, round(ms * 1e3, 1)] for ms, c in timed[:5]],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true", help="also time a grid of configurations")
    p.add_argument("--shape", choices=("qwen3-8b", "qwen3.6-27b"), default="qwen3-8b")
    p.add_argument("--rows", default="1,16")
    args = p.parse_args()
    dev = torch.device("cuda")
    ceil = measure_ceilings(dev)
    bw = ceil.copy_bytes_per_s
    sms = num_sms(dev)
    grid = [
        SkinnyConfig(bn, bk, w, 4, sk)
        for (bn, bk), w, sk in itertools.product(
            ((16, 256), (16, 512), (32, 128), (32, 256), (32, 512), (64, 128), (64, 256), (128, 128)),
            (4, 8),
            (1, 2, 4, 8),
        )
    ]
    shapes = SHAPES if args.shape == "qwen3-8b" else SHAPES_27B
    rows = [int(t) for t in args.rows.split(",")]
    for (name, (n, k)), t in itertools.product(shapes.items(), rows):
        print(json.dumps(measure(name, n, k, t, grid if args.sweep else [], bw, sms)), flush=True)
    print(f"copy ceiling {bw / 1e12:.2f} TB/s")


if __name__ == "__main__":
    main()
