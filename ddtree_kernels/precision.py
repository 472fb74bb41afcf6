"""``tl.dot`` at the precision the inputs ask for, on the GPU and in the CPU interpreter alike.

fp32 inputs get true fp32 products ("ieee"), not TF32: the runtime's fp32 path must stay exact
against its references. bf16/fp16 use the tensor cores natively. The CPU interpreter stores bf16 as
uint16 and would multiply the raw bits, so there the operands are upcast first.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, acc=None):
    """PRECISION 0: native (bf16/fp16 tensor cores), 1: fp32 "ieee", 2: upcast to fp32 first."""
    if PRECISION == 2:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif PRECISION == 1:
        out = tl.dot(a, b, acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


def dot_precision(dtype: torch.dtype) -> int:
    """The PRECISION constexpr for operands of ``dtype`` here (GPU or interpreter)."""
    if dtype == torch.float32:
        return 1
    return 2 if os.environ.get("TRITON_INTERPRET") == "1" else 0
