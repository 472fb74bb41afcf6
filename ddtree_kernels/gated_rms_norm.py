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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import cdiv, next_pow2

HEADS_PER_PROGRAM = 16


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
    stride_ot,
    stride_oh,
    stride_pt,
    stride_out,
    z_col,
    eps,
    n_heads,
    DV: tl.constexpr,
    DV_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, DV_PAD)
    col_ok = cols < DV
    ok = (heads < n_heads)[:, None] & col_ok[None, :]
    o = tl.load(X + t * stride_ot + heads[:, None] * stride_oh + cols[None, :], mask=ok, other=0.0)
    z = tl.load(PROJ + t * stride_pt + z_col + heads[:, None] * DV + cols[None, :], mask=ok, other=0.0)
    w = tl.load(W + cols, mask=col_ok, other=0.0)[None, :]
    out = gated_norm(o.to(tl.float32), z, w, ok, eps, DV, OUT.dtype.element_ty)
    tl.store(OUT + t * stride_out + heads[:, None] * DV + cols[None, :], out, mask=ok)


def gated_rms_norm(o: Tensor, proj: Tensor, z_col: int, weight: Tensor, eps: float) -> Tensor:
    """o [T, Hv, Dv] (any float dtype); z = proj[:, z_col : z_col + Hv Dv]; weight [Dv].
    Returns [T, Hv * Dv] in proj's dtype."""
    t, hv, dv = o.shape
    if o.stride(2) != 1 or proj.stride(1) != 1 or proj.shape[0] != t or proj.shape[1] < z_col + hv * dv:
        raise RuntimeError(
            f"gated_rms_norm wants o [T, Hv, Dv] and proj [T, >= {z_col + hv * dv}] with unit last strides, "
            f"got {tuple(o.shape)} and {tuple(proj.shape)}"
        )
    if weight.shape != (dv,):
        raise RuntimeError(f"gated_rms_norm wants weight [{dv}], got {tuple(weight.shape)}")
    out = torch.empty(t, hv * dv, device=o.device, dtype=proj.dtype)
    block_h = min(HEADS_PER_PROGRAM, next_pow2(hv))
    _gated_rms_norm_kernel[(t, cdiv(hv, block_h))](
        o,
        proj,
        weight,
        out,
        o.stride(0),
        o.stride(1),
        proj.stride(0),
        out.stride(0),
        z_col,
        eps,
        hv,
        DV=dv,
        DV_PAD=max(16, next_pow2(dv)),
        BLOCK_H=block_h,
        num_warps=4,
    )
    return out
