"""KV compaction against a row-by-row copy, on real root paths of random trees."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.kv_compact import compact, compact_forest, compact_reference
from tests.kernels.trees import DEVICE, make_parents


def _root_path(parents: list[int], leaf: int) -> list[int]:
    path = [leaf]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@pytest.mark.parametrize(
    ("layers", "hkv", "d", "n", "ctx", "shape", "dtype"),
    [
        (3, 2, 16, 30, 7, "random", torch.float32),
        (2, 1, 24, 60, 0, "deep", torch.bfloat16),  # odd head dim, path longer than one chunk
        (4, 3, 32, 1, 5, "chain", torch.float16),  # nothing to move
        (1, 2, 16, 40, 3, "chain", torch.float32),  # identity moves are skipped
    ],
)
def test_compact_matches_reference(layers, hkv, d, n, ctx, shape, dtype) -> None:
    gen = torch.Generator().manual_seed(n + ctx)
    parents = make_parents(shape, n, gen)
    leaf = int(torch.randint(0, n, (1,), generator=gen))
    path = _root_path(parents, leaf)
    k = torch.randn(layers, hkv, ctx + n + 2, d, generator=gen).to(DEVICE, dtype)
    v = torch.randn(layers, hkv, ctx + n + 2, d, generator=gen).to(DEVICE, dtype)
    k_ref, v_ref = k.clone(), v.clone()
    padded = torch.tensor(path + [-1] * (n - len(path)), device=DEVICE)
    compact(k, v, ctx, padded, torch.tensor(len(path), device=DEVICE))
    compact_reference(k_ref, v_ref, ctx, path)
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def test_compact_forest_is_each_slots_compact() -> None:
    """P sequences in one launch (slots out of order, each its own context length, tree and path,
    from the root alone to a path longer than a chunk) move exactly the rows each slot's own
    `compact` moves; padding sequences repeating a scratch slot touch no other slot."""
    gen = torch.Generator().manual_seed(4)
    n, slots, ctxs, scratch = 40, [3, 0, 2], [5, 0, 11], 4
    k = torch.randn(5, 2, 3, 11 + n + 2, 16, generator=gen).to(DEVICE)  # [S, L, Hkv, S_max, D]
    v = torch.randn_like(k)
    paths, lens = [], []
    for shape, leaf in (("deep", n - 1), ("random", None), ("chain", 0)):
        parents = make_parents(shape, n, gen)
        path = _root_path(parents, int(torch.randint(0, n, (1,), generator=gen)) if leaf is None else leaf)
        paths.append(path + [-1] * (n - len(path)))
        lens.append(len(path))
    assert lens[0] > 16 and lens[2] == 1
    before, k_ref, v_ref = k.clone(), k.clone(), v.clone()
    for slot, ctx, path, m in zip(slots, ctxs, paths, lens, strict=True):
        compact(
            k_ref[slot], v_ref[slot], ctx, torch.tensor(path, device=DEVICE), torch.tensor(m, device=DEVICE)
        )
    padding = 2  # two padding sequences at the start of the scratch slot, along the first path
    compact_forest(
        k,
        v,
        torch.tensor([*slots, *[scratch] * padding], device=DEVICE),
        torch.tensor([*ctxs, *[0] * padding], device=DEVICE),
        torch.tensor([*paths, *[paths[0]] * padding], device=DEVICE),
        torch.tensor([*lens, *[lens[0]] * padding], device=DEVICE),
    )
    assert torch.equal(k[:scratch], k_ref[:scratch]) and torch.equal(v[:scratch], v_ref[:scratch])
    assert not torch.equal(k[slots[0]], before[slots[0]]) and torch.equal(k[1], before[1])  # slot 1 is free
