"""TritonBackend's batched attention (`tree_attention_parts`: several sequences' padded rows in one
launch) against TorchBackend's, with each sequence's own slot, rows, context length and visibility."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.tree_attention import AttentionConfig, ancestors_reference, tree_attention_parts
from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.triton_backend import TritonBackend
from tests.kernels.trees import DEVICE, make_parents

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
SLOTS, LAYERS, S_MAX = 5, 2, 96


def _caches(hkv: int, d: int, dtype: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 1 of [S, L, Hkv, S_max, D] caches, as a model's `k_caches[:, i]` (slots strided by L)."""
    k, v = (torch.randn(SLOTS, LAYERS, hkv, S_MAX, d, generator=gen).to(DEVICE, dtype) for _ in range(2))
    return k[:, 1], v[:, 1]


def _trees(shapes: list[str | None], rows: list[int], gen: torch.Generator):
    """Each sequence's visibility for both backends: a tree of `shape` (random parents) or causal."""
    triton_be, torch_be = TritonBackend(), TorchBackend()
    out = []
    for shape, n in zip(shapes, rows, strict=True):
        if shape is None:
            out.append((None, None))
            continue
        parents = torch.tensor(make_parents(shape, n, gen), device=DEVICE)
        depth = ancestors_reference(parents).sum(1) - 1
        out.append((triton_be.tree_visibility(parents, depth), torch_be.tree_visibility(parents, depth)))
    return [t for t, _ in out], [d for _, d in out]


def _compare(q, k, v, slots, rows, ctxs, keys, shapes, all_visible, window, dtype, gen, config=None):
    trees, dense = _trees(shapes, rows, gen)
    scale = q.shape[-1] ** -0.5
    parts = TritonBackend.parts_mask(rows, ctxs, keys, trees, all_visible, window, DEVICE)
    if config is None:
        out = TritonBackend.attention_parts(q, k, v, slots, parts, scale)
    else:
        out = tree_attention_parts(q, k, v, slots, parts, scale, config)
    mask = TorchBackend.parts_mask(rows, ctxs, keys, dense, all_visible, window, DEVICE)
    want = TorchBackend.attention_parts(q, k, v, slots, mask, scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    for p, n in enumerate(rows):  # padding rows are don't-care
        got, ref = out[p, :, :n].float(), want[p, :, :n].float()
        assert not got.isnan().any()
        assert ((got - ref).norm() / ref.norm()).item() < TOL[dtype], (p, n)


@pytest.mark.parametrize(
    ("hq", "hkv", "dtype", "splits"),
    [(4, 2, torch.float32, None), (4, 1, torch.bfloat16, 3), (2, 2, torch.float32, 1)],
)
def test_a_verify_pass_of_trees_and_chains_matches_torch(hq, hkv, dtype, splits) -> None:
    """A batched verify pass: ddtree trees (random parents), a dflash chain and an `ar` root, each
    with its own rows and context, in slots out of order; stale rows up to a larger key bound."""
    gen = torch.Generator().manual_seed(hq * 10 + hkv)
    d, rows, ctxs = 32, [9, 1, 5, 12], [37, 5, 60, 0]
    shapes = ["random", None, None, "bushy"]
    k, v = _caches(hkv, d, dtype, gen)
    q = torch.randn(len(rows), hq, max(rows), d, generator=gen).to(DEVICE, dtype)
    slots = torch.tensor([3, 0, 4, 1], device=DEVICE)
    config = None if splits is None else AttentionConfig(16, 16, 4, 1, splits)
    _compare(q, k, v, slots, rows, ctxs, 80, shapes, False, None, dtype, gen, config)


@pytest.mark.parametrize(("rows", "window"), [([4, 4, 4], None), ([4, 4, 4], 7), ([4, 2, 3], 3)])
def test_drafter_blocks_with_a_sliding_window_match_torch(rows, window) -> None:
    """The drafter's batched pass: blocks that see themselves whole (and, in a sliding layer, only
    keys fewer than `window` positions away), consecutive slots read as a slice; a shorter block
    sees only its own rows."""
    gen = torch.Generator().manual_seed(7)
    hq, hkv, d, ctxs = 4, 2, 16, [3, 50, 21]
    k, v = _caches(hkv, d, torch.float32, gen)
    # q as `attend_slots` pads it: an [Hq, P, N, D] buffer seen as [P, Hq, N, D]
    q = torch.randn(hq, len(rows), 4, d, generator=gen).to(DEVICE).transpose(0, 1)
    for slots in (slice(1, 4), torch.tensor([1, 2, 3], device=DEVICE)):
        _compare(q, k, v, slots, rows, ctxs, 60, [None] * 3, True, window, torch.float32, gen)


def test_causal_chains_of_different_lengths_match_torch() -> None:
    """Prefill chunks and `ar` steps together: causal rows only, split over the context."""
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d, rows, ctxs = 4, 2, 32, [20, 1, 6], [0, 70, 33]
    k, v = _caches(hkv, d, torch.float32, gen)
    q = torch.randn(len(rows), hq, max(rows), d, generator=gen).to(DEVICE)
    slots = torch.tensor([2, 4, 0], device=DEVICE)
    config = AttentionConfig(16, 16, 4, 1, 4)
    _compare(q, k, v, slots, rows, ctxs, 71, [None] * 3, False, None, torch.float32, gen, config)


def test_rejects_a_visibility_of_other_rows() -> None:
    gen = torch.Generator().manual_seed(1)
    trees, _ = _trees(["random"], [6], gen)
    with pytest.raises(RuntimeError, match="describes 6 nodes, not its 5 rows"):
        TritonBackend.parts_mask([5], [0], 5, trees, False, None, DEVICE)
    parts = TritonBackend.parts_mask([5, 3], [0, 0], 5, [None, None], False, None, DEVICE)
    k, v = _caches(1, 16, torch.float32, gen)
    with pytest.raises(RuntimeError, match="describe 2 sequences"):
        TritonBackend.attention_parts(torch.randn(3, 2, 5, 16, device=DEVICE), k, v, slice(0, 3), parts, 1.0)
