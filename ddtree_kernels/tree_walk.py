"""Tree-walk acceptance: follow the target's own choice from the root while it matches a child.

DDTree (Ringel & Romano, arXiv 2604.12989) verifies a draft tree with the target alone: at the
current node (starting at the root, node 0) the target *chooses* a token (argmax at T = 0, a sample
of softmax(logits / T) at T > 0); if a child carries that token the walk moves there, otherwise the
choice is the bonus token and the round ends. Invariant: the tokens emitted are exactly the tokens
plain decoding would emit (T = 0), or a sample from the target's own distribution (T > 0), because
each choice is made from the target's logits at a node whose prefix is already accepted.

Two launches, no host sync:
  1. ``_choice_kernel``: every node's choice in parallel (programs over rows x vocabulary splits;
     a running argmax over chunks, first index on ties like ``torch.argmax``; each split writes its
     best (value, index) and the walk reduces the splits of the nodes it visits). Sampling is Gumbel-max,
     ``argmax_t(logits_t / T - log(-log u_t))`` with ``u`` from Philox seeded on the device, which
     draws exactly from softmax(logits / T). Choices off the walk are never used, so drawing them
     up front does not change the walk's distribution.
  2. ``_walk_kernel``: one program holds ``parents`` and ``tokens`` in registers and steps down the
     tree: next = the child of ``cur`` whose token equals ``choice[cur]`` (siblings carry distinct
     tokens, so at most one matches).
Outputs, matching ``TorchBackend.tree_walk``: path [N] int64 (node indices from 0, padded with -1),
path_len (0-d, counts the root) and bonus (0-d, the last path node's choice). ``tree_walk_parts``
walks P greedy trees of a batched round in the same two launches (one walk program per tree).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import cdiv, next_pow2, num_sms


@triton.jit
def _choice_kernel(
    LOGITS,
    SEED,
    PART_VAL,
    PART_IDX,
    stride_ln,
    stride_lv,
    n_rows,
    vocab,
    chunk,
    inv_temperature,
    SAMPLE: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Best (value, first index) of BLOCK_R rows over one vocabulary chunk (split-V for occupancy)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    split = tl.program_id(1)
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_V)
    best = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    best_idx = tl.full([BLOCK_R], 2147483647, dtype=tl.int32)
    if SAMPLE:
        seed = tl.load(SEED)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, vocab)
    for start in range(lo, hi, BLOCK_V):
        idx = start + cols
        ok = row_ok[:, None] & (idx < hi)[None, :]
        x = tl.load(
            LOGITS + rows[:, None] * stride_ln + idx[None, :] * stride_lv, mask=ok, other=float("-inf")
        )
        x = x.to(tl.float32)
        if SAMPLE:
            u = tl.rand(seed, rows[:, None] * vocab + idx[None, :])
            x = x * inv_temperature - tl.log(-tl.log(u))
            x = tl.where(ok, x, float("-inf"))
        chunk_max = tl.max(x, 1)
        chunk_idx = tl.min(tl.where(x == chunk_max[:, None], idx[None, :], 2147483647), 1)
        take = chunk_max > best
        best_idx = tl.where(take, chunk_idx, best_idx)
        best = tl.where(take, chunk_max, best)
    tl.store(PART_VAL + rows * SPLITS + split, best, mask=row_ok)
    tl.store(PART_IDX + rows * SPLITS + split, best_idx, mask=row_ok)


@triton.jit
def _reduce_choice(PART_VAL, PART_IDX, row, SPLITS: tl.constexpr):
    """The row's choice from its splits: the largest value, the first index among equals."""
    s = tl.arange(0, SPLITS)
    val = tl.load(PART_VAL + row * SPLITS + s)
    idx = tl.load(PART_IDX + row * SPLITS + s)
    return tl.min(tl.where(val == tl.max(val, 0), idx, 2147483647), 0).to(tl.int64)


