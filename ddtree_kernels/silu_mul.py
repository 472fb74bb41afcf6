"""SwiGLU's gate: ``silu(gate) * up`` from the fused gate/up projection, in one pass.

The MLP's fused projection gives ``[T, 2I]`` (gate columns, then up columns); unfused, the gate is
three kernels (slice-silu, multiply, and the copy a slice can force). One program per (row, column
block) reads both halves once, computes in fp32 and writes ``[T, I]``. The reference is
``ddtree_runtime.backend.TorchBackend.silu_mul``.

For an FP8 target's down projection ``silu_mul_fp8`` writes the product quantized instead (e4m3 and
the scales ``fp8_gemm.act_quant`` would compute from the rounded product), in the same pass. With a
scale per row (per-channel checkpoints) one program walks the row twice: its amax first, then the
quantization. Its reference is ``TorchBackend.silu_mul_fp8``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels import pdl
from ddtree_kernels.fp8_gemm import _group_scale, _round_e4m3, quantize_row
from ddtree_kernels.host import QuantizedRows, cdiv
from ddtree_kernels.pdl import release_then_wait


@triton.jit
def _swiglu(GU, cols, inner, OUT_TY: tl.constexpr):
    """silu(gate) * up of one row's columns ``cols`` (GU: the row), rounded to OUT_TY."""
    ok = cols < inner
    g = tl.load(GU + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + inner + cols, mask=ok, other=0.0).to(tl.float32)
    return (g / (1.0 + tl.exp(-g)) * u).to(OUT_TY)


@triton.jit
def _silu_mul_kernel(GU, OUT, stride_g, stride_o, inner, BLOCK: tl.constexpr, PDL: tl.constexpr):
    release_then_wait(PDL)  # the down projection may start fetching its weight
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    out = _swiglu(GU + row * stride_g, cols, inner, OUT.dtype.element_ty)
    tl.store(OUT + row * stride_o + cols, out, mask=cols < inner)


@triton.jit
def _silu_mul_fp8_kernel(
    GU,
    Q,
    S,
    stride_g,
    stride_q,
    stride_s,
    inner,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
    PDL: tl.constexpr,
):
    release_then_wait(PDL)
    row = tl.program_id(0)
    ty = GU.dtype.element_ty  # the product is rounded to the model dtype, then quantized
    gu, q, s = GU + row * stride_g, Q + row * stride_q, S + row * stride_s
    offs = tl.arange(0, BLOCK)
    if STEPS == 0:  # groups of GROUP columns, whole in this program's block
        start = tl.program_id(1) * BLOCK
        out = _swiglu(gu, start + offs, inner, ty).to(tl.float32)
        quantize_row(out, q, s, start, inner, GROUP, BLOCK)
    else:  # one scale for the row, in STEPS blocks
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for step in tl.static_range(STEPS):
            out = _swiglu(gu, step * BLOCK + offs, inner, ty).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(out))  # columns past the row are 0
        scale = _group_scale(tl.max(amax, axis=0))
        for step in tl.static_range(STEPS):
            cols = step * BLOCK + offs
            out = _swiglu(gu, cols, inner, ty).to(tl.float32)
            tl.store(q + cols, _round_e4m3(out, scale), mask=cols < inner)
        tl.store(s, scale)


BLOCK = 1024  # columns per program (or per step of a row's walk): whole 32..256-column groups


def _check(gate_up: Tensor) -> int:
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        raise RuntimeError(f"silu_mul wants [T, 2I] with unit last stride, got {tuple(gate_up.shape)}")
    return gate_up.shape[1] // 2


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up [T, 2I] -> silu(gate_up[:, :I]) * gate_up[:, I:], [T, I]."""
    inner = _check(gate_up)
    t = gate_up.shape[0]
    out = torch.empty(t, inner, device=gate_up.device, dtype=gate_up.dtype)
    _silu_mul_kernel[(t, cdiv(inner, BLOCK))](
        gate_up,
        out,
        gate_up.stride(0),
        out.stride(0),
        inner,
        BLOCK=BLOCK,
        PDL=pdl.enabled(out.device),
        num_warps=4,
        **pdl.seam_launch_options(out.device, t),
    )
    return out


def silu_mul_fp8(gate_up: Tensor, group: int) -> QuantizedRows:
    """`silu_mul`'s [T, I], quantized per row and group of `group` columns (>= I: per row)."""
    inner = _check(gate_up)
    t = gate_up.shape[0]
    per_row = group >= inner
    if not per_row and BLOCK % group:
        raise RuntimeError(
            f"silu_mul_fp8 quantizes groups of 32..{BLOCK} columns dividing {BLOCK}, not {group}"
        )
    rows = QuantizedRows.empty(t, inner, group, gate_up.dtype, gate_up.device)
    _silu_mul_fp8_kernel[(t, 1 if per_row else cdiv(inner, BLOCK))](
        gate_up,
        rows.x8,
        rows.scale,
        gate_up.stride(0),
        rows.x8.stride(0),
        rows.scale.stride(0),
        inner,
        GROUP=BLOCK if per_row else group,
        BLOCK=BLOCK,
        STEPS=cdiv(inner, BLOCK) if per_row else 0,
        PDL=pdl.enabled(gate_up.device),
        num_warps=4,
        **pdl.seam_launch_options(gate_up.device, t),
    )
    return rows
