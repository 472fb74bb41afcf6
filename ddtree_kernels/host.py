"""Host-side helpers for the launch wrappers: integer maths, the device's SM count and FP8 support,
and the quantized activations the FP8 wrappers accept (no Triton here: the CPU runtime uses them).

``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions: called from Python each
costs ~3.5 µs, and a wrapper that plans its grid calls them dozens of times (the attention
planner took 360 µs per eager call before it used these). Same results, plain ints.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

MAX_ROWS = 16  # rows of a skinny (decode) linear: one tl.dot tile; more rows are a GEMM's job


def cdiv(a: int, b: int) -> int:
    """Ceiling of a / b for ints."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (0 for n <= 0, like triton.next_power_of_2)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


@lru_cache(maxsize=16)
def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (4 stands in on the CPU interpreter), read once."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


@lru_cache(maxsize=16)
def fp8_tensor_cores(device: torch.device) -> bool:
    """Whether a CUDA device multiplies e4m3 in its tensor cores (sm_89 and newer); the CPU
    interpreter emulates them."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return True


@dataclass(frozen=True)
class QuantizedRows:
    """Activations already quantized as ``act_quant`` does: x8 e4m3 [T, K], scale fp32 [T, G] per
    row and group of ``group`` columns (G = 1: per row), and ``dtype``, the rows' own dtype (the
    linear's output dtype)."""

    x8: Tensor
    scale: Tensor
    group: int
    dtype: torch.dtype

    @classmethod
    def empty(cls, t: int, k: int, group: int, dtype: torch.dtype, device: torch.device) -> QuantizedRows:
        """Buffers for T rows of K columns, quantized by `group` columns, for a producer to fill."""
        return cls(
            torch.empty(t, k, device=device, dtype=torch.float8_e4m3fn),
            torch.empty(t, cdiv(k, group), device=device, dtype=torch.float32),
            group,
            dtype,
        )

    @property
    def shape(self) -> torch.Size:
        """[T, K], the shape of the rows before quantization: the FP8 wrappers size their launch by it."""
        return self.x8.shape

    def checked(self, group: int) -> QuantizedRows:
        """These rows, if they are quantized by groups of `group` columns (a RuntimeError with the
        shapes otherwise: an FP8 linear reads them as it would have quantized them)."""
        t, k = self.x8.shape
        if (
            min(self.group, k) != min(group, k)
            or self.x8.dtype != torch.float8_e4m3fn
            or self.x8.stride(1) != 1
            or self.scale.dtype != torch.float32
            or tuple(self.scale.shape) != (t, cdiv(k, group))
        ):
            raise RuntimeError(
                f"FP8 matmul wants activations quantized by groups of {group} columns (e4m3 [T, K], "
                f"fp32 scales [T, ceil(K / {group})]); got groups of {self.group}, x8 "
                f"{tuple(self.x8.shape)} {self.x8.dtype}, scale {tuple(self.scale.shape)} {self.scale.dtype}"
            )
        return self
