"""The Gated DeltaNet output norm: per value head, RMSNorm of the recurrence's output times silu(z).

Qwen3.5's ``RMSNormGated`` over each head's Dv values, with the gate z from the layer's fused input
projection, exactly as the reference rounds:

    o    = o.to(dtype)                                   (the recurrence's output in the model dtype)
    a    = (w * (o / sqrt(mean(o^2) + eps)).to(dtype)).to(dtype)
    out  = (a * silu(z.float())).to(dtype)

One program per (token, block of ``HEADS_PER_PROGRAM`` value heads) writes those heads' columns of
``out[t]``, so the result is the ``[T, Hv * Dv]`` input of ``out_proj`` with no reshaping copy (a
program per token and head, one warp each, left 12K tiny programs at 257 rows: 8.8 µs a layer on
the H200, 3.1 at 65). ``ddtree_kernels/gdn_step.py`` fuses
the same arithmetic (``gated_norm``) into the single-token recurrence.

For an FP8 target's ``out_proj`` ``gated_rms_norm_fp8`` writes the output quantized instead, as
``fp8_gemm.act_quant`` would quantize it (``quantize_row``), when whole groups of columns fall in a
program's heads (``gated_norm_fits``: Qwen's 128-column groups, a 128-wide value head each); a
scale per row (per-channel checkpoints) spans a row's several programs at real sizes, and those
rows stay unquantized (the linear quantizes them).
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

HEADS_PER_PROGRAM = 16


def whole_groups(group: int, heads: int, d: int) -> bool:
    """Whether groups of `group` columns tile a program's `heads` heads of `d` columns (a power of two
    each, so the heads lie side by side with no padding): a producer writing heads per program can
    then quantize them as `act_quant` does, each group whole in one program."""
    width = heads * d
    return d >= 16 and d == next_pow2(d) and group == next_pow2(group) and group >= 16 and width % group == 0


@triton.jit
def gated_norm(o, z, w, ok, eps, DV: tl.constexpr, OUT_TY: tl.constexpr):
    """Gated RMSNorm of one head or a block of heads: o (fp32, rounded to OUT_TY first) and z
    [DV_PAD] or [heads, DV_PAD], w [DV_PAD] (or [1, DV_PAD]) -> OUT_TY, each head over its own row."""
    of = tl.where(ok, o.to(OUT_TY).to(tl.float32), 0.0)
    normed = (of / tl.sqrt(tl.sum(of * of, axis=-1, keep_dims=True) / DV + eps)).to(OUT_TY)
    a = (w.to(tl.float32) * normed.to(tl.float32)).to(OUT_TY).to(tl.float32)
    zf = z.to(tl.float32)
    return (a * (zf / (1.0 + tl.exp(-zf)))).to(OUT_TY)


@triton.jit
def _gated_rms_norm_kernel(
    X,
    PROJ,
    W,
    OUT,
    Q,
    S,
    stride_ot,
    stride_oh,
    stride_pt,
    stride_out,
    stride_q,
    stride_s,
    z_col,
    eps,
    n_heads,
    DV: tl.constexpr,
    DV_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    GROUP: tl.constexpr,
    PDL: tl.constexpr,
):
    """GROUP 0: out[t] in the model dtype; else quantized into Q[t], S[t] by GROUP columns."""
    release_then_wait(PDL)  # out_proj may start fetching its weight
    t = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, DV_PAD)
    col_ok = cols < DV
    ok = (heads < n_heads)[:, None] & col_ok[None, :]
    o = tl.load(X + t * stride_ot + heads[:, None] * stride_oh + cols[None, :], mask=ok, other=0.0)
    z = tl.load(PROJ + t * stride_pt + z_col + heads[:, None] * DV + cols[None, :], mask=ok, other=0.0)
    w = tl.load(W + cols, mask=col_ok, other=0.0)[None, :]
    out = gated_norm(o.to(tl.float32), z, w, ok, eps, DV, PROJ.dtype.element_ty)
    if GROUP == 0:
        tl.store(OUT + t * stride_out + heads[:, None] * DV + cols[None, :], out, mask=ok)
    else:  # DV == DV_PAD: the block's heads are BLOCK_H * DV consecutive columns
        row = tl.reshape(out.to(tl.float32), [BLOCK_H * DV])
        start = tl.program_id(1) * BLOCK_H * DV
        quantize_row(row, Q + t * stride_q, S + t * stride_s, start, n_heads * DV, GROUP, BLOCK_H * DV)


def gated_rms_norm(o: Tensor, proj: Tensor, z_col: int, weight: Tensor, eps: float) -> Tensor:
    """o [T, Hv, Dv] (any float dtype); z = proj[:, z_col : z_col + Hv Dv]; weight [Dv].
    Returns [T, Hv * Dv] in proj's dtype."""
    t, hv, dv = _check(o, proj, z_col, weight)
    out = torch.empty(t, hv * dv, device=o.device, dtype=proj.dtype)
    _launch(o, proj, z_col, weight, eps, out, None)
    return out


