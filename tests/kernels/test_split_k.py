"""Split-K (ddtree_kernels/split_k.py): the last split of each output tile sums the partials and
re-arms its arrival count, so a split launch gives the same bits launch after launch (as graph
replays do) and leaves every count at zero."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.fp8_gemm import GemmConfig, fp8_gemm
from ddtree_kernels.fp8_skinny import fp8_skinny
from ddtree_kernels.skinny_matmul import SkinnyConfig, skinny_matmul
from ddtree_kernels.split_k import MAX_TILES, arrival_counts
from ddtree_runtime.fp8 import fp8_linear_reference, quantize_weight
from tests.kernels.trees import DEVICE


def _launches(kind: str):
    """A split launch of one of the three split-K kernels, and its reference output."""
    gen = torch.Generator().manual_seed(7)
    t, n, k = (5, 200, 640) if kind != "gemm" else (40, 136, 640)
    x = torch.randn(t, k, generator=gen).to(DEVICE)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE)
    if kind == "bf16":
        cfg = SkinnyConfig(block_n=32, block_k=128, num_warps=4, num_stages=2, split_k=3)
        return (lambda: skinny_matmul(x, w, cfg)), x @ w.T
    w8, scale = quantize_weight(w, (128, 128))
    want = fp8_linear_reference(x, w8, scale, (128, 128))
    if kind == "fp8_skinny":
        cfg = SkinnyConfig(block_n=32, block_k=128, num_warps=4, num_stages=2, split_k=4)
        return (lambda: fp8_skinny(x, w8, scale, (128, 128), cfg)), want
    cfg = GemmConfig(32, 64, 128, 4, 2, split_k=3)
    return (lambda: fp8_gemm(x, w8, scale, (128, 128), cfg)), want


@pytest.mark.parametrize("kind", ["bf16", "fp8_skinny", "gemm"])
def test_split_launches_repeat_bit_for_bit_and_rearm_their_counts(kind: str) -> None:
    launch, want = _launches(kind)
    first, second = launch(), launch()
    assert torch.equal(first, second)
    assert float((first.double() - want.double()).norm() / want.double().norm()) < 1e-5
    assert not arrival_counts(first.device).any()


def test_a_split_launch_past_the_counts_is_refused() -> None:
    x = torch.randn(1, 32, device=DEVICE)
    w = torch.randn(16 * (MAX_TILES + 1), 32, device=DEVICE)
    cfg = SkinnyConfig(block_n=16, block_k=16, num_warps=4, num_stages=2, split_k=2)
    with pytest.raises(RuntimeError, match="arrival counts"):
        skinny_matmul(x, w, cfg)
