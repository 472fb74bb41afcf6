"""Qwen3.5's attention output gate: each query head's output times the sigmoid of its gate, in one launch.

A gated attention layer's ``q_proj`` gives each query head D query values then D gate values; after
attention the output of head h is multiplied by sigmoid(gate_h) before ``o_proj``:

    out[t, h D : (h + 1) D] = o[h, t] * sigmoid(gate[t, h])       (rounded as the reference:
                                                                   sigmoid in fp32, to the dtype,
                                                                   the product in fp32, to the dtype)

In PyTorch that is a sigmoid over a strided view of the projection and a multiply: two launches and
a round trip through memory (8 µs a layer at 257 rows on the H200, the strided sigmoid most of it).
One program per (token, block of ``HEADS_PER_PROGRAM`` heads) reads both and writes the ``[T, Hq D]``
input of ``o_proj``. The reference is ``ddtree_runtime.backend.TorchBackend.attention_gate``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import cdiv, next_pow2

HEADS_PER_PROGRAM = 8


@triton.jit
def _attention_gate_kernel(
    ATT,
    QKV,
    OUT,
    stride_oh,
    stride_ot,
    stride_qt,
    stride_out,
    n_heads,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, D_PAD)
    ok = (heads < n_heads)[:, None] & (cols < D)[None, :]
    o = tl.load(ATT + heads[:, None] * stride_oh + t * stride_ot + cols[None, :], mask=ok, other=0.0)
    gate = tl.load(QKV + t * stride_qt + heads[:, None] * 2 * D + D + cols[None, :], mask=ok, other=0.0)
    g = gate.to(tl.float32)
    s = (1.0 / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty)
    out = (o.to(tl.float32) * s.to(tl.float32)).to(OUT.dtype.element_ty)
    tl.store(OUT + t * stride_out + heads[:, None] * D + cols[None, :], out, mask=ok)


def attention_gate(o: Tensor, qkv: Tensor, n_heads: int) -> Tensor:
    """o [Hq, T, D] (the attention's output), qkv [T, >= 2 Hq D] (each query head's D values, then its
    D gate values) -> [T, Hq D] in qkv's dtype."""
    hq, t, d = o.shape
    if (
        hq != n_heads
        or o.stride(2) != 1
        or qkv.shape[0] != t
        or qkv.shape[1] < 2 * hq * d
        or qkv.stride(1) != 1
    ):
        raise RuntimeError(
            f"attention_gate wants o [{n_heads}, T, D] and qkv [T, >= 2 {n_heads} D] with unit last strides, "
            f"got {tuple(o.shape)} and {tuple(qkv.shape)}"
        )
    out = torch.empty(t, hq * d, device=o.device, dtype=qkv.dtype)
    block_h = min(HEADS_PER_PROGRAM, next_pow2(hq))
    _attention_gate_kernel[(t, cdiv(hq, block_h))](
        o,
        qkv,
        out,
        o.stride(0),
        o.stride(1),
        qkv.stride(0),
        out.stride(0),
        hq,
        D=d,
        D_PAD=max(16, next_pow2(d)),
        BLOCK_H=block_h,
        num_warps=4,
    )
    return out
