"""The wrappers' plain-int helpers agree with Triton's constexpr functions they stand in for."""

from __future__ import annotations

import torch
import triton

from ddtree_kernels.host import cdiv, next_pow2, num_sms


def test_cdiv_and_next_pow2_match_triton() -> None:
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 200) for b in range(1, 33))
    assert all(next_pow2(n) == triton.next_power_of_2(n) for n in range(0, 4100))


def test_cpu_stands_in_with_four_sms() -> None:
    assert num_sms(torch.device("cpu")) == 4
