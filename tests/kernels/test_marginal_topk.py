"""Per-position top-k log-probabilities against PyTorch: values, tokens, ties, the overflow fallback."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.marginal_topk import marginal_topk, marginal_topk_reference
from tests.kernels.trees import DEVICE


def _check(logits: torch.Tensor, k: int, cap: int | None = None) -> None:
    vals, toks = marginal_topk(logits.to(DEVICE), k, cap)
    want_vals, want_toks = marginal_topk_reference(logits, k)
    assert vals.shape == toks.shape == (logits.shape[0], k)
    assert vals.dtype == torch.float32 and toks.dtype == torch.int64
    assert torch.equal(toks.cpu(), want_toks)
    assert torch.allclose(vals.cpu(), want_vals, atol=2e-5, rtol=0)
    assert (vals[:, 1:] <= vals[:, :-1]).all()


@pytest.mark.parametrize(
    ("rows", "vocab", "k", "dtype"),
    [
        (3, 5000, 64, torch.float32),  # one program per row, V % M != 0
        (2, 20000, 512, torch.bfloat16),  # several programs per row (20 tiles), bf16 ties
        (2, 9000, 700, torch.float32),  # M = 2048 > 2k
        (2, 300, 300, torch.bfloat16),  # V < M: chunks are single elements; k = V
        (1, 7, 3, torch.float32),
    ],
)
def test_matches_torch_topk(rows: int, vocab: int, k: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(vocab + k)
    _check((torch.randn(rows, vocab, generator=gen) * 3).to(dtype), k)


def test_ties_and_the_overflow_fallback() -> None:
    # rows of equal logits, of four values, and of -inf but for a few tokens: each has far more
    # candidates than cap = 128, so the exact bisection path rewrites its buffer
    gen = torch.Generator().manual_seed(0)
    logits = torch.full((3, 1500), float("-inf"))
    logits[0] = 0.0
    logits[1] = torch.randint(0, 4, (1500,), generator=gen).float()
    logits[2, [5, 1499]] = 1.0
    logits[2, 7] = -2.0
    _check(logits, 100, cap=128)
    _check(logits[1:2].to(torch.bfloat16), 100)  # default cap: ties beyond k, no overflow


def test_rejects_k_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match=r"outside 1\.\.5"):
        marginal_topk(torch.zeros(2, 5, device=DEVICE), 6)
    with pytest.raises(ValueError, match="cap"):
        marginal_topk(torch.zeros(2, 50, device=DEVICE), 20, cap=16)