@triton.jit
def _walk_kernel(
    TOKENS,
    PARENTS,
    PART_VAL,
    PART_IDX,
    PATH,
    PATH_LEN,
    BONUS,
    n_nodes,
    SPLITS: tl.constexpr,
    N_PAD: tl.constexpr,
):
    # program t walks tree t of [P, N] trees (one, but in tree_walk_parts): rows t * N .. of every input
    tree = tl.program_id(0)
    TOKENS += tree * n_nodes
    PARENTS += tree * n_nodes
    PART_VAL += tree * n_nodes * SPLITS
    PART_IDX += tree * n_nodes * SPLITS
    PATH += tree * n_nodes
    PATH_LEN += tree
    BONUS += tree
    idx = tl.arange(0, N_PAD)
    ok = idx < n_nodes
    par = tl.load(PARENTS + idx, mask=ok, other=-2)
    tok = tl.load(TOKENS + idx, mask=ok, other=-1)
    path = tl.where(idx == 0, 0, -1).to(tl.int64)
    length = tl.full([], 1, tl.int32)
    bonus = _reduce_choice(PART_VAL, PART_IDX, 0, SPLITS)
    cur = tl.full([], 0, tl.int32)
    while cur >= 0:
        choice = _reduce_choice(PART_VAL, PART_IDX, cur, SPLITS)
        hit = (par == cur) & (tok == choice)
        nxt = tl.max(tl.where(hit, idx, -1), 0)
        path = tl.where(idx == length, nxt.to(tl.int64), path)
        length += (nxt >= 0).to(tl.int32)
        bonus = tl.where(nxt < 0, choice, bonus)
        cur = nxt
    tl.store(PATH + idx, path, mask=ok)
    tl.store(PATH_LEN, length.to(tl.int64))
    tl.store(BONUS, bonus)


def _seed(generator: torch.Generator | None, device: torch.device) -> Tensor:
    """A Philox seed drawn on the device from ``generator`` (a device-side draw, no host sync)."""
    gen_device = generator.device if generator is not None else device
    seed = torch.randint(0, 2**31 - 1, (1,), device=gen_device, generator=generator, dtype=torch.int64)
    return seed.to(device)


class ChoiceLaunch(NamedTuple):
    """``_choice_kernel``'s launch for N rows over V; ``ddtree_kernels.aot_specs`` uses the same."""

    grid: tuple[int, int]  # (row blocks, vocabulary splits)
    chunk: int  # vocabulary a split: a multiple of BLOCK_V
    meta: dict[str, int]  # every constexpr but SAMPLE
    warps: int


