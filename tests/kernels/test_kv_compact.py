"""KV compaction against a row-by-row copy, on real root paths of random trees."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.kv_compact import compact, compact_reference
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
