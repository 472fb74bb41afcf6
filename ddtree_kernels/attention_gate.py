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

For an FP8 target's ``o_proj`` ``attention_gate_fp8`` writes the gated output quantized instead, as
``fp8_gemm.act_quant`` would quantize it (``quantize_row``), when whole groups of columns fall in a
program's heads (``attention_gate_fits``: Qwen's 128-column groups, two to a 256-wide head); a
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
from ddtree_kernels.gated_rms_norm import whole_groups
from ddtree_kernels.host import QuantizedRows, cdiv, next_pow2
from ddtree_kernels.pdl import release_then_wait

HEADS_PER_PROGRAM = 8


@triton.jit
def _attention_gate_kernel(
    ATT,
    QKV,
    OUT,
    Q,
    S,
    stride_oh,
    stride_ot,
    stride_qt,
    stride_out,
    stride_q,
    stride_s,
    n_heads,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    GROUP: tl.constexpr,
    PDL: tl.constexpr,
):
    """GROUP 0: out[t] in the model dtype; else quantized into Q[t], S[t] by GROUP columns."""
    release_then_wait(PDL)  # o_proj may start fetching its weight
    t = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, D_PAD)
    ok = (heads < n_heads)[:, None] & (cols < D)[None, :]
    o = tl.load(ATT + heads[:, None] * stride_oh + t * stride_ot + cols[None, :], mask=ok, other=0.0)
    gate = tl.load(QKV + t * stride_qt + heads[:, None] * 2 * D + D + cols[None, :], mask=ok, other=0.0)
    ty = QKV.dtype.element_ty
    g = gate.to(tl.float32)
    s = (1.0 / (1.0 + tl.exp(-g))).to(ty)
    out = (o.to(tl.float32) * s.to(tl.float32)).to(ty)
    if GROUP == 0:
        tl.store(OUT + t * stride_out + heads[:, None] * D + cols[None, :], out, mask=ok)
    else:  # D == D_PAD: the block's heads are BLOCK_H * D consecutive columns
        row = tl.reshape(out.to(tl.float32), [BLOCK_H * D])
        start = tl.program_id(1) * BLOCK_H * D
        quantize_row(row, Q + t * stride_q, S + t * stride_s, start, n_heads * D, GROUP, BLOCK_H * D)


def attention_gate(o: Tensor, qkv: Tensor, n_heads: int) -> Tensor:
    """o [Hq, T, D] (the attention's output), qkv [T, >= 2 Hq D] (each query head's D values, then its
    D gate values) -> [T, Hq D] in qkv's dtype."""
    hq, t, d = _check(o, qkv, n_heads)
    out = torch.empty(t, hq * d, device=o.device, dtype=qkv.dtype)
    _launch(o, qkv, out, None)
    return out


def attention_gate_fp8(o: Tensor, qkv: Tensor, n_heads: int, group: int) -> QuantizedRows:
    """`attention_gate`'s [T, Hq D], quantized per row and group of `group` columns, which must tile a
    program's heads (`attention_gate_fits`)."""
    hq, t, d = _check(o, qkv, n_heads)
    if not attention_gate_fits(group, hq, d):
        raise RuntimeError(
            f"attention_gate_fp8 quantizes power-of-two groups of 16..{_block_h(hq) * d} columns "
            f"(whole groups in {_block_h(hq)} heads of {d}, a power of two), not {group}"
        )
    rows = QuantizedRows.empty(t, hq * d, group, qkv.dtype, o.device)
    _launch(o, qkv, rows.x8, rows)
    return rows


def attention_gate_fits(group: int, hq: int, d: int) -> bool:
    """Whether `attention_gate_fp8` can quantize Hq heads of D by `group` columns."""
    return whole_groups(group, _block_h(hq), d)


def _block_h(hq: int) -> int:
    return min(HEADS_PER_PROGRAM, next_pow2(hq))


def _check(o: Tensor, qkv: Tensor, n_heads: int) -> tuple[int, int, int]:
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
    return hq, t, d


def _launch(o: Tensor, qkv: Tensor, out: Tensor, rows: QuantizedRows | None) -> None:
    hq, t, d = o.shape
    block_h = _block_h(hq)
    _attention_gate_kernel[(t, cdiv(hq, block_h))](
        o,
        qkv,
        out,
        rows.x8 if rows else out,
        rows.scale if rows else out,
        o.stride(0),
        o.stride(1),
        qkv.stride(0),
        out.stride(0),
        rows.x8.stride(0) if rows else 0,
        rows.scale.stride(0) if rows else 0,
        hq,
        D=d,
        D_PAD=max(16, next_pow2(d)),
        BLOCK_H=block_h,
        GROUP=rows.group if rows else 0,
        PDL=pdl.enabled(o.device),
        num_warps=4,
        **pdl.seam_launch_options(o.device, t),
    )
