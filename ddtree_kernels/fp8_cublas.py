"""The block-scaled FP8 linear of verify and prefill rows through cuBLAS, where cuBLAS runs it.

Qwen's FP8 recipe (1 x 128 activation scales, 128 x 128 weight scales; DeepSeek-V3's fine-grained
quantization) is a GEMM that cuBLAS 12.9 and newer runs on Hopper with the scales applied inside its
main loop, reached through torch's ``F.scaled_mm`` (``BlockWise1x128`` x ``BlockWise128x128``).
It computes the function of ``ddtree_kernels/fp8_gemm.py`` (the same e4m3 operands and scales, fp32
accumulation; only the order of the sums differs), on the same rows and weights: the activation
scales are handed over M-major, the weight scales transposed as a view.

On the H100 it ran the Qwen3.6-27B projections 1.4-1.6x faster than ``fp8_gemm`` at 257 rows and
1.5x at 4096 (0.88-0.91 of the FP8 tensor rate); at 65 rows neither won (benchmarks/RESULTS.md,
2026-12-06), so trees of up to 128 rows stay on ``fp8_gemm``. What cuBLAS takes, found there: rows
in multiples of 16 (a verify tree's 2^k + 1 rows go in with unused rows after them), K in whole groups
of four 128-column blocks, no fast accumulation, and torch offers the recipe on Hopper only (sm_90).
Elsewhere ``fp8_gemm`` serves.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree_kernels.fp8_gemm import check_fp8_operands, quantized
from ddtree_kernels.host import QuantizedRows, cdiv

BLOCK = (128, 128)
MIN_ROWS = 129  # fewer rows stay on fp8_gemm (65 rows: a wash on the H100)
ROW_MULTIPLE = 16  # cuBLAS refuses other row counts (CUBLAS_STATUS_NOT_SUPPORTED)
K_MULTIPLE = 512  # its weight scales come in whole groups of four K blocks


@functools.cache
def cublas_takes(device: torch.device) -> bool:
    """Whether cuBLAS runs the block-scaled recipe here: a Hopper GPU, CUDA 12.9 or newer, and a
    torch with ``F.scaled_mm`` (once per device: every big FP8 linear asks)."""
    cuda = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
    return (
        device.type == "cuda"
        and hasattr(F, "scaled_mm")
        and cuda >= (12, 9)
        and torch.cuda.get_device_capability(device)[0] == 9
    )


def serves(x: Tensor | QuantizedRows, weight: Tensor, block: tuple[int, int]) -> bool:
    """Whether this linear goes to cuBLAS: bf16 rows, enough of them, Qwen's blocks, a K it takes."""
    return (
        x.shape[0] >= MIN_ROWS
        and x.dtype == torch.bfloat16
        and tuple(block) == BLOCK
        and weight.shape[1] % K_MULTIPLE == 0
        and cublas_takes(weight.device)
    )


def fp8_cublas(x: Tensor | QuantizedRows, weight: Tensor, scale: Tensor) -> Tensor:
    """x [T, K] (or rows already quantized per 128 columns) times the 128 x 128 block-scaled e4m3
    weight [N, K] transposed, its fp32 scales [ceil(N / 128), K / 128]: [T, N] in x's dtype."""
    from torch.nn.functional import ScalingType  # torch >= 2.10; cublas_takes checked it

    check_fp8_operands(x, weight, scale, BLOCK)
    if weight.shape[1] % K_MULTIPLE:
        raise RuntimeError(
            f"cuBLAS's block-scaled GEMM wants K a multiple of {K_MULTIPLE}, got {weight.shape[1]}"
        )
    rows = quantized(x, BLOCK[1])
    t, k = rows.x8.shape
    padded = cdiv(t, ROW_MULTIPLE) * ROW_MULTIPLE
    # the rows past T stay unwritten: each output row reads only its own row of x8 and of the
    # scales, and those past T are cut off the result
    x8 = rows.x8
    if padded != t:
        x8 = torch.empty(padded, k, device=x8.device, dtype=x8.dtype)
        x8[:t].copy_(rows.x8)
    x_scale = torch.empty(rows.scale.shape[1], padded, device=x8.device).t()  # M-major, as cuBLAS reads it
    x_scale[:t].copy_(rows.scale)
    out = F.scaled_mm(
        x8,
        weight.t(),
        x_scale,
        ScalingType.BlockWise1x128,
        scale.t(),
        ScalingType.BlockWise128x128,
        output_dtype=rows.dtype,
    )
    return out[:t]
