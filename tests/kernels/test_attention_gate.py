"""The gated attention's output gate (Qwen3.5) on its kernel against TorchBackend's expression."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.attention_gate import attention_gate
from ddtree_runtime.backend import TorchBackend
from tests.kernels.trees import DEVICE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("t", "hq", "d"), [(1, 4, 16), (5, 12, 24)])  # 12 heads: a block of 8, then 4
def test_the_gate_matches_torch(dtype: torch.dtype, t: int, hq: int, d: int) -> None:
    """Each head's output times the sigmoid of the gate values after its query values, from the
    attention's head-major output and the projection's rows (with the k/v columns after them)."""
    gen = torch.Generator().manual_seed(t * hq)
    qkv = (torch.randn(t, 2 * hq * d + 3 * d, generator=gen) * 3).to(DEVICE, dtype)
    o = torch.randn(t, hq, d, generator=gen).to(DEVICE, dtype).transpose(0, 1)  # [Hq, T, D], T-major
    got = attention_gate(o, qkv, hq)
    want = TorchBackend.attention_gate(o, qkv, hq)
    assert got.shape == (t, hq * d) and got.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-6
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_a_projection_too_narrow_for_the_gates_is_refused() -> None:
    o = torch.zeros(4, 2, 16, device=DEVICE)
    with pytest.raises(RuntimeError, match="attention_gate wants"):
        attention_gate(o, torch.zeros(2, 4 * 16, device=DEVICE), 4)
