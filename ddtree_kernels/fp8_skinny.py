"""Skinny FP8 matmul: the FP8 linear of ``ddtree_kernels/fp8_gemm.py`` for a few rows, at bandwidth.

Decode, a chain's verify and the rows of a small tree are matrix-vector products in disguise: the
whole e4m3 weight ``W8 [N, K]`` (half the bytes of bf16) streams through once and almost no
arithmetic happens per byte. cuBLAS's FP8 GEMM (``torch._scaled_mm``) is no faster than the bf16
matmul there (benchmarks/RESULTS.md), so this kernel streams the weight itself, as
``ddtree_kernels/skinny_matmul.py`` does for bf16: one program owns ``BLOCK_N`` output columns and
walks K in ``BLOCK_K`` steps, each step loading a ``[BLOCK_N, BLOCK_K]`` tile of W8 and the
``[16, BLOCK_K]`` tile of x8 (rows past T masked to zero) as one tile per scale group of
``GROUP_K = block_k`` columns. A step of several groups keeps as many bytes in flight as the bf16
kernel's tiles: an e4m3 tile holds half the bytes, and one 128-column group per step left the H200's
copy bandwidth 20-70% idle. The activations are quantized once before it (``fp8_gemm.act_quant``, or
by the kernel that produced them: per row and ``block_k`` group, or per row over the whole of K with
per-channel weight scales), not in every program: quantizing x in
registers in each of the ~300 programs cost 5-20x the weight stream on the H200. The fp8 tile
product accumulates in fp32 and is scaled by the row's and the block's scales once per group, so
the result is the GEMM's. When N alone cannot fill the GPU, K is split across ``SPLIT_K`` programs
whose fp32 partials the last of them sums (``ddtree_kernels/split_k.py``). Its reference is
``ddtree_runtime/fp8.py``'s ``fp8_linear_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels import pdl
from ddtree_kernels.fp8_gemm import check_fp8_operands, quantized
from ddtree_kernels.host import MAX_ROWS, QuantizedRows, cdiv, num_sms
from ddtree_kernels.pdl import prefetch_then_wait, release_dependents
from ddtree_kernels.precision import dot, dot_precision
from ddtree_kernels.skinny_matmul import SkinnyConfig
from ddtree_kernels.skinny_matmul import default_config as bf16_config
from ddtree_kernels.split_k import arrival_counts, checked_tiles, partials, split_span, store_tile


@triton.jit
def _fp8_skinny_kernel(
    X8,
    X_SCALE,
    W,
    W_SCALE,
    OUT,
    PART,
    COUNTS,
    stride_xt,
    stride_xs,
    stride_wn,
    stride_ws,
    stride_ot,
    n_rows,
    n_cols,
    k_total,
    k_per_split,
    block_n,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_K: tl.constexpr,
    PER_ROW: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, 16)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, GROUP_K)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    w_scale_row = W_SCALE + (cols // block_n) * stride_ws
    acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    k0 = split * k_per_split
    prefetch_then_wait(PDL, W, cols, n_cols, stride_wn, k0, k_total, BLOCK_K)  # ddtree_kernels/pdl.py
    for k in range(k0, k0 + k_per_split, BLOCK_K):
        for g in tl.static_range(BLOCK_K // GROUP_K):  # the scale groups of one step, loads issued together
            kk = k + g * GROUP_K + offs_k
            k_ok = kk < k_total
            x8 = tl.load(
                X8 + rows[:, None] * stride_xt + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
            )
            w = tl.load(
                W + cols[:, None] * stride_wn + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0
            )
            if PER_ROW:
                acc = dot(x8, tl.trans(w), PRECISION, acc)
            else:
                # a step's last groups may lie past K: read the last group's (finite) scales, x8 is 0
                group = tl.minimum(k // GROUP_K + g, (k_total - 1) // GROUP_K)
                x_s = tl.load(X_SCALE + rows * stride_xs + group, mask=row_ok, other=0.0)
                w_s = tl.load(w_scale_row + group, mask=col_ok, other=0.0)
                acc += dot(x8, tl.trans(w), PRECISION) * x_s[:, None] * w_s[None, :]
    release_dependents(PDL)
    if PER_ROW:
        x_s = tl.load(X_SCALE + rows * stride_xs, mask=row_ok, other=0.0)
        acc = acc * x_s[:, None] * tl.load(w_scale_row, mask=col_ok, other=0.0)[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    store_tile(acc, OUT, PART, COUNTS, pid_n, rows, cols, mask, stride_ot, n_rows, n_cols, SPLIT)


def default_config(n: int, k: int, block_k: int, sms: int) -> SkinnyConfig:
    """The bf16 kernel's column tiles, 256-column K steps (whole scale groups), and K split until
    about 2.5 programs per SM while each split keeps >= 1024 of K. Swept on the H200
    (`fp8_bench.py --sweep skinny`, T = 1): one 128-column group per step and the bf16 rule's 1.5
    programs per SM left 5120-column projections at 0.39-0.54 of the copy ceiling; this rule is
    within 0.6 µs of the best swept config on every Qwen3-8B and Qwen3.6-27B projection."""
    block_n = bf16_config(n, k, sms).block_n
    programs = cdiv(n, block_n)
    split_k = 1
    while programs * split_k < 2.5 * sms and k // (split_k * 2) >= 1024:
        split_k *= 2
    step = max(256, block_k) if block_k < k else 256
    return SkinnyConfig(block_n=block_n, block_k=step, num_warps=4, num_stages=3, split_k=split_k)


def fp8_skinny(
    x: Tensor | QuantizedRows,
    weight: Tensor,
    scale: Tensor,
    block: tuple[int, int],
    config: SkinnyConfig | None = None,
) -> Tensor:
    """x [T, K] (T <= 16; or already quantized) times the FP8 weight [N, K] transposed: [T, N] in
    x's dtype."""
    check_fp8_operands(x, weight, scale, block)
    n, k = weight.shape
    t = x.shape[0]
    if t > MAX_ROWS:
        raise RuntimeError(f"fp8_skinny wants x [T <= {MAX_ROWS}, K], got {t} rows")
    per_row = block[1] >= k
    cfg = config or default_config(n, k, block[1], num_sms(weight.device))
    if not per_row and cfg.block_k % block[1]:
        raise RuntimeError(
            f"fp8_skinny steps whole groups: block_k {cfg.block_k} is not a multiple of {block[1]}"
        )
    rows = quantized(x, k if per_row else block[1])  # once, not in every program (or by x's producer)
    x8, x_scale = rows.x8, rows.scale
    out = torch.empty(t, n, device=x8.device, dtype=rows.dtype)
    k_per_split = split_span(k, cfg.split_k, cfg.block_k)
    part = partials(out, cfg.split_k)
    _fp8_skinny_kernel[(checked_tiles(cdiv(n, cfg.block_n), cfg.split_k), cfg.split_k)](
        x8,
        x_scale,
        weight,
        scale,
        out,
        part,
        arrival_counts(x8.device),
        x8.stride(0),
        x_scale.stride(0),
        weight.stride(0),
        scale.stride(0),
        out.stride(0),
        t,
        n,
        k,
        k_per_split,
        block[0],
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_K=cfg.block_k if per_row else block[1],
        PER_ROW=per_row,
        SPLIT=cfg.split_k > 1,
        PRECISION=dot_precision(torch.float8_e4m3fn),
        PDL=pdl.enabled(x8.device),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl.launch_options(x8.device),
    )
    return out
