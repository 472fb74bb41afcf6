"""Skinny matmul: ``x @ W.T`` for a few rows (decode, a chain's verify, a drafter block), at bandwidth.

With T <= 16 rows a projection is a matrix-vector product in disguise: it must stream the whole
weight ``W [N, K]`` once and does almost no arithmetic per byte. cuBLAS reaches 42-77% of the
H200's copy bandwidth on Qwen3-8B's projection shapes at T = 1 (benchmarks/RESULTS.md); at batch 1
those projections are ~95% of a decode step's bytes, so their efficiency is the step's. Here one
program owns ``BLOCK_N`` output columns and walks K in ``BLOCK_K`` steps, pipelined: each step
loads a ``[BLOCK_N, BLOCK_K]`` tile of W (contiguous along K) and the ``[16, BLOCK_K]`` tile of x
(rows past T masked to zero), and accumulates ``x_tile @ W_tile.T`` in fp32 on the tensor cores.
When N alone cannot fill the GPU, K is split across ``SPLIT_K`` programs (``ddtree_kernels/split_k.py``:
the last split of a tile sums their fp32 partials). No program rereads a byte of W. The reference is
``ddtree_runtime.backend.TorchBackend.linear`` (``F.linear``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels import pdl
from ddtree_kernels.host import MAX_ROWS, cdiv, num_sms
from ddtree_kernels.pdl import prefetch_then_wait, release_dependents
from ddtree_kernels.precision import dot, dot_precision
from ddtree_kernels.split_k import arrival_counts, checked_tiles, partials, split_span, store_tile

SKINNY_MAX_N = 65536  # wider (an LM head) streams at ~95% through cuBLAS already


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1


@triton.jit
def _skinny_kernel(
    X,
    W,
    OUT,
    PART,
    COUNTS,
    stride_xt,
    stride_wn,
    stride_ot,
    n_rows,
    n_cols,
    k_total,
    k_per_split,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, 16)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    k0 = split * k_per_split
    prefetch_then_wait(PDL, W, cols, n_cols, stride_wn, k0, k_total, BLOCK_K)  # ddtree_kernels/pdl.py
    for k in range(k0, k0 + k_per_split, BLOCK_K):
        kk = k + offs_k
        k_ok = kk < k_total
        x = tl.load(
            X + rows[:, None] * stride_xt + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        w = tl.load(
            W + cols[:, None] * stride_wn + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0
        )
        acc = dot(x, tl.trans(w), PRECISION, acc)
    release_dependents(PDL)
    mask = row_ok[:, None] & col_ok[None, :]
    store_tile(acc, OUT, PART, COUNTS, pid_n, rows, cols, mask, stride_ot, n_rows, n_cols, SPLIT)


def default_config(n: int, k: int, sms: int) -> SkinnyConfig:
    """About 1.5 programs per SM (by columns, then by splitting K while each split keeps >= 1024
    of K), 128-wide K steps, never 16-column tiles: a 16 x 128 tile keeps too few bytes in flight
    (H200, N = 4096-5120: 1.1-1.45x slower than 32 columns split in two)."""
    block_n = 64 if n >= 64 * 2 * sms else 32
    programs = cdiv(n, block_n)
    split_k = 1
    while programs * split_k < 1.5 * sms and k // (split_k * 2) >= 1024:
        split_k *= 2
    return SkinnyConfig(block_n=block_n, block_k=128, num_warps=4, num_stages=4, split_k=split_k)


def skinny_matmul(x: Tensor, weight: Tensor, config: SkinnyConfig | None = None) -> Tensor:
    """x [T, K] (T <= 16) times weight [N, K] transposed: [T, N] in x's dtype (fp32 inside)."""
    t, k = x.shape
    n = weight.shape[0]
    if t > MAX_ROWS or weight.shape[1] != k or x.stride(1) != 1 or weight.stride(1) != 1:
        raise RuntimeError(
            f"skinny_matmul wants x [T <= {MAX_ROWS}, K] and weight [N, K] with unit last strides, "
            f"got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    cfg = config or default_config(n, k, num_sms(x.device))
    out = torch.empty(t, n, device=x.device, dtype=x.dtype)
    k_per_split = split_span(k, cfg.split_k, cfg.block_k)
    part = partials(out, cfg.split_k)
    _skinny_kernel[(checked_tiles(cdiv(n, cfg.block_n), cfg.split_k), cfg.split_k)](
        x,
        weight,
        out,
        part,
        arrival_counts(x.device),
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        t,
        n,
        k,
        k_per_split,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT=cfg.split_k > 1,
        PRECISION=dot_precision(x.dtype),
        PDL=pdl.enabled(x.device),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl.launch_options(x.device),
    )
    return out
