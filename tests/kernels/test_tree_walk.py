"""Tree walk (greedy and sampled) against the host walk and TorchBackend."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.tree_walk import node_choices, tree_walk, tree_walk_reference, walk_choices
from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.triton_backend import TritonBackend
from tests.kernels.trees import DEVICE, make_tree


def _logits_following(tokens, parents, vocab, follow, gen) -> torch.Tensor:
    """Target logits whose argmax at a node is one of its children's tokens with prob. `follow`."""
    n = tokens.shape[0]
    logits = torch.randn(n, vocab, generator=gen).to(DEVICE)
    children: dict[int, list[int]] = {}
    for i in range(1, n):
        children.setdefault(int(parents[i]), []).append(i)
    for node in range(n):
        kids = children.get(node, [])
        if kids and float(torch.rand(1, generator=gen)) < follow:
            pick = kids[int(torch.randint(0, len(kids), (1,), generator=gen))]
            logits[node, int(tokens[pick])] = 10.0
    return logits


@pytest.mark.parametrize(
    ("shape", "n", "vocab"),
    [
        ("chain", 1, 9),
        ("chain", 40, 7),
        ("star", 50, 60),
        ("bushy", 200, 300),
        ("deep", 90, 11),
        ("random", 1024, 1100),
    ],
)
def test_greedy_walk_matches_reference_and_torch_backend(shape: str, n: int, vocab: int) -> None:
    gen = torch.Generator().manual_seed(n)
    tokens, parents, _ = make_tree(shape, n, vocab, gen)
    logits = _logits_following(tokens, parents, vocab, 0.9, gen)
    path, path_len, bonus = tree_walk(tokens, parents, logits, 0.0, None)
    want_path, want_bonus = tree_walk_reference(tokens, parents, logits.argmax(-1))
    assert path.shape == (n,) and path.dtype == torch.int64
    assert int(path_len) == len(want_path) and int(bonus) == want_bonus
    assert path.tolist() == want_path + [-1] * (n - len(want_path))
    t_path, t_len, t_bonus = TorchBackend().tree_walk(tokens, parents, logits, 0.0, None)
    assert torch.equal(path, t_path) and int(t_len) == int(path_len) and int(t_bonus) == int(bonus)


def test_greedy_walks_of_padded_trees_match_torch_backend() -> None:
    """A batched round's greedy slots: trees of different sizes (a one-node `ar` tree too) padded
    with token -1 under the root, walked in one call."""
    gen = torch.Generator().manual_seed(4)
    vocab, sizes = 30, [17, 1, 40, 9]
    n = max(sizes)
    tokens = torch.full((len(sizes), n), -1, dtype=torch.int64, device=DEVICE)
    parents = torch.zeros_like(tokens)
    logits = torch.zeros(len(sizes), n, vocab, device=DEVICE)
    for i, (shape, m) in enumerate(zip(["random", "chain", "bushy", "deep"], sizes, strict=True)):
        t, p, _ = make_tree(shape, m, vocab, gen)
        tokens[i, :m], parents[i, :m], logits[i, :m] = t, p, _logits_following(t, p, vocab, 0.9, gen)
    got = TritonBackend.tree_walk_parts(tokens, parents, logits)
    want = TorchBackend().tree_walk_parts(tokens, parents, logits)
    assert got[0].shape == (len(sizes), n) and got[1].shape == got[2].shape == (len(sizes),)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert int(got[1].max()) > 2  # the walks go deep: the drafts are followed


def test_argmax_ties_pick_the_first_index_like_torch() -> None:
    logits = torch.zeros(3, 5000, device=DEVICE)
    logits[0, [7, 4100]] = 1.0
    logits[1, [3000, 4999]] = 2.0
    assert node_choices(logits, 0.0).tolist() == [7, 3000, 0]


def test_sampling_draws_from_softmax_over_temperature() -> None:
    probs_logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, 0.5]], device=DEVICE)
    rows = 1200
    logits = probs_logits.expand(rows, -1).contiguous()
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(node_choices(logits, 0.7, gen), minlength=5).double().cpu()
    want = torch.softmax(probs_logits[0].double().cpu() / 0.7, dim=0) * rows
    chi2 = (((counts - want) ** 2) / want).sum().item()
    assert chi2 < 20.0  # 4 degrees of freedom: p ~ 5e-4
    again = node_choices(logits, 0.7, torch.Generator().manual_seed(0))
    assert torch.equal(again, node_choices(logits, 0.7, torch.Generator().manual_seed(0)))


def test_sampled_walk_follows_its_own_choices() -> None:
    gen = torch.Generator().manual_seed(1)
    tokens, parents, _ = make_tree("bushy", 64, 40, gen)
    logits = _logits_following(tokens, parents, 40, 1.0, gen) / 4
    choice = node_choices(logits, 1.3, torch.Generator().manual_seed(9))
    path, path_len, bonus = walk_choices(tokens, parents, choice)
    want_path, want_bonus = tree_walk_reference(tokens, parents, choice)
    assert path.tolist()[: int(path_len)] == want_path and int(bonus) == want_bonus
    p2, l2, b2 = tree_walk(tokens, parents, logits, 1.3, torch.Generator().manual_seed(9))
    assert torch.equal(p2, path) and int(l2) == int(path_len) and int(b2) == int(bonus)
