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

import os

import torch
import triton
import triton.language as tl
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
    if depth_max > 255 or depth_max * budget >= 2**24:
        raise RuntimeError(
            f"tree build supports depth <= 255 and depth * budget < 2^24 (its tie-break keys), got depth "
            f"{depth_max} and budget {budget}"
        )


@triton.jit
def _order_key(score, low):
    """int64 key: the fp32 score's bits made monotone in the high word, a tie-break in the low word."""
    bits = score.to(tl.int32, bitcast=True)
    mono = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (mono.to(tl.int64) << 32) | low.to(tl.int64)


@triton.jit
def _keys_kernel(
    PREV, RHO, RANK, CHILD, SCORES, KEYS,
    n_keys, budget,
    POOL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Score and order key of every entry: a child (rho, r) of the level, or a pool entry (level, slot)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n_keys
    if POOL:
        score = tl.load(PREV + i, mask=ok, other=float("-inf"))
        level = i // budget
        low = ((255 - level).to(tl.int64) << 24) | (16777215 - i).to(tl.int64)  # shallower first
    else:
        score = tl.load(PREV + tl.load(RHO + i, mask=ok, other=0), mask=ok, other=float("-inf"))
        score = score + tl.load(CHILD + tl.load(RANK + i, mask=ok, other=0), mask=ok, other=0.0)
        low = 4294967295 - i.to(tl.int64)  # lower index first on equal scores
    tl.store(SCORES + i, score, mask=ok)
    tl.store(KEYS + i, _order_key(score, low), mask=ok)


@triton.jit
def _rank_select_kernel(
    SCORES, KEYS, OUT_SCORE, OUT_INDEX,
    n_keys, budget,
    BLOCK_X: tl.constexpr,
    BLOCK_Y: tl.constexpr,
):
    """Exact sorted top-``budget``: entry x lands at slot rank(x) = #{y : key_y > key_x}.

    Keys are distinct (the low word breaks ties), so the ranks are a permutation; all-pairs
    counting is ~n^2 compares over contiguous key loads, spread over n / BLOCK_X programs, and
    cheaper than a sort at these sizes.
    """
    xs = tl.program_id(0) * BLOCK_X + tl.arange(0, BLOCK_X)
    x_ok = xs < n_keys
    kx = tl.load(KEYS + xs, mask=x_ok, other=0)
    rank = tl.zeros([BLOCK_X], dtype=tl.int32)
    for y0 in range(0, n_keys, BLOCK_Y):
        ys = y0 + tl.arange(0, BLOCK_Y)
        ky = tl.load(KEYS + ys, mask=ys < n_keys, other=-9223372036854775807 - 1)
        rank += tl.sum((ky[None, :] > kx[:, None]).to(tl.int32), 1)
    keep = x_ok & (rank < budget)
    tl.store(OUT_SCORE + rank, tl.load(SCORES + xs, mask=keep, other=0.0), mask=keep)
    tl.store(OUT_INDEX + rank, xs.to(tl.int64), mask=keep)


def _top_sorted(prev, rho, rank, child, n_keys, budget, out_score, out_index, pool, scratch, blocks):
    """Two launches: keys of all entries, then each entry's rank and scatter of the top ``budget``."""
    scores, keys = scratch
    block_x, block_y = blocks
    _keys_kernel[(triton.cdiv(n_keys, 1024),)](
        prev, rho, rank, child, scores, keys, n_keys, budget, POOL=pool, BLOCK=1024, num_warps=4,
    )
    _rank_select_kernel[(triton.cdiv(n_keys, block_x),)](
        scores, keys, out_score, out_index, n_keys, budget,
        BLOCK_X=block_x, BLOCK_Y=block_y, num_warps=4,
    )


@triton.jit
def _assemble_kernel(
    CHOSEN, PICKS, RHO, RANK, TOKS, NODE_OF, ROOT,
    TOKENS, PARENTS, DEPTH,
    budget, k,
    BLOCK: tl.constexpr,
):
    """Node r+1 = the r-th chosen pool entry (level, slot): its token, parent node and depth."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = r < budget
    flat = tl.load(CHOSEN + r, mask=ok, other=0)
    level = flat // budget
    slot = flat % budget
    deep = ok & (level > 0)
    pick = tl.load(PICKS + (level - 1) * budget + slot, mask=deep, other=0)
    tok_rank = tl.where(deep, tl.load(RANK + pick, mask=deep, other=0), slot)
    parent_slot = tl.load(RHO + pick, mask=deep, other=0)
    parent = tl.where(deep, tl.load(NODE_OF + (level - 1) * budget + parent_slot, mask=deep, other=0), 0)
    tl.store(TOKENS + 1 + r, tl.load(TOKS + level * k + tok_rank, mask=ok, other=0), mask=ok)
    tl.store(PARENTS + 1 + r, parent, mask=ok)
    tl.store(DEPTH + 1 + r, level + 1, mask=ok)
    first = r == 0
    tl.store(TOKENS + r, tl.load(ROOT + r * 0, mask=first, other=0).to(tl.int64), mask=first)
    tl.store(PARENTS + r, tl.full([BLOCK], -1, tl.int64), mask=first)
    tl.store(DEPTH + r, tl.zeros([BLOCK], tl.int64), mask=first)


@triton.jit
def _node_of_kernel(CHOSEN, NODE_OF, budget, BLOCK: tl.constexpr):
    """Inverse of CHOSEN: the node index (rank + 1) of every chosen pool entry."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = r < budget
    tl.store(NODE_OF + tl.load(CHOSEN + r, mask=ok, other=0), (r + 1).to(tl.int64), mask=ok)


def build_tree(
    draft_logits: Tensor,
    budget: int,
    root_token: Tensor,
    pairs: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """tokens, parents, depth ([B+1] int64) of the top-``budget`` prefixes; node 0 is the root.

    draft_logits: [D, V] for positions 1..D after the root. ``pairs``: ``candidate_pairs(budget,
    min(budget, V), device)``, cached by the caller so that no host-to-device copy happens per round.
    Launches: log_softmax and per-position top-K (PyTorch), a key and a rank-select launch per
    level and for the pool, two small ones to assemble the nodes.
    """
    depth_max, vocab = draft_logits.shape
    _check_budget(depth_max, vocab, budget)
    device = draft_logits.device
    k = min(budget, vocab)
    rho, rank = pairs if pairs is not None else candidate_pairs(budget, k, device)
    n_pairs = rho.shape[0]
    vals, toks = torch.log_softmax(draft_logits.float(), dim=-1).topk(k, dim=-1)  # [D, K], sorted
    vals = vals.contiguous()

    level_score = torch.empty(depth_max, budget, device=device)
    level_score[0] = float("-inf")
    level_score[0, :k] = vals[0]
    picks = torch.empty(max(1, depth_max - 1), budget, dtype=torch.int64, device=device)
    # GPU: small tiles over many programs; the CPU interpreter runs programs one by one, so there
    # few programs with big tiles are far faster
    blocks = (1024, 1024) if os.environ.get("TRITON_INTERPRET") == "1" else (32, 256)
    pool = depth_max * budget
    scratch = (
        torch.empty(max(n_pairs, pool), device=device),
        torch.empty(max(n_pairs, pool), dtype=torch.int64, device=device),
    )
    for d in range(1, depth_max):
        _top_sorted(level_score[d - 1], rho, rank, vals[d], n_pairs, budget, level_score[d], picks[d - 1],
                    False, scratch, blocks)
    chosen_score = torch.empty(budget, device=device)
    chosen = torch.empty(budget, dtype=torch.int64, device=device)
    _top_sorted(level_score, rho, rank, vals, pool, budget, chosen_score, chosen, True, scratch, blocks)
    node_of = torch.empty(pool, dtype=torch.int64, device=device)
    block = 256
    _node_of_kernel[(triton.cdiv(budget, block),)](chosen, node_of, budget, BLOCK=block, num_warps=4)
    tokens = torch.empty(budget + 1, dtype=torch.int64, device=device)
    parents = torch.empty_like(tokens)
    depth = torch.empty_like(tokens)
    _assemble_kernel[(triton.cdiv(budget, block),)](
        chosen, picks, rho, rank, toks.contiguous(), node_of, root_token.reshape(1).to(device),
        tokens, parents, depth,
        budget, k,
        BLOCK=block, num_warps=4,
    )
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