def gated_rms_norm_fp8(
    o: Tensor, proj: Tensor, z_col: int, weight: Tensor, eps: float, group: int
) -> QuantizedRows:
    """`gated_rms_norm`'s [T, Hv Dv], quantized per row and group of `group` columns, which must
    tile a program's heads (`gated_norm_fits`)."""
    t, hv, dv = _check(o, proj, z_col, weight)
    if not gated_norm_fits(group, hv, dv):
        raise RuntimeError(
            f"gated_rms_norm_fp8 quantizes power-of-two groups of 16..{_block_h(hv) * dv} columns "
            f"(whole groups in {_block_h(hv)} heads of {dv}, a power of two), not {group}"
        )
    rows = QuantizedRows.empty(t, hv * dv, group, proj.dtype, o.device)
    _launch(o, proj, z_col, weight, eps, rows.x8, rows)
    return rows


def gated_norm_fits(group: int, hv: int, dv: int) -> bool:
    """Whether `gated_rms_norm_fp8` can quantize Hv heads of Dv by `group` columns."""
    return whole_groups(group, _block_h(hv), dv)


def _block_h(hv: int) -> int:
    return min(HEADS_PER_PROGRAM, next_pow2(hv))


def _check(o: Tensor, proj: Tensor, z_col: int, weight: Tensor) -> tuple[int, int, int]:
    t, hv, dv = o.shape
    if o.stride(2) != 1 or proj.stride(1) != 1 or proj.shape[0] != t or proj.shape[1] < z_col + hv * dv:
        raise RuntimeError(
            f"gated_rms_norm wants o [T, Hv, Dv] and proj [T, >= {z_col + hv * dv}] with unit last strides, "
            f"got {tuple(o.shape)} and {tuple(proj.shape)}"
        )
    if weight.shape != (dv,):
        raise RuntimeError(f"gated_rms_norm wants weight [{dv}], got {tuple(weight.shape)}")
    return t, hv, dv


def _launch(
    o: Tensor, proj: Tensor, z_col: int, weight: Tensor, eps: float, out: Tensor, rows: QuantizedRows | None
) -> None:
    t, hv, dv = o.shape
    block_h = _block_h(hv)
    _gated_rms_norm_kernel[(t, cdiv(hv, block_h))](
        o,
        proj,
        weight,
        out,
        rows.x8 if rows else out,
        rows.scale if rows else out,
        o.stride(0),
        o.stride(1),
        proj.stride(0),
        out.stride(0),
        rows.x8.stride(0) if rows else 0,
        rows.scale.stride(0) if rows else 0,
        z_col,
        eps,
        hv,
        DV=dv,
        DV_PAD=max(16, next_pow2(dv)),
        BLOCK_H=block_h,
        GROUP=rows.group if rows else 0,
        PDL=pdl.enabled(o.device),
        num_warps=4,
        **pdl.seam_launch_options(o.device, t),
    )
