"""Tree build on the device: the B most probable prefixes under the product of marginals.

DDTree (Ringel & Romano, arXiv 2604.12989) drafts per-position marginals ``p_d(t)`` for positions
d = 1..D after the root and verifies the B prefixes ``(t_1..t_d)`` with the largest score
``sum_k log p_k(t_k)``. The paper finds them with a best-first heap (B sequential pops, a host
loop); this module finds the same set in six launches with no host sync: five for the
per-position top-k (ddtree_kernels/marginal_topk.py) and ONE single-program kernel for the tree.

**Why a level-by-level frontier is exact.** Let ``s_d[r]`` be position d's log-probabilities
sorted descending (r = rank; only ranks < k = min(B, V) can matter). Keep, for every depth d, a
*level*: the B best candidate prefixes of depth d, sorted. The candidates of depth d+1 are the
children ``(rho, r)`` = (level-d entry of rank rho, token rank r) with ``(rho+1)(r+1) <= B``.
A prefix of the true top-B never falls out:
  * its parent is in the top-B (scores only fall along a path), so by induction it is in level d
    at some rank rho;
  * the (rho+1)(r+1) children ``(rho' <= rho, r' <= r)`` all score at least as much (and come
    first on ties: candidates tie-break by their (rho, r) order), so a top-B child has
    ``(rho+1)(r+1) <= B``, and fewer than B depth-(d+1) candidates precede it.
The answer is the top-B of the union of the levels. fp32 keeps all of this: adding a log-prob
<= 0 never raises a score, and rounding is monotone, so dominated children never score higher.

**Pruning.** ``tau`` = the B-th largest score of the union of the levels built so far is a lower
bound on the final B-th best score tau*: B distinct prefixes already reach it. Before scoring
level d, ``cut`` = the B-th largest of that union plus two sorted lists of level d's own
candidates (its first column ``(rho, 0)`` and first row ``(0, r >= 1)``) is a lower bound too.
Candidates below cut are dropped; once the best one (``L[0] + s_d[0]``) is below it, no deeper
level can contribute and the build stops. Flat drafts stop after level 1 (the bench's random
logits); peaked ones keep ~20-200 survivors a level instead of ~B ln B.

**The single program.** Level lists live in scratch [D, BP] (BP = next power of two >= B, at
least 16): score (sorted descending), parent rank rho, token rank r; ``tl.debug_barrier()``
separates storing a level from reading it. ``top`` [BP] in registers holds the int32 images of
the union's top-BP scores, sorted; adding a sorted level is a bitonic half-cleaner
``max(top, reversed level)`` then a bitonic merge (log2 BP steps). A level's candidates come
from a cached table of (rho, r) sorted by rho (``candidate_pairs``, ~B ln B entries, its first
CHUNK in registers): the parents that can reach cut are a prefix of the level, so their
candidates are a prefix of the table. Survivors (int64 key: score's monotone bits << 32 | table
position, so ties keep table order as the argument above needs) are compacted into scratch, then
sorted: one sort of SMALL = 128 keys when few, else BP-chunks sorted and merged into a running
top-BP. The sorts are bitonic networks written here (``_sort``, ``_merge``): the same shuffles as
``tl.sort`` on the GPU, but the partner comes from a sum, which the CPU interpreter runs ~20x
faster than tl.sort's xor-reduction.

**The tree.** The top-B of the union: entries > tau*, plus ties at tau* taken shallow-first (so
the set stays prefix-closed: a tied child's parent is a tie one level up, taken first). A level's
chosen entries are its first c_d slots, so node = 1 + (chosen in earlier levels) + slot: level
order, ``parents[i] < i``; the final pass handles GROUP = 4 levels per round trip.

Launches of ``build_tree`` (time stage A with ``marginal_topk``, stage B with ``tree_from_topk``):
  A1 ``_partials_kernel`` (D, P)   chunk maxima + online log-sum-exp partials, one read of logits
  A2 ``_threshold_kernel`` (D,)     lse, tau <= k-th largest chunk maximum (bf16 step), counter reset
  A3 ``_collect_kernel`` (D, P)    candidates >= tau appended to [D, CAP] (second read of logits)
  A4 ``_exact_kernel`` (D,)         no-op unless a row overflowed CAP (exact bisection fallback)
  A5 ``_rank_kernel`` (D, CAP/64)   rank candidates, scatter the sorted top-k (vals, toks)
  B  ``_tree_kernel`` (1,)          all levels, pruning, final selection, tokens/parents/depth
Tuning knobs (constexprs in ``tree_from_topk``): SMALL, CHUNK, GROUP, num_warps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import next_pow2
from ddtree_kernels.marginal_topk import _key, _mono, _unmono, marginal_topk


def candidate_pairs(budget: int, k: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(rho, r) int32 pairs with (rho+1)(r+1) <= budget and r < k, sorted by (rho, r)."""
    rho, rank = [], []
    for parent_rank in range(budget):
        width = min(k, budget // (parent_rank + 1))
        rho.extend([parent_rank] * width)
        rank.extend(range(width))
    return (
        torch.tensor(rho, dtype=torch.int32, device=device),
        torch.tensor(rank, dtype=torch.int32, device=device),
    )


def _check_budget(depth_max: int, vocab: int, budget: int) -> None:
    capacity = sum(vocab**d for d in range(1, depth_max + 1))
    if not 1 <= budget <= capacity:
        raise ValueError(
            f"tree budget {budget} is outside 1..{capacity} (the number of distinct prefixes of depth "
            f"<= {depth_max} over a vocabulary of {vocab}); pick a budget in that range"
        )
    if budget > 8192:
        raise RuntimeError(
            f"tree build supports budget <= 8192 (one program holds [next_pow2(budget)] vectors in "
            f"registers), got {budget}"
        )


@triton.jit
def _compare_swap(h, flip, J: tl.constexpr, LOG_N: tl.constexpr):
    """One bitonic step on a [2] * LOG_N hypercube, pairs along axis J counted from the innermost.

    The partner is sum(pair) - self: exact for integers (two's complement wraps), and a sum is
    a fast reduction in the CPU interpreter too. ``flip`` 0/1 per position: ascending/descending.
    """
    partner = tl.sum(h, axis=LOG_N - 1 - J, keep_dims=True) - h
    right = tl.reshape(tl.arange(0, 2), [1] * (LOG_N - 1 - J) + [2] + [1] * J)
    return tl.where((h > partner) != (flip ^ right).to(tl.int1), partner, h)


@triton.jit
def _sort(x, LOG_N: tl.constexpr, DESCENDING: tl.constexpr):
    """Bitonic sort of an integer vector of 2^LOG_N entries."""
    h = tl.reshape(x, [2] * LOG_N)
    for stage in tl.static_range(1, LOG_N + 1):
        if stage < LOG_N:  # blocks of 2^stage sorted in alternating directions: bitonic pairs
            flip = tl.reshape(tl.arange(0, 2), [1] * (LOG_N - 1 - stage) + [2] + [1] * stage)
        else:
            flip = DESCENDING
        for i in tl.static_range(stage):
            h = _compare_swap(h, flip, stage - 1 - i, LOG_N)
    return tl.reshape(h, x.shape)


@triton.jit
def _merge(x, LOG_N: tl.constexpr):
    """Descending sort of a bitonic integer vector (LOG_N compare-swap steps)."""
    h = tl.reshape(x, [2] * LOG_N)
    for i in tl.static_range(LOG_N):
        h = _compare_swap(h, 1, LOG_N - 1 - i, LOG_N)
    return tl.reshape(h, x.shape)


@triton.jit
def _kth(top_mono, in_b):
    """The B-th largest int32 image of a sorted (or bitonic top-BP) vector."""
    return tl.min(tl.where(in_b, top_mono, 2147483647), 0)


@triton.jit
def _compact(score, i, n_cand, cut, n_keep, CK):
    """Append the keys of the candidates >= cut (table positions i) to CK; returns the new count."""
    keep = (i < n_cand) & (score >= cut)
    pos = n_keep + tl.cumsum(keep.to(tl.int32), 0) - 1
    tl.store(CK + pos, _key(_mono(score), i), mask=keep)
    return n_keep + tl.sum(keep.to(tl.int32), 0)


@triton.jit
def _store_level(keys, n_level, level, TAB_RHO, TAB_R, LS, LRHO, LR, BP: tl.constexpr, C: tl.constexpr):
    """Keys sorted best first -> level row: score, parent rank, token rank of slots < n_level."""
    slot = tl.arange(0, C)
    ok = slot < n_level
    pair = (4294967295 - (keys & 4294967295)).to(tl.int32)
    tl.store(LS + level * BP + slot, _unmono((keys >> 32).to(tl.int32)), mask=ok)
    tl.store(LRHO + level * BP + slot, tl.load(TAB_RHO + pair, mask=ok, other=0), mask=ok)
    tl.store(LR + level * BP + slot, tl.load(TAB_R + pair, mask=ok, other=0), mask=ok)


@triton.jit
def _tree_kernel(
    VALS,
    TOKS,
    TAB_RHO,
    TAB_R,
    ROOT,
    LS,
    LRHO,
    LR,
    LEN,
    CK,
    TOKENS,
    PARENTS,
    DEPTH,
    depth_max,
    budget,
    k,
    n_pairs,
    BP: tl.constexpr,
    LOG_BP: tl.constexpr,
    SMALL: tl.constexpr,
    LOG_SMALL: tl.constexpr,
    CHUNK: tl.constexpr,
    GROUP: tl.constexpr,
    FULL: tl.constexpr,
):
    """One program: levels 1..D-1 with pruning, then the top-B of their union as the tree."""
    lane = tl.arange(0, BP)
    rev = BP - 1 - lane
    in_b = lane < budget
    key_min = -9223372036854775807 - 1
    # level 0: the first position's top k, slot = token rank
    first = tl.load(VALS + lane, mask=lane < k, other=float("-inf"))
    tl.store(LS + lane, first)
    tl.store(LR + lane, lane)
    tl.store(LRHO + lane, lane * 0)
    tl.store(LEN, k)
    top = _mono(first)  # int32 images, sorted descending: the top-BP multiset of the union
    n_prev = tl.zeros([], tl.int32) + k
    n_levels = tl.zeros([], tl.int32) + 1
    alive = n_levels < depth_max
    i0 = tl.arange(0, CHUNK)  # the table's first chunk stays in registers
    rho0 = tl.load(TAB_RHO + i0, mask=i0 < n_pairs, other=0)
    r0 = tl.load(TAB_R + i0, mask=i0 < n_pairs, other=0)
    tl.debug_barrier()
    for d in range(1, depth_max):
        if alive:
            # loads first: their latency overlaps the merges. Reversed (ascending) lists of this
            # level's first column (rho, 0) and first row (0, r >= 1); the first chunk's scores
            col = tl.load(LS + (d - 1) * BP + rev, mask=rev < n_prev, other=float("-inf")) + tl.load(
                VALS + d * k
            )
            row = tl.load(LS + (d - 1) * BP) + tl.load(
                VALS + d * k + 1 + rev, mask=1 + rev < k, other=float("-inf")
            )
            score0 = tl.load(LS + (d - 1) * BP + rho0) + tl.load(VALS + d * k + r0)
            bound = _merge(tl.maximum(top, _mono(col)), LOG_BP)
            bound = tl.maximum(bound, _mono(row))  # the top-BP multiset, bitonic
            if not FULL:
                bound = _merge(bound, LOG_BP)
            cut = _unmono(_kth(bound, in_b))  # >= the union's B-th: bound holds the union's top too
            alive = tl.max(col, 0) >= cut
            if alive:
                # parents with a child >= cut: a prefix of the level, so a prefix of the table
                n_par = tl.sum((col >= cut).to(tl.int32), 0)
                n_cand = tl.sum(tl.where(lane < n_par, tl.minimum(budget // (lane + 1), k), 0), 0)
                n_keep = _compact(score0, i0, n_cand, cut, tl.zeros([], tl.int32), CK)
                for c0 in range(CHUNK, n_cand, CHUNK):
                    i = c0 + i0
                    ok = i < n_cand
                    score = tl.load(
                        LS + (d - 1) * BP + tl.load(TAB_RHO + i, mask=ok, other=0), mask=ok, other=0.0
                    )
                    score += tl.load(VALS + d * k + tl.load(TAB_R + i, mask=ok, other=0), mask=ok, other=0.0)
                    n_keep = _compact(score, i, n_cand, cut, n_keep, CK)
                tl.debug_barrier()
                n_level = tl.minimum(n_keep, budget)
                if n_keep <= SMALL:
                    j = tl.arange(0, SMALL)
                    keys = _sort(tl.load(CK + j, mask=j < n_keep, other=key_min), LOG_SMALL, 1)
                    _store_level(keys, n_level, d, TAB_RHO, TAB_R, LS, LRHO, LR, BP, SMALL)
                else:
                    best = _sort(tl.load(CK + lane, mask=lane < n_keep, other=key_min), LOG_BP, 1)
                    for c0 in range(BP, n_keep, BP):
                        chunk = _sort(
                            tl.load(CK + c0 + lane, mask=c0 + lane < n_keep, other=key_min), LOG_BP, 0
                        )
                        best = _merge(tl.maximum(best, chunk), LOG_BP)  # half-cleaner: top BP of both
                    _store_level(best, n_level, d, TAB_RHO, TAB_R, LS, LRHO, LR, BP, BP)
                tl.store(LEN + d, n_level)
                tl.debug_barrier()
                level = tl.load(LS + d * BP + rev, mask=rev < n_level, other=float("-inf"))  # ascending
                top = _merge(tl.maximum(top, _mono(level)), LOG_BP)
                n_prev = n_level
                n_levels += 1
                alive = n_levels < depth_max
    # tau* = the union's B-th image; the union's entries above it are all in `top`. Ties at tau*
    # are taken shallow-first. Levels go GROUP at a time: [GROUP, BP] tiles, one round trip each.
    tau = _kth(top, in_b)
    need = budget - tl.sum((in_b & (top > tau)).to(tl.int32), 0)
    g = tl.arange(0, GROUP)
    off = tl.zeros([], tl.int32)  # nodes of the levels before the group
    off_prev = tl.zeros([], tl.int32)  # node offset of the level just before the group
    for g0 in range(0, n_levels, GROUP):
        lv = g0 + g
        ok = lane[None, :] < tl.load(LEN + lv, mask=lv < n_levels, other=0)[:, None]
        at = lv[:, None] * BP + lane[None, :]
        score = _mono(tl.load(LS + at, mask=ok, other=0.0))
        tok_rank = tl.load(LR + at, mask=ok, other=0)
        rho = tl.load(LRHO + at, mask=ok, other=0)
        above = tl.sum((ok & (score > tau)).to(tl.int32), 1)
        ties = tl.sum((ok & (score == tau)).to(tl.int32), 1)
        ties = tl.minimum(ties, tl.maximum(need - (tl.cumsum(ties, 0) - ties), 0))
        need -= tl.sum(ties, 0)
        count = above + ties  # the level's chosen entries: its first `count` slots
        start = off + tl.cumsum(count, 0) - count
        before = tl.sum(tl.where(g[None, :] == g[:, None] - 1, count[None, :], 0), 1)
        parent_start = tl.where(g == 0, off_prev, start - before)
        chosen = lane[None, :] < count[:, None]
        node = 1 + start[:, None] + lane[None, :]
        parent = tl.where(lv[:, None] == 0, 0, 1 + parent_start[:, None] + rho)
        tl.store(TOKENS + node, tl.load(TOKS + lv[:, None] * k + tok_rank, mask=chosen, other=0), mask=chosen)
        tl.store(PARENTS + node, parent.to(tl.int64), mask=chosen)
        tl.store(DEPTH + node, (lv[:, None] + 1 + lane[None, :] * 0).to(tl.int64), mask=chosen)
        off_prev = tl.sum(tl.where(g == GROUP - 1, start, 0), 0)
        off += tl.sum(count, 0)
    root = lane == 0
    tl.store(TOKENS + lane, tl.load(ROOT + lane * 0, mask=root, other=0).to(tl.int64), mask=root)
    tl.store(PARENTS + lane, tl.full([BP], -1, tl.int64), mask=root)
    tl.store(DEPTH + lane, tl.zeros([BP], tl.int64), mask=root)


def tree_launch(budget: int) -> tuple[dict[str, int | bool], int]:
    """The tree kernel's constexprs and warps for ``budget`` (``ddtree_kernels.aot_specs`` uses the same):
    no register spills up to B = 1024 on sm_90."""
    bp = max(16, next_pow2(budget))
    small = min(128, bp)
    warps, chunk = (8, 1024) if bp <= 512 else (16, 512)
    meta = dict(
        BP=bp,
        LOG_BP=bp.bit_length() - 1,
        SMALL=small,
        LOG_SMALL=small.bit_length() - 1,
        CHUNK=chunk,
        GROUP=4,
        FULL=bp == budget,
    )
    return meta, warps


def tree_from_topk(
    vals: Tensor,
    toks: Tensor,
    budget: int,
    root_token: Tensor,
    pairs: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Stage B, one launch: the tree from per-position top-k (``marginal_topk``'s output).

    vals [D, k] fp32 log-probs sorted descending, toks [D, k] int64, k = min(budget, V).
    ``pairs``: ``candidate_pairs(budget, k, device)``, cached by the caller (no copy per round).
    """
    depth_max, k = vals.shape
    if k > budget or toks.shape != vals.shape:
        raise ValueError(
            f"vals {tuple(vals.shape)} / toks {tuple(toks.shape)} must be [D, min(budget, V)], budget {budget}"
        )
    _check_budget(depth_max, k, budget)
    device = vals.device
    tab_rho, tab_r = pairs if pairs is not None else candidate_pairs(budget, k, device)
    meta, warps = tree_launch(budget)
    bp = meta["BP"]
    level_score = torch.empty(depth_max, bp, device=device)
    level_rho = torch.empty(depth_max, bp, dtype=torch.int32, device=device)
    level_rank = torch.empty(depth_max, bp, dtype=torch.int32, device=device)
    level_len = torch.empty(depth_max, dtype=torch.int32, device=device)
    keys = torch.empty(tab_rho.shape[0], dtype=torch.int64, device=device)
    tokens = torch.empty(budget + 1, dtype=torch.int64, device=device)
    parents = torch.empty_like(tokens)
    depth = torch.empty_like(tokens)
    _tree_kernel[(1,)](
        vals.contiguous(),
        toks.contiguous(),
        tab_rho,
        tab_r,
        root_token.reshape(1).to(device),
        level_score,
        level_rho,
        level_rank,
        level_len,
        keys,
        tokens,
        parents,
        depth,
        depth_max,
        budget,
        k,
        tab_rho.shape[0],
        **meta,
        num_warps=warps,
    )
    return tokens, parents, depth


def build_tree(
    draft_logits: Tensor,
    budget: int,
    root_token: Tensor,
    pairs: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """tokens, parents, depth ([B+1] int64) of the top-``budget`` prefixes; node 0 is the root.

    draft_logits: [D, V] (any float dtype) for positions 1..D after the root. ``pairs``:
    ``candidate_pairs(budget, min(budget, V), device)``, cached by the caller. Nodes come in level
    order (all chosen depth-1 nodes, then depth-2, ...), so ``parents[i] < i``.
    """
    depth_max, vocab = draft_logits.shape
    _check_budget(depth_max, vocab, budget)
    vals, toks = marginal_topk(draft_logits, min(budget, vocab))
    return tree_from_topk(vals, toks, budget, root_token, pairs)


def build_tree_reference(
    draft_logits: Tensor, budget: int, root_token: int
) -> tuple[list[int], list[int], list[float]]:
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
