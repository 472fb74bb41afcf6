"""Tree attention and its visibility bitmasks against the dense-mask SDPA reference."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.host import cdiv
from ddtree_kernels.tree_attention import (
    TAIL_LAYOUTS,
    AttentionConfig,
    _kv_read_cost,
    _Launch,
    _plan,
    ancestors_reference,
    tail_layouts,
    tree_attention,
    tree_attention_reference,
    tree_visibility,
)
from ddtree_runtime.backend import TorchBackend
from tests.kernels.trees import DEVICE, make_parents

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _unpack(bits: torch.Tensor, n: int) -> torch.Tensor:
    j = torch.arange(n)
    return ((bits.cpu()[:, j // 32] >> (j % 32)) & 1).bool()


@pytest.mark.parametrize(
    ("shape", "n"),
    [("chain", 1), ("chain", 70), ("star", 33), ("bushy", 64), ("deep", 97), ("random", 1024)],
)
def test_visibility_bitmasks_match_ancestors(shape: str, n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    parents = torch.tensor(make_parents(shape, n, gen), device=DEVICE)
    depth = ancestors_reference(parents).sum(1) - 1
    vis = tree_visibility(parents, depth)
    assert vis.bits.shape == (n, (n + 31) // 32)
    assert torch.equal(_unpack(vis.bits, n), ancestors_reference(parents).cpu())


def _case(hq, hkv, n, ctx, d, dtype, shape, seed, spare=3):
    gen = torch.Generator().manual_seed(seed)
    parents = torch.tensor(make_parents(shape, n, gen), device=DEVICE)
    q = torch.randn(hq, n, d, generator=gen).to(DEVICE, dtype)
    k = torch.randn(hkv, ctx + n + spare, d, generator=gen).to(DEVICE, dtype)
    v = torch.randn(hkv, ctx + n + spare, d, generator=gen).to(DEVICE, dtype)
    return parents, q, k, v


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any()
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize(
    ("hq", "hkv", "n", "ctx", "d", "dtype", "shape", "config"),
    [
        (4, 2, 7, 37, 32, torch.float32, "random", None),
        (4, 1, 1, 100, 16, torch.float32, "chain", None),  # decode: tree of one node
        (2, 2, 33, 0, 24, torch.float32, "bushy", AttentionConfig(16, 16, 4, 1, 1)),  # odd head dim
        (8, 2, 20, 70, 32, torch.bfloat16, "deep", AttentionConfig(16, 16, 4, 1, 3)),
        (4, 4, 17, 65, 64, torch.float16, "star", AttentionConfig(32, 32, 4, 1, 2)),
        (6, 3, 40, 129, 16, torch.bfloat16, "random", None),
        (1, 1, 1024, 5, 16, torch.float32, "random", None),  # B = 1024 with tiny heads
    ],
)
def test_tree_attention_matches_reference(hq, hkv, n, ctx, d, dtype, shape, config) -> None:
    parents, q, k, v = _case(hq, hkv, n, ctx, d, dtype, shape, seed=n * 31 + ctx)
    depth = ancestors_reference(parents).sum(1) - 1
    out = tree_attention(q, k, v, ctx, tree_visibility(parents, depth), d**-0.5, config)
    ref = tree_attention_reference(q, k, v, ctx, parents, d**-0.5)
    assert out.dtype == dtype and out.shape == q.shape
    assert _rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize(
    ("n", "ctx", "dtype", "config"),
    [
        (1, 300, torch.float32, AttentionConfig(16, 32, 4, 1, None)),  # decode split over the context
        (45, 19, torch.float32, None),  # causal prefill chunk
        (16, 64, torch.bfloat16, AttentionConfig(16, 16, 4, 1, 5)),
    ],
)
def test_causal_chain_when_visibility_is_none(n, ctx, dtype, config) -> None:
    _, q, k, v = _case(4, 2, n, ctx, 32, dtype, "chain", seed=n + ctx)
    out = tree_attention(q, k, v, ctx, None, 0.2, config)
    ref = tree_attention_reference(q, k, v, ctx, None, 0.2)
    assert _rel_err(out, ref) < TOL[dtype]


def test_split_count_does_not_change_the_result() -> None:
    """20 splits: the merge combines them 16 at a time, then the rest."""
    parents, q, k, v = _case(4, 2, 12, 400, 32, torch.float32, "random", seed=5)
    vis = tree_visibility(parents, ancestors_reference(parents).sum(1) - 1)
    outs = [tree_attention(q, k, v, 400, vis, 0.3, AttentionConfig(16, 16, 4, 1, s)) for s in (1, 2, 7, 20)]
    assert all(torch.allclose(outs[0], out, atol=1e-5) for out in outs[1:])


def test_rejects_bad_shapes() -> None:
    q = torch.randn(3, 4, 16, device=DEVICE)
    k = torch.randn(2, 10, 16, device=DEVICE)
    with pytest.raises(RuntimeError, match="Hq % Hkv"):
        tree_attention(q, k, k, 2, None, 1.0)
    with pytest.raises(RuntimeError, match="does not fit"):
        tree_attention(torch.randn(2, 4, 16, device=DEVICE), k, k, 8, None, 1.0)


def test_rejects_caches_tma_cannot_read() -> None:
    q = torch.randn(2, 3, 16, device=DEVICE)
    k = torch.randn(2, 16, 10, device=DEVICE).transpose(1, 2)  # [2, 10, 16] with a non-unit last stride
    with pytest.raises(RuntimeError, match="TMA"):
        tree_attention(q, k, k, 2, None, 1.0)


@pytest.mark.parametrize(
    ("hkv", "main_splits", "shape", "ctx", "dtype"),
    [
        (1, 1, "random", 1100, torch.bfloat16),  # only the tail launch splits (2 ways)
        (2, 3, "deep", 75, torch.bfloat16),  # only the main launch splits
        (2, None, "star", 75, torch.float32),
    ],
)
def test_every_tail_layout_gives_the_same_attention(hkv, main_splits, shape, ctx, dtype) -> None:
    """37 nodes at GQA 4: 148 packed rows are four 32-row tiles and a 4-row tail, whether the tail
    gets a whole tile (plain) or its own launch of 16-row tiles (separate)."""
    parents, q, k, v = _case(4 * hkv, hkv, 37, ctx, 32, dtype, shape, seed=37 + (main_splits or 0))
    vis = tree_visibility(parents, ancestors_reference(parents).sum(1) - 1)
    ref = tree_attention_reference(q, k, v, ctx, parents, 0.25)
    for tail in TAIL_LAYOUTS:
        out = tree_attention(q, k, v, ctx, vis, 0.25, AttentionConfig(32, 16, 4, 1, main_splits, tail))
        assert _rel_err(out, ref) < TOL[dtype]


def test_the_planner_prices_the_tail_launch_kv_reread() -> None:
    """Qwen3-8B on 132 SMs, as measured on the H200 (``benchmarks/kernels_bench.py --tail``): a
    separate tail launch reads the KV range again (134 MB at 32K) and was slower than a plain
    third tile for 17 and 65 nodes at 4K, 16K and 32K, faster for 257 nodes; 1025 nodes and a tree
    without a tail launch once."""
    tail_cfg = AttentionConfig(16, 128, 4, 3)
    for nodes, cfg, pick in (
        (17, AttentionConfig(64, 64, 4, 3), "plain"),
        (65, AttentionConfig(128, 64, 8, 4), "plain"),
        (257, AttentionConfig(128, 64, 8, 4), "separate"),
    ):
        for ctx in (4096, 16384, 32768):
            layouts = tail_layouts(nodes * 4, 4, ctx + nodes, 8, cfg, 132, tail_cfg, 2)
            assert set(layouts) == {"plain", "separate"}
            assert _plan(nodes * 4, 4, ctx + nodes, 8, cfg, 132) == layouts[pick][1], (nodes, ctx)
    read = _kv_read_cost(8, cdiv(32768 + 65, 64), 128, 132, 2)
    separate = tail_layouts(65 * 4, 4, 32768 + 65, 8, cfg, 132, tail_cfg, 2)["separate"][0]
    assert separate > 2 * read
    main, tail = _plan(257 * 4, 4, 32768 + 257, 8, cfg, 132)
    assert (main.rows, main.splits, tail.row0, tail.rows) == (1024, 2, 1024, 4)
    (plain,) = _plan(1025 * 4, 4, 4096 + 1025, 8, cfg, 132)  # 2 full waves either way
    assert plain.rows == 4100
    assert _plan(256 * 4, 4, 4096 + 256, 8, cfg, 132) == (_Launch(0, 1024, cfg, 2),)  # no tail


def test_a_forced_tail_layout_is_obeyed_where_the_shape_allows_it() -> None:
    plan = {
        tail: _plan(257 * 4, 4, 4096 + 257, 8, AttentionConfig(128, 64, 8, 4, None, tail), 132)
        for tail in TAIL_LAYOUTS
    }
    assert [len(launches) for launches in plan.values()] == [1, 2]
    assert plan["plain"][0].rows == 1028
    # a tail the 16-row tail launch cannot take apart from the tile (GQA 6 in 128-row tiles): plain
    assert _plan(65 * 6, 6, 500, 1, AttentionConfig(128, 64, 4, 3, None, "separate"), 132)[0].rows == 390
    with pytest.raises(RuntimeError, match="tail must be one of"):
        AttentionConfig(128, 64, 8, 4, None, "fold")


@pytest.mark.parametrize(("visibility", "splits"), [("tree", 3), ("causal", 1), ("all", 4)])
def test_device_context_length_under_a_static_key_bound(visibility: str, splits: int) -> None:
    """One launch plan (a captured graph's) for every context length up to the bound: the kernel
    reads the length, and the stale rows between it and the bound are never seen."""
    n, bound, d = 9, 120, 32
    parents, q, k, v = _case(4, 2, n, bound, d, torch.float32, "random", seed=11)
    k[:, 60:] = 1e4  # stale rows past every live length below: visible ones would dominate
    vis = tree_visibility(parents, ancestors_reference(parents).sum(1) - 1) if visibility == "tree" else None
    for ctx in (0, 17, 51):
        kk, vv = k.clone(), v.clone()
        kk[:, ctx + n :] = 1e4
        length = torch.tensor(ctx, device=DEVICE)
        out = tree_attention(
            q,
            kk,
            vv,
            length,
            vis,
            d**-0.5,
            AttentionConfig(16, 16, 4, 1, splits),
            key_bound=bound,
            all_visible=visibility == "all",
        )
        if visibility == "all":
            mask = torch.ones(n, ctx + n, dtype=torch.bool, device=DEVICE)
            rep = (
                kk[:, : ctx + n].float().repeat_interleave(2, 0),
                vv[:, : ctx + n].float().repeat_interleave(2, 0),
            )
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.float(), *rep, attn_mask=mask, scale=d**-0.5
            )
        else:
            ref = tree_attention_reference(q, kk, vv, ctx, parents if visibility == "tree" else None, d**-0.5)
        assert _rel_err(out, ref) < TOL[torch.float32]


def test_a_device_length_needs_a_key_bound() -> None:
    _, q, k, v = _case(2, 1, 3, 10, 16, torch.float32, "chain", seed=1)
    with pytest.raises(RuntimeError, match="key_bound"):
        tree_attention(q, k, v, torch.tensor(10, device=DEVICE), None, 1.0)


@pytest.mark.parametrize(("all_visible", "window", "splits"), [(True, 40, 3), (True, 5, 2), (False, 23, 1)])
def test_a_sliding_window_sees_only_recent_keys(all_visible: bool, window: int, splits: int) -> None:
    """A drafter's sliding layer: keys fewer than `window` positions from the query (both ways in a
    block that sees itself whole), whatever the context length under one static key bound."""
    n, bound, d = 6, 110, 32
    _, q, k, v = _case(4, 2, n, bound, d, torch.float32, "chain", seed=5)
    for ctx in (3, 61, 98):
        out = tree_attention(
            q,
            k,
            v,
            torch.tensor(ctx, device=DEVICE),
            None,
            d**-0.5,
            AttentionConfig(16, 16, 4, 1, splits),
            key_bound=bound,
            all_visible=all_visible,
            window=window,
        )
        want = TorchBackend().attention(q, k, v, ctx, None, d**-0.5, ctx + n, all_visible, window)
        assert _rel_err(out, want) < TOL[torch.float32]
