"""TorchBackend against brute force and naive loops: tree build, visibility, walk, compaction, attention."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from ddtree_runtime.backend import TorchBackend

B = TorchBackend()


def random_tree(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [n] with parents[i] < i, and depth [n]."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    depth = [0]
    for i in range(1, n):
        depth.append(depth[parents[i]] + 1)
    return torch.tensor(parents), torch.tensor(depth)


def ancestors(parents: list[int], i: int) -> set[int]:
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


@pytest.mark.parametrize(("vocab", "depth_max"), [(2, 1), (3, 3), (4, 2), (5, 4), (7, 3)])
def test_build_tree_is_the_top_b_prefixes(vocab: int, depth_max: int) -> None:
    gen = torch.Generator().manual_seed(vocab * 10 + depth_max)
    logits = torch.randn(depth_max, vocab, generator=gen) * 2
    logp = torch.log_softmax(logits, -1).double()
    every = sorted(
        (
            float(sum(logp[d, t] for d, t in enumerate(prefix)))
            for length in range(1, depth_max + 1)
            for prefix in itertools.product(range(vocab), repeat=length)
        ),
        reverse=True,
    )
    for budget in sorted({b for b in (1, 2, 3, len(every) // 2, len(every)) if 1 <= b <= len(every)}):
        tokens, parents, depth = B.build_tree(logits, budget, torch.tensor(9))
        assert tokens.shape == parents.shape == depth.shape == (budget + 1,)
        assert (int(tokens[0]), int(parents[0]), int(depth[0])) == (9, -1, 0)
        scores, seen = [0.0], set()
        for i in range(1, budget + 1):
            p = int(parents[i])
            assert 0 <= p < i and int(depth[i]) == int(depth[p]) + 1 <= depth_max
            key = (p, int(tokens[i]))
            assert key not in seen  # siblings carry distinct tokens
            seen.add(key)
            scores.append(scores[p] + float(logp[int(depth[i]) - 1, int(tokens[i])]))
        assert sorted(scores[1:], reverse=True) == pytest.approx(every[:budget], abs=1e-5)


def test_build_trees_is_each_drafts_build_tree() -> None:
    gen = torch.Generator().manual_seed(3)
    drafts, roots = torch.randn(4, 3, 11, generator=gen), torch.tensor([5, 0, 9, 2])
    tokens, parents, depth = B.build_trees(drafts, 6, roots)
    for i in range(4):
        want = B.build_tree(drafts[i], 6, roots[i])
        for got, w in zip((tokens[i], parents[i], depth[i]), want, strict=True):
            assert got.tolist() == w.tolist()


def test_build_tree_refuses_a_budget_larger_than_the_tree() -> None:
    with pytest.raises(ValueError, match=r"outside 1\.\.6"):
        B.build_tree(torch.zeros(2, 2), 7, torch.tensor(0))


@pytest.mark.parametrize("n", [1, 2, 5, 17, 64])
def test_visibility_is_ancestor_or_self(n: int) -> None:
    parents, depth = random_tree(n, torch.Generator().manual_seed(n))
    vis = B.tree_visibility(parents, depth)
    plist = parents.tolist()
    for i in range(n):
        assert set(torch.nonzero(vis[i]).flatten().tolist()) == ancestors(plist, i)


def sequential_walk(tokens: list[int], parents: list[int], choice: list[int]) -> tuple[list[int], int]:
    node, path = 0, [0]
    while True:
        child = next(
            (j for j in range(len(tokens)) if parents[j] == node and tokens[j] == choice[node]), None
        )
        if child is None:
            return path, choice[node]
        node = child
        path.append(node)


@pytest.mark.parametrize("seed", range(8))
def test_greedy_walk_matches_the_sequential_walk(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    vocab = 4
    logits = torch.randn(3, vocab, generator=gen)
    tokens, parents, _ = B.build_tree(logits, 12, torch.tensor(1))
    target = torch.randn(13, vocab, generator=gen) * 3
    path, path_len, bonus = B.tree_walk(tokens, parents, target, 0.0, None)
    want, want_bonus = sequential_walk(tokens.tolist(), parents.tolist(), target.argmax(-1).tolist())
    assert path.shape == (13,)
    assert path[: int(path_len)].tolist() == want and int(bonus) == want_bonus
    assert (path[int(path_len) :] == -1).all()


def test_walking_padded_trees_together_is_walking_each() -> None:
    """`tree_walk_parts` over trees of different sizes, padded, gives each tree its own greedy walk."""
    gen = torch.Generator().manual_seed(3)
    vocab, trees = 4, []
    for budget in (12, 1, 6, 9):
        tokens, parents, _ = B.build_tree(torch.randn(3, vocab, generator=gen), budget, torch.tensor(1))
        target = torch.randn(budget + 1, vocab, generator=gen) * 3
        target[0, tokens[1]] += 10.0  # every walk takes the first draft at least
        trees.append((tokens, parents, target))
    n = max(t.shape[0] for t, _, _ in trees)
    tokens = torch.full((len(trees), n), -1)
    parents = torch.zeros(len(trees), n, dtype=torch.int64)
    logits = torch.zeros(len(trees), n, vocab)
    for i, (t, par, lg) in enumerate(trees):
        tokens[i, : t.shape[0]], parents[i, : t.shape[0]], logits[i, : t.shape[0]] = t, par, lg
    path, path_len, bonus = B.tree_walk_parts(tokens, parents, logits)
    for i, (t, par, lg) in enumerate(trees):
        want_path, want_len, want_bonus = B.tree_walk(t, par, lg, 0.0, None)
        assert int(want_len) >= 2
        assert torch.equal(path[i, : t.shape[0]], want_path)
        assert int(path_len[i]) == int(want_len) and int(bonus[i]) == int(want_bonus)


def test_sampled_walk_follows_tree_edges() -> None:
    gen = torch.Generator().manual_seed(0)
    tokens, parents, _ = B.build_tree(torch.randn(3, 3, generator=gen), 10, torch.tensor(0))
    lengths = set()
    for _ in range(200):
        path, path_len, bonus = B.tree_walk(tokens, parents, torch.zeros(11, 3), 1.0, gen)
        p = path[: int(path_len)].tolist()
        assert p[0] == 0 and all(parents[b] == a for a, b in itertools.pairwise(p))
        assert 0 <= int(bonus) < 3
        lengths.add(len(p))
    assert max(lengths) >= 3


def test_chain_walk() -> None:
    tokens = torch.tensor([5, 1, 2, 3])
    target = torch.full((4, 8), -1.0)
    target[0, 1] = target[1, 2] = target[2, 7] = target[3, 0] = 1.0
    path, path_len, bonus = B.tree_walk(tokens, torch.arange(4) - 1, target, 0.0, None)
    assert path.tolist() == [0, 1, 2, -1] and int(path_len) == 3 and int(bonus) == 7


def test_compact_moves_accepted_rows_in_every_layer() -> None:
    k = torch.randn(3, 2, 20, 4)
    v = torch.randn(3, 2, 20, 4)
    k0, v0 = k.clone(), v.clone()
    path = torch.tensor([0, 2, 5, 9, -1, -1, -1, -1, -1, -1])
    B.compact(k, v, 6, path, torch.tensor(4))
    for a, node in enumerate([0, 2, 5, 9]):
        assert torch.equal(k[:, :, 6 + a], k0[:, :, 6 + node]) and torch.equal(
            v[:, :, 6 + a], v0[:, :, 6 + node]
        )
    assert torch.equal(k[:, :, :6], k0[:, :, :6])
    assert torch.equal(k[:, :, 10:], k0[:, :, 10:])


def naive_attention(q, k, v, context_len, allowed, scale):
    hq, n, _ = q.shape
    rep = hq // k.shape[0]
    out = torch.zeros_like(q, dtype=torch.float64)
    for h in range(hq):
        for i in range(n):
            rows = list(range(context_len)) + [context_len + j for j in range(n) if allowed(i, j)]
            kk, vv = k[h // rep, rows].double(), v[h // rep, rows].double()
            w = torch.softmax(kk @ q[h, i].double() * scale, -1)
            out[h, i] = w @ vv
    return out


@pytest.mark.parametrize(("hq", "hkv", "context_len", "n"), [(4, 2, 0, 5), (4, 4, 7, 1), (6, 2, 11, 9)])
def test_attention_sees_context_and_ancestors(hq: int, hkv: int, context_len: int, n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(hq, n, 8, generator=gen)
    k = torch.randn(hkv, 32, 8, generator=gen)
    v = torch.randn(hkv, 32, 8, generator=gen)
    parents, depth = random_tree(n, gen)
    scale = 8**-0.5
    tree = B.attention(q, k, v, context_len, B.tree_visibility(parents, depth), scale)
    plist = parents.tolist()
    want = naive_attention(q, k, v, context_len, lambda i, j: j in ancestors(plist, i), scale)
    torch.testing.assert_close(tree.double(), want, atol=1e-5, rtol=1e-5)
    causal = B.attention(q, k, v, context_len, None, scale)
    want = naive_attention(q, k, v, context_len, lambda i, j: j <= i, scale)
    torch.testing.assert_close(causal.double(), want, atol=1e-5, rtol=1e-5)
    assert math.isfinite(float(tree.sum()))


@pytest.mark.parametrize(
    ("slots", "as_slice"),
    [([2, 0, 3], False), ([1, 2, 3], True), ([1, 2, 3], False)],  # a gather; a view; a CPU forest's view
)
@pytest.mark.parametrize(("all_visible", "window"), [(False, None), (True, 4)])
@pytest.mark.parametrize("forest", [False, True])  # trees of one size, device context lengths
def test_attention_parts_is_each_sequences_attention(
    slots: list[int], as_slice: bool, all_visible: bool, window: int | None, forest: bool
) -> None:
    """One padded call over several sequences gives each its own `attention`: other slots' rows,
    stale rows past its keys and the padding rows change nothing."""
    gen = torch.Generator().manual_seed(len(slots) + int(all_visible))
    hq, hkv, d = 4, 2, 8
    k_caches = torch.randn(5, hkv, 40, d, generator=gen)  # every row finite, most of them stale
    v_caches = torch.randn(5, hkv, 40, d, generator=gen)
    rows, ctxs = ([4, 4, 4], [7, 12, 0]) if forest else ([5, 1, 3], [7, 12, 0])
    vis = [
        B.tree_visibility(*random_tree(rows[0], gen)),
        B.tree_visibility(*random_tree(rows[1], gen)) if forest else None,
        None if all_visible and not forest else B.tree_visibility(*random_tree(rows[2], gen)),
    ]
    bounds = [
        c + r + extra for c, r, extra in zip(ctxs, rows, [0, 2, 5], strict=True)
    ]  # some keys past the rows
    q = torch.randn(len(slots), hq, max(rows), d, generator=gen)
    lens = torch.tensor(ctxs) if forest else ctxs
    mask = B.parts_mask(rows, lens, max(bounds), vis, all_visible, window, q.device)
    index = slice(slots[0], slots[-1] + 1) if as_slice else torch.tensor(slots)
    got = B.attention_parts(q, k_caches, v_caches, index, mask, d**-0.5)
    for p, slot in enumerate(slots):
        n = rows[p]
        want = B.attention(
            q[p, :, :n],
            k_caches[slot],
            v_caches[slot],
            ctxs[p],
            vis[p],
            d**-0.5,
            bounds[p],
            all_visible,
            window,
        )
        torch.testing.assert_close(got[p, :, :n], want, atol=1e-6, rtol=1e-6)
