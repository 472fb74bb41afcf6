"""The skinny matmul (T <= 16 rows) against cuBLAS on Qwen3-8B's projection shapes, with a sweep of
launch configurations; prints GB/s against the copy ceiling measured in the same run.

    python benchmarks/skinny_matmul_bench.py [--sweep]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from ddtree_runtime.roofline import measure_ceilings
from kernels.host import num_sms
from kernels.skinny_matmul import SkinnyConfig, default_config, skinny_matmul

SHAPES = {  # name: (N, K)
    "qkv": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up": (24576, 4096),
    "down": (4096, 12288),
    "drafter_fc": (4096, 20480),
}


def rotating(weights: list[torch.Tensor]):
    """A fresh weight each call (4 of them, together past the L2), so no run reads from cache."""
    state = {"i": 0}

    def next_weight() -> torch.Tensor:
        state["i"] = (state["i"] + 1) % len(weights)
        return weights[state["i"]]

    return next_weight


def measure(name: str, n: int, k: int, t: int, grid: list[SkinnyConfig], bw: float, sms: int) -> dict:
    dev = torch.device("cuda")
    weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(4)]
    x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
    nxt = rotating(weights)
    ref = F.linear(x, weights[0])
    err = float((skinny_matmul(x, weights[0]).float() - ref.float()).norm() / ref.float().norm())
    cublas = do_bench(lambda: F.linear(x, nxt()), warmup=25, rep=100, return_mode="median")
    ours = do_bench(lambda: skinny_matmul(x, nxt()), warmup=25, rep=100, return_mode="median")
    best = (ours, default_config(n, k, sms))
    for cfg in grid:
        ms = do_bench(lambda cfg=cfg: skinny_matmul(x, nxt(), cfg), warmup=10, rep=50, return_mode="median")
        best = min(best, (ms, cfg), key=lambda b: b[0])

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
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true", help="also time a grid of configurations")
    args = p.parse_args()
    dev = torch.device("cuda")
    ceil = measure_ceilings(dev)
    bw = ceil.copy_bytes_per_s
    sms = num_sms(dev)
    grid = [
        SkinnyConfig(bn, bk, w, st, sk)
        for bn, bk, w, st, sk in itertools.product((16, 32, 64), (128, 256), (4,), (3, 5), (1, 2, 4))
    ]
    for (name, (n, k)), t in itertools.product(SHAPES.items(), (1, 16)):
        print(json.dumps(measure(name, n, k, t, grid if args.sweep else [], bw, sms)), flush=True)
    print(f"copy ceiling {bw / 1e12:.2f} TB/s")


if __name__ == "__main__":
    main()
