"""SwiGLU's gate: ``silu(gate) * up`` from the fused gate/up projection, in one pass.

The MLP's fused projection gives ``[T, 2I]`` (gate columns, then up columns); unfused, the gate is
three kernels (slice-silu, multiply, and the copy a slice can force). One program per (row, column
block) reads both halves once, computes in fp32 and writes ``[T, I]``. The reference is
``ddtree_runtime.backend.TorchBackend.silu_mul``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _silu_mul_kernel(GU, OUT, stride_g, stride_o, inner, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inner
    g = tl.load(GU + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_g + inner + cols, mask=ok, other=0.0).to(tl.float32)
    out = g / (1.0 + tl.exp(-g)) * u
    tl.store(OUT + row * stride_o + cols, out.to(OUT.dtype.element_ty), mask=ok)


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up [T, 2I] -> silu(gate_up[:, :I]) * gate_up[:, I:], [T, I]."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        raise RuntimeError(f"silu_mul wants [T, 2I] with unit last stride, got {tuple(gate_up.shape)}")
    t, two_i = gate_up.shape
    inner = two_i // 2
    out = torch.empty(t, inner, device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    _silu_mul_kernel[(t, -(-inner // block))](
        gate_up, out, gate_up.stride(0), out.stride(0), inner, BLOCK=block, num_warps=4
    )
    return out
