"""Host-side helpers for the launch wrappers: integer maths and the device's SM count and FP8 support.

``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions: called from Python each
costs ~3.5 µs, and a wrapper that plans its grid calls them dozens of times (the attention
planner took 360 µs per eager call before it used these). Same results, plain ints.
"""

from __future__ import annotations

from functools import lru_cache

import torch


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