def choice_launch(n: int, vocab: int, sms: int) -> ChoiceLaunch:
    """Rows a block, vocabulary a load and splits so that about 4 programs a multiprocessor run."""
    block_r = max(1, min(16, next_pow2(max(1, n // (2 * sms)))))
    block_v = min(4096 // block_r, next_pow2(vocab))
    row_blocks = cdiv(n, block_r)
    splits = min(64, next_pow2(cdiv(4 * sms, row_blocks)), next_pow2(cdiv(vocab, block_v)))
    chunk = cdiv(cdiv(vocab, splits), block_v) * block_v
    meta = dict(SPLITS=splits, BLOCK_R=block_r, BLOCK_V=block_v)
    return ChoiceLaunch((row_blocks, splits), chunk, meta, 4 if block_v >= 1024 else 1)


def walk_launch(n: int, splits: int) -> tuple[dict[str, int], int]:
    """``_walk_kernel``'s constexprs and warps for N nodes whose choices come in ``splits`` parts
    (``ddtree_kernels.aot_specs`` uses the same)."""
    return dict(SPLITS=splits, N_PAD=max(16, next_pow2(n))), 4


def _partial_choices(
    logits: Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Per-(row, vocabulary split) best value and index: [N, S] fp32 and int32."""
    if logits.dim() != 2:
        raise RuntimeError(f"logits must be [N, V], got {tuple(logits.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    n, vocab = logits.shape
    sample = temperature > 0
    launch = choice_launch(n, vocab, num_sms(logits.device))
    splits = launch.meta["SPLITS"]
    part_val = torch.empty(n, splits, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(n, splits, dtype=torch.int32, device=logits.device)
    seed = _seed(generator, logits.device) if sample else part_idx
    _choice_kernel[launch.grid](
        logits,
        seed,
        part_val,
        part_idx,
        *logits.stride(),
        n,
        vocab,
        launch.chunk,
        1.0 / temperature if sample else 1.0,
        SAMPLE=sample,
        **launch.meta,
        num_warps=launch.warps,
    )
    return part_val, part_idx


def node_choices(logits: Tensor, temperature: float, generator: torch.Generator | None = None) -> Tensor:
    """Each row's choice ([N] int64): argmax (T == 0) or a Gumbel-max sample of softmax(logits / T)."""
    part_val, part_idx = _partial_choices(logits, temperature, generator)
    return part_idx.gather(1, part_val.argmax(dim=1, keepdim=True)).squeeze(1).to(torch.int64)


def tree_walk(
    tokens: Tensor,
    parents: Tensor,
    logits: Tensor,
    temperature: float,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """path [N], path_len (0-d), bonus (0-d), all int64 on the device; see the module docstring."""
    n = tokens.shape[0]
    if parents.shape != (n,) or logits.shape[0] != n:
        raise RuntimeError(
            f"tree walk wants tokens [N], parents [N], logits [N, V]; got {tuple(tokens.shape)}, "
            f"{tuple(parents.shape)}, {tuple(logits.shape)}"
        )
    part_val, part_idx = _partial_choices(logits, temperature, generator)
    return _walk(tokens, parents, part_val, part_idx)


def tree_walk_parts(tokens: Tensor, parents: Tensor, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The greedy walks of P trees at once: tokens, parents [P, N], logits [P, N, V] (a smaller
    tree padded with nodes of token -1 under the root, which no walk takes). Returns path [P, N],
    path_len [P] and bonus [P], as ``TorchBackend.tree_walk_parts``."""
    if tokens.dim() != 2 or parents.shape != tokens.shape or logits.shape[:2] != tokens.shape:
        raise RuntimeError(
            f"batched tree walk wants tokens [P, N], parents [P, N], logits [P, N, V]; got "
            f"{tuple(tokens.shape)}, {tuple(parents.shape)}, {tuple(logits.shape)}"
        )
    part_val, part_idx = _partial_choices(logits.reshape(-1, logits.shape[-1]), 0.0, None)
    return _walk(tokens.contiguous(), parents.contiguous(), part_val, part_idx)


def walk_choices(tokens: Tensor, parents: Tensor, choice: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The walk itself, given every node's choice ([N] int64)."""
    part_val = torch.zeros(choice.shape[0], 1, dtype=torch.float32, device=choice.device)
    return _walk(tokens, parents, part_val, choice.to(torch.int32)[:, None].contiguous())


def _walk(
    tokens: Tensor, parents: Tensor, part_val: Tensor, part_idx: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One walk per tree of contiguous tokens, parents [..., N] (choices: [trees * N, splits])."""
    *trees, n = tokens.shape
    path = torch.empty(*trees, n, dtype=torch.int64, device=tokens.device)
    path_len = torch.empty(trees, dtype=torch.int64, device=tokens.device)
    bonus = torch.empty(trees, dtype=torch.int64, device=tokens.device)
    meta, warps = walk_launch(n, part_val.shape[1])
    _walk_kernel[(path_len.numel(),)](
        tokens,
        parents,
        part_val,
        part_idx,
        path,
        path_len,
        bonus,
        n,
        **meta,
        num_warps=warps,
    )
    return path, path_len, bonus


def tree_walk_reference(tokens: Tensor, parents: Tensor, choice: Tensor) -> tuple[list[int], int]:
    """Host walk given each node's choice: (path node indices, bonus)."""
    tok, par, ch = tokens.tolist(), parents.tolist(), choice.tolist()
    children: dict[int, dict[int, int]] = {}
    for i in range(1, len(tok)):
        children.setdefault(par[i], {})[tok[i]] = i
    path = [0]
    while (nxt := children.get(path[-1], {}).get(ch[path[-1]])) is not None:
        path.append(nxt)
    return path, ch[path[-1]]
