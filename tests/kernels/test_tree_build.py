"""Device tree build against a brute-force top-B and against TorchBackend's best-first heap.

Shapes cover each path of the single-program level loop: levels pruned to a few survivors (peaked,
deep chains), every level pruned (flat), levels past one sorted chunk (V < budget), B = 1, big V.
"""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.tree_build import build_tree, build_tree_reference
from ddtree_runtime.backend import TorchBackend
from tests.kernels.trees import DEVICE


def _node_scores(tokens, parents, depth, logits) -> list[float]:
    """Each node's prefix score recomputed from the returned tree, checking its structure."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    scores = [0.0]
    seen = set()
    for i in range(1, tokens.shape[0]):
        p = int(parents[i])
        assert 0 <= p < i and int(depth[i]) == int(depth[p]) + 1
        scores.append(scores[p] + lp[int(depth[i]) - 1, int(tokens[i])].item())
        assert (p, int(tokens[i])) not in seen  # distinct prefixes
        seen.add((p, int(tokens[i])))
    return scores


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force_top_b(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    depth_max = 1 + seed % 4
    vocab = 2 + seed % 5
    capacity = sum(vocab**d for d in range(1, depth_max + 1))
    budget = 1 + int(torch.randint(0, min(capacity, 90), (1,), generator=gen))
    logits = torch.randn(depth_max, vocab, generator=gen) * (0.5 + seed)
    tokens, parents, depth = build_tree(logits.to(DEVICE), budget, torch.tensor(11, device=DEVICE))
    assert tokens.shape == parents.shape == depth.shape == (budget + 1,)
    assert int(tokens[0]) == 11 and int(parents[0]) == -1 and int(depth[0]) == 0
    got = sorted(_node_scores(tokens, parents, depth, logits)[1:])
    _, _, want = build_tree_reference(logits, budget, 11)
    assert got == pytest.approx(sorted(want[1:]), abs=1e-5)


def test_ties_keep_the_score_multiset_and_prefix_closure() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(0, 2, (4, 5), generator=gen).float() * 3  # many equal scores
    for budget in (1, 7, 40, 155):
        tokens, parents, depth = build_tree(logits.to(DEVICE), budget, torch.tensor(0, device=DEVICE))
        got = sorted(_node_scores(tokens, parents, depth, logits)[1:])
        _, _, want = build_tree_reference(logits, budget, 0)
        assert got == pytest.approx(sorted(want[1:]), abs=1e-5)


@pytest.mark.parametrize(("depth_max", "vocab", "budget"), [(8, 64, 1024), (15, 300, 512), (3, 1000, 1)])
def test_large_budgets_match_the_heap(depth_max: int, vocab: int, budget: int) -> None:
    gen = torch.Generator().manual_seed(budget)
    logits = torch.randn(depth_max, vocab, generator=gen) * 3
    tokens, parents, depth = build_tree(logits.to(DEVICE), budget, torch.tensor(5, device=DEVICE))
    h_tokens, h_parents, h_depth = TorchBackend().build_tree(logits, budget, torch.tensor(5))
    got = sorted(_node_scores(tokens, parents, depth, logits))
    want = sorted(_node_scores(h_tokens, h_parents, h_depth, logits))
    assert got == pytest.approx(want, abs=1e-4)


def _same_as_heap(logits: torch.Tensor, budget: int) -> torch.Tensor:
    """Build on the device, compare the score multiset with the heap's; returns depth (level order)."""
    tokens, parents, depth = build_tree(logits.to(DEVICE), budget, torch.tensor(5, device=DEVICE))
    h_tokens, h_parents, h_depth = TorchBackend().build_tree(logits, budget, torch.tensor(5))
    got = sorted(_node_scores(tokens.cpu(), parents.cpu(), depth.cpu(), logits))
    want = sorted(_node_scores(h_tokens, h_parents, h_depth, logits))
    assert got == pytest.approx(want, abs=1e-4)
    depth = depth.cpu()
    assert (depth[1:] >= depth[:-1]).all()  # level order: all depth-1 nodes, then depth-2, ...
    return depth


def test_peaked_drafts_prune_to_deep_chains() -> None:
    gen = torch.Generator().manual_seed(7)
    depth_max, vocab = 15, 1000
    logits = torch.randn(depth_max, vocab, generator=gen)
    best = torch.randint(0, vocab, (depth_max,), generator=gen)
    logits[torch.arange(depth_max), best] += torch.linspace(12, 9, depth_max)
    assert int(_same_as_heap(logits, 128).max()) == depth_max


def test_flat_drafts_stop_after_the_first_level() -> None:
    logits = torch.randn(6, 5000, generator=torch.Generator().manual_seed(1)) * 0.1
    assert int(_same_as_heap(logits, 128).max()) == 1


@pytest.mark.parametrize(("depth_max", "vocab", "budget"), [(3, 50, 1), (5, 3, 200), (3, 20000, 64)])
def test_edge_shapes_match_the_heap(depth_max: int, vocab: int, budget: int) -> None:
    # B = 1; V < budget (k = V, the first levels are not pruned); a big vocabulary
    gen = torch.Generator().manual_seed(vocab)
    _same_as_heap(torch.randn(depth_max, vocab, generator=gen) * 2, budget)


def test_a_certain_position_ties_children_with_their_parents() -> None:
    # log p = 0 exactly at position 2: every depth-2 child of the best token scores as its parent
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 6, generator=gen) * 2
    logits[1] = torch.tensor([100.0, 0, 0, 0, 0, 0])
    for budget in (2, 5, 40):
        tokens, parents, depth = build_tree(logits.to(DEVICE), budget, torch.tensor(0, device=DEVICE))
        got = sorted(_node_scores(tokens.cpu(), parents.cpu(), depth.cpu(), logits)[1:])
        _, _, want = build_tree_reference(logits, budget, 0)
        assert got == pytest.approx(sorted(want[1:]), abs=1e-5)


def test_rejects_a_budget_beyond_the_prefix_count() -> None:
    with pytest.raises(ValueError, match=r"outside 1\.\.6"):
        build_tree(torch.zeros(2, 2, device=DEVICE), 7, torch.tensor(0, device=DEVICE))
