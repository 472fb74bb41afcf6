"""Tree build on the device: the B most probable prefixes under the product of marginals.

DDTree (Ringel & Romano, arXiv 2604.12989) drafts per-position marginals ``p_d(t)`` for positions
d = 1..D after the root and verifies the B prefixes ``(t_1..t_d)`` with the largest score
``sum_k log p_k(t_k)``. The paper finds them with a best-first heap (B sequential pops, a host
loop); this module finds the same set with a fixed number of device operations and no host sync.

**Why a level-by-level frontier is exact.** Let ``s_d[r]`` be position d's log-probabilities
sorted descending (r = rank; only ranks < min(B, V) can matter). Keep, for every depth d, a
*level*: the B best candidate prefixes of depth d, sorted. The candidates of depth d+1 are the
children ``(rho, r)`` = (level-d entry of rank rho, token rank r) with ``(rho+1)(r+1) <= B``.
A prefix of the true top-B never falls out:
  * its parent is in the top-B (scores only fall along a path), so by induction it is in level d
    at some rank rho;
  * the (rho+1)(r+1) children ``(rho' <= rho, r' <= r)`` all score at least as much, so a top-B
    child has ``(rho+1)(r+1) <= B``, and fewer than B depth-(d+1) candidates beat it.
The answer is then the top-B of the union of the D levels (<= D * B scores), ordered by
(score descending, depth ascending): a parent scores >= its children and is shallower, so it
always comes first, which gives ``parents[i] < i`` and a prefix-closed set. Ties may be broken
differently from the heap, but the multiset of scores is the same. Work per level: one gather of
``sum_rho min(K, B / (rho+1)) ~ B ln B`` candidate scores and one top-B.
"""

from __future__ import annotations

import torch
from torch import Tensor


def candidate_pairs(budget: int, k: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(rho, r) int64 pairs with (rho+1)(r+1) <= budget and r < k: the children worth scoring."""
    rho, rank = [], []
    for parent_rank in range(budget):
        width = min(k, budget // (parent_rank + 1))
        rho.extend([parent_rank] * width)
        rank.extend(range(width))
    return (
        torch.tensor(rho, dtype=torch.int64, device=device),
        torch.tensor(rank, dtype=torch.int64, device=device),
    )


def _check_budget(depth_max: int, vocab: int, budget: int) -> None:
    capacity = sum(vocab**d for d in range(1, depth_max + 1))
    if not 1 <= budget <= capacity:
        raise ValueError(
            f"tree budget {budget} is outside 1..{capacity} (the number of distinct prefixes of depth "
            f"<= {depth_max} over a vocabulary of {vocab}); pick a budget in that range"
        )
    if depth_max > 255:
        raise RuntimeError(f"tree build supports at most 255 draft positions, got {depth_max}")


def _order_key(score: Tensor, depth: Tensor) -> Tensor:
    """int64 key ordering by score descending, then depth ascending (float bits made monotone)."""
    bits = score.contiguous().view(torch.int32).to(torch.int64)
    monotone = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (monotone << 8) | (255 - depth)


def build_tree(
    draft_logits: Tensor,
    budget: int,
    root_token: Tensor,
    pairs: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """tokens, parents, depth ([B+1] int64) of the top-``budget`` prefixes; node 0 is the root.

    draft_logits: [D, V] for positions 1..D after the root. ``pairs``: ``candidate_pairs(budget,
    min(budget, V), device)``, cached by the caller so that no host-to-device copy happens per round.
    """
    depth_max, vocab = draft_logits.shape
    _check_budget(depth_max, vocab, budget)
    device = draft_logits.device
    k = min(budget, vocab)
    rho, rank = pairs if pairs is not None else candidate_pairs(budget, k, device)
    vals, toks = torch.log_softmax(draft_logits.float(), dim=-1).topk(k, dim=-1)  # [D, K], sorted

    level_score = torch.full((depth_max, budget), float("-inf"), device=device)
    level_rank = torch.zeros(depth_max, budget, dtype=torch.int64, device=device)
    level_parent = torch.zeros(depth_max, budget, dtype=torch.int64, device=device)
    level_score[0, :k] = vals[0]
    level_rank[0, :k] = torch.arange(k, device=device)
    for d in range(1, depth_max):
        cand = level_score[d - 1][rho] + vals[d][rank]  # [P]
        top, sel = cand.topk(budget)
        level_score[d] = top
        level_rank[d] = rank[sel]
        level_parent[d] = rho[sel]

    depth_of = torch.arange(depth_max, device=device).repeat_interleave(budget)  # level index, flat
    key = _order_key(level_score.reshape(-1), depth_of)
    chosen = key.topk(budget).indices  # [B] flat (level, slot), best first
    lvl = chosen // budget
    slot = chosen % budget
    node_of = torch.zeros(depth_max * budget, dtype=torch.int64, device=device)
    node_of[chosen] = torch.arange(1, budget + 1, device=device)
    parent_flat = (lvl - 1).clamp(min=0) * budget + level_parent[lvl, slot]
    parent_node = torch.where(lvl > 0, node_of[parent_flat], torch.zeros_like(lvl))
    node_tokens = toks[lvl, level_rank[lvl, slot]]

    root = root_token.reshape(1).to(device=device, dtype=torch.int64)
    tokens = torch.cat([root, node_tokens])
    parents = torch.cat([torch.full((1,), -1, dtype=torch.int64, device=device), parent_node])
    depth = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), lvl + 1])
    return tokens, parents, depth


def build_tree_reference(draft_logits: Tensor, budget: int, root_token: int) -> tuple[list[int], list[int], list[float]]:
    """Brute force over every prefix (small V and D only): tokens, parents, scores, best first."""
    depth_max, vocab = draft_logits.shape
    lp = torch.log_softmax(draft_logits.double(), dim=-1).tolist()
    prefixes: list[tuple[float, tuple[int, ...]]] = []
    frontier: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]
    for d in range(depth_max):
        frontier = [(s + lp[d][t], (*p, t)) for s, p in frontier for t in range(vocab)]
        prefixes.extend(frontier)
    prefixes.sort(key=lambda sp: (-sp[0], len(sp[1])))
    best = prefixes[:budget]
    index = {(): 0}
    tokens, parents, scores = [root_token], [-1], [0.0]
    for s, p in best:
        index[p] = len(tokens)
        tokens.append(p[-1])
        parents.append(index[p[:-1]])
        scores.append(s)
    return tokens, parents, scores
