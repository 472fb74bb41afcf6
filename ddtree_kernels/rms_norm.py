"""RMSNorm, optionally fused with the residual add before it: one read and one write per row.

A Qwen3 decoder layer runs ``x = x + sublayer(h); h = norm(x)`` twice per layer. Unfused that is an
add kernel and ~6 small ones for the norm (upcast, square, mean, rsqrt, scale, downcast), each a
launch and a round trip through memory; at batch 1 these launches, not the bytes, cost the time.
Here one program per row computes, in fp32,

    s = x + residual            (rounded to the input dtype: it is the new residual stream)
    out = weight * (s / sqrt(mean(s^2) + eps))   (the normalised value rounded to the weight's
                                                  dtype first, then scaled and rounded to the input
                                                  dtype: Qwen3's RMSNorm with its bf16 weights, and
                                                  Qwen3.5's with fp32 (1 + w) scales)

and writes both ``out`` and ``s``. The reference is ``ddtree_runtime.backend.TorchBackend.rms_norm``.

For an FP8 target ``rms_norm_fp8`` also quantizes ``out`` for the FP8 linears that read it, as
``fp8_gemm.act_quant`` would (per row and group of columns): one quantization for q, k and v (or
gate and up), and no separate launch. Its reference is ``TorchBackend.rms_norm_fp8``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels import pdl
from ddtree_kernels.fp8_gemm import quantize_row
from ddtree_kernels.host import QuantizedRows, cdiv, next_pow2
from ddtree_kernels.pdl import release_then_wait

QUANT_CHUNK = 1024  # columns per program of a chunked quantized norm
CHUNKED_ROWS = 512  # up to a tree's verify rows a quantized norm is chunked; prefill rows fill the SMs whole


@triton.jit
def _rms_norm_kernel(
    X,
    RES,
    W,
    OUT,
    RES_OUT,
    Q,
    S,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    stride_q,
    stride_s,
    n_cols,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (row, chunk): the row's mean square from all of it, then its columns chunk * CHUNK ..
    normalised, written and quantized (CHUNK = BLOCK: the whole row in one program)."""
    release_then_wait(PDL)  # the linear after it may start fetching its weight
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RES:
        x = x.to(tl.float32) + tl.load(RES + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
        x = x.to(RES_OUT.dtype.element_ty)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    if CHUNK < BLOCK:  # this program's columns again (from cache), as the whole row computed them
        cols = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
        ok = cols < n_cols
        x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
        if HAS_RES:
            x = x.to(tl.float32) + tl.load(RES + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
            x = x.to(RES_OUT.dtype.element_ty)
    if HAS_RES:
        tl.store(RES_OUT + row * stride_ro + cols, x, mask=ok)
    normed = (x.to(tl.float32) * inv).to(W.dtype.element_ty)
    w = tl.load(W + cols, mask=ok, other=0.0)
    out = (w.to(tl.float32) * normed.to(tl.float32)).to(OUT.dtype.element_ty)
    tl.store(OUT + row * stride_o + cols, out, mask=ok)
    if QUANT:
        start = tl.program_id(1) * CHUNK
        quantize_row(out.to(tl.float32), Q + row * stride_q, S + row * stride_s, start, n_cols, GROUP, CHUNK)


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """x [T, H] (+ residual [T, H]) -> (norm(s) [T, H], s) with s = x + residual (s = x without one)."""
    return _launch(x, weight, eps, residual, None)


def rms_norm_fp8(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None, group: int
) -> tuple[Tensor, Tensor, QuantizedRows]:
    """`rms_norm`, and its output quantized per row and group of `group` columns (>= H: per row)."""
    t, h = x.shape[0], x.shape[-1]
    if group < h and (group != next_pow2(group) or group < 16):
        raise RuntimeError(f"rms_norm_fp8 quantizes groups of 16, 32, ... columns or whole rows, not {group}")
    rows = QuantizedRows.empty(t, h, group, x.dtype, x.device)
    return *_launch(x, weight, eps, residual, rows), rows


def _launch(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None, rows: QuantizedRows | None
) -> tuple[Tensor, Tensor]:
    if x.dim() != 2 or x.stride(1) != 1 or weight.shape != (x.shape[1],):
        raise RuntimeError(
            f"rms_norm wants x [T, H] with unit last stride and weight [H], got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    t, h = x.shape
    block = next_pow2(h)
    group = rows.group if rows is not None and rows.group < h else block  # >= H: one group, the row
    # decode and verify rows of a quantized norm: the row in chunks over several programs (one program
    # quantizing a 5120-wide row took 6.4 µs on the H200, twice the plain norm, and a 65-row tree's
    # 65 programs 6.6 µs on the H100); whole groups, whole rows else
    chunked = rows is not None and t <= CHUNKED_ROWS and group < block
    chunk = min(block, max(group, QUANT_CHUNK)) if chunked else block
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else x
    res = residual if residual is not None else x
    _rms_norm_kernel[(t, cdiv(h, chunk))](
        x,
        res,
        weight,
        out,
        res_out,
        rows.x8 if rows else out,
        rows.scale if rows else out,
        x.stride(0),
        res.stride(0),
        out.stride(0),
        res_out.stride(0),
        rows.x8.stride(0) if rows else 0,
        rows.scale.stride(0) if rows else 0,
        h,
        eps,
        HAS_RES=residual is not None,
        BLOCK=block,
        CHUNK=chunk,
        QUANT=rows is not None,
        GROUP=group,
        PDL=pdl.enabled(x.device),
        num_warps=8 if h >= 2048 else 4,
        **pdl.seam_launch_options(x.device, t),
    )
    return out, res_out
