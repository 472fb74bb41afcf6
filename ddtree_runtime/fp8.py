"""FP8 (e4m3, block-scaled) linears in PyTorch: the CPU path of FP8 targets, the reference of the
FP8 kernels (``ddtree_kernels/fp8_gemm.py``, ``fp8_skinny.py``: the maths is in their docstring),
and the quantization that writes checkpoints. No Triton: an FP8 target runs on any machine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree_kernels.host import QuantizedRows

E4M3_MAX = 448.0
SCALE_FLOOR = 1e-10  # an all-zero group gets this amax: its scale stays finite and x8 = 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _over_e4m3_max(amax: Tensor) -> Tensor:
    """max(amax, floor) / 448 as an IEEE division on every device (CUDA divides by a Python scalar
    through its reciprocal, one ulp away at times: the kernels divide exactly)."""
    return amax.clamp(min=SCALE_FLOOR) / torch.full_like(amax, E4M3_MAX)


def act_quant_reference(x: Tensor, group: int) -> tuple[Tensor, Tensor]:
    """What ``act_quant`` computes: (x8 e4m3 [T, K], s_x fp32 [T, ceil(K / group)])."""
    t, k = x.shape
    groups = cdiv(k, group)
    padded = F.pad(x.float(), (0, groups * group - k)).view(t, groups, group)
    scale = _over_e4m3_max(padded.abs().amax(dim=-1))  # [T, G]
    q = (padded / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(t, groups * group)[:, :k], scale


def quantized_reference(x: Tensor, group: int) -> QuantizedRows:
    """x [T, K] as its producer hands it to the FP8 linears that read it (the fused kernels'
    reference): `act_quant_reference` of the rows, once for all of them."""
    return QuantizedRows(*act_quant_reference(x, group), group, x.dtype)


def dequantize_weight(weight: Tensor, scale: Tensor, block: tuple[int, int]) -> Tensor:
    """The fp32 weight [N, K] an FP8 weight and its block scales stand for."""
    n, k = weight.shape
    rows = scale.repeat_interleave(block[0], dim=0)[:n]
    return weight.float() * rows.repeat_interleave(min(block[1], k), dim=1)[:, :k]


def fp8_linear_reference(
    x: Tensor | QuantizedRows, weight: Tensor, scale: Tensor, block: tuple[int, int]
) -> Tensor:
    """The FP8 linear of any number of rows (or of rows already quantized by their producer),
    dequantized and multiplied in fp32: [T, N] in x's dtype."""
    k = weight.shape[1]
    group = min(block[1], k)
    if isinstance(x, QuantizedRows):
        rows = x.checked(group)
        lead, dtype = rows.x8.shape[:-1], rows.dtype
    else:
        rows, lead, dtype = quantized_reference(x.reshape(-1, k), group), x.shape[:-1], x.dtype
    xs = rows.x8.float() * rows.scale.repeat_interleave(group, dim=1)[:, :k]
    out = F.linear(xs, dequantize_weight(weight, scale, block))
    return out.to(dtype).reshape(*lead, weight.shape[0])


def quantize_weight(weight: Tensor, block: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """A weight [N, K] as e4m3 with one fp32 scale per block (amax / 448): how checkpoints are made."""
    n, k = weight.shape
    bn, bk = block[0], min(block[1], k)
    gn, gk = cdiv(n, bn), cdiv(k, bk)
    padded = F.pad(weight.float(), (0, gk * bk - k, 0, gn * bn - n)).view(gn, bn, gk, bk)
    scale = _over_e4m3_max(padded.abs().amax(dim=(1, 3)))  # [gn, gk]
    q = (padded / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(gn * bn, gk * bk)[:n, :k].contiguous(), scale
