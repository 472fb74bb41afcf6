"""Tree attention: N tree queries over the cached context plus their own ancestors.

DDTree (Ringel & Romano, arXiv 2604.12989) verifies a whole draft tree in one target pass. Node i
(best-first order, ``parents[i] < i``) sits at cache row ``C + i`` (C = context_len) and sees

    every context row p < C,   and tree row C + j   iff   j is i or an ancestor of i.

**Visibility description: per-node ancestor bitmasks.** ``bits[i, j // 32] >> (j % 32) & 1`` is 1
iff j is an ancestor-or-self of i (int32 words, [N, ceil(N / 32)]: 132 KB for N = 1025). We chose
bitmasks over DFS pre/post-order intervals because the seam hands us best-first order: intervals
need a depth-first renumbering (subtree sizes, then a prefix sum over siblings), a sequential scan
or several launches per round, while a bitmask row is one independent walk up the parent chain per
node (``tree_visibility``: one launch, ``depth[i] + 1`` dependent loads per program, no host sync).
Inside the attention kernel a key tile touches at most (BLOCK_N + 30) // 32 + 1 words per query
row, loaded as row vectors on the <= N / BLOCK_N tree tiles only. Measured (H200, bf16, 4096
context, see benchmarks/RESULTS.md) against the causal chain, which needs no description at all and
so bounds what intervals could save: 64.2 vs 61.2 µs per layer at N = 257, 208 vs 184 µs at
N = 1025. Because ``parents[i] < i``, ancestors of i have indices <= i, so key tiles past a query
tile's last node are skipped (the same saving as a causal mask). ``visibility=None`` is that causal
chain (ar prefill, decode = N = 1).

**Kernel.** One program per (block of packed query rows, KV head, key split). GQA is packed: the
``G = Hq / Hkv`` query heads that share a KV head become rows ``r = node * G + g`` of one tile, so K/V
are read once per group. Online softmax in base 2 with fp32 accumulators: for each key tile,
``m' = max(m, max_j s_j)``, ``l' = l * 2^(m - m') + sum_j 2^(s_j - m')``,
``acc' = acc * 2^(m - m') + P V``; the output is ``acc / l``. When the tree is small the context is
split into S key ranges (split-K) so that the grid fills the GPU; each split writes ``(acc, m, l)``
and a second kernel merges them: ``M = max_s m_s``, ``out = sum_s 2^(m_s - M) acc_s /
sum_s 2^(m_s - M) l_s``. The split count comes from a cost model (waves of programs times key
tiles per program, plus a per-program overhead).

**The tail.** A tree of 2^k + 1 nodes (the root plus a power-of-two budget) leaves G rows past the
last full 128-row tile. The planner prices two layouts (``AttentionConfig.tail``): *plain*, a
whole tile program per KV head for them (a second wave when the first is full); *separate*, their
own launch of 16-row tiles (H200, 4096 context: 257 nodes 64.8 -> 57.6 µs, against 47.8 µs for 256
nodes), which reads the whole KV range a second time (134 MB a layer for Qwen3-8B at 32K). Every
launch is priced at least one read of its KV range (``_kv_read_cost``); on the H200 separate wins
from 257 nodes, plain below. A third layout, the tail's rows carried by the last full tile's
program (one KV read), was tried and measured slower everywhere (H200, Qwen3-8B, µs per layer at
4K/16K/32K: 65 nodes 37.0/87.6/152.6 against plain's 30.9/69.7/120.3; 257 nodes 98.9/297.5/556.2
against separate's 82.4/193.2/346.1), so it was removed.

Tiles wholly inside the context take an unmasked path. K/V tiles come through TMA tensor
descriptors over ``[Hkv, C + N, D]`` (rows past the tree read as zeros, and no pointer tensors
occupy registers); on sm_90 the two products are wgmma (``HGMMA`` in SASS).

**Batched passes** (continuous batching): ``tree_attention_parts`` runs P sequences' rows, padded to
N, through the same kernel in one launch. The sequence is folded into the KV-head grid axis
(``seq * Hkv + kvh``); each program reads its sequence's cache slot, row count and context length
from small device tensors (``PartsVisibility``), and the descriptors span one layer of every slot,
``[S, Hkv, key bound, D]``. A causal sequence beside trees gets a chain's bitmasks; tiles past a
shorter sequence's rows skip the keys; split-K partials of all sequences merge in one launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from ddtree_kernels import pdl
from ddtree_kernels.arch import ROWS, ArchRow, device_row
from ddtree_kernels.host import cdiv, next_pow2, num_sms
from ddtree_kernels.pdl import release_then_wait, wait_for_producer
from ddtree_kernels.precision import dot, dot_precision

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class TreeVisibility:
    """Ancestor-or-self bitmasks of a tree: ``bits`` int32 [N, ceil(N / 32)] on the device."""

    bits: Tensor

    @property
    def num_nodes(self) -> int:
        return self.bits.shape[0]


@dataclass(frozen=True)
class PartsVisibility:
    """What each of P sequences' rows (padded to N) see in ``tree_attention_parts``: device tensors,
    built once per batched pass (``parts_visibility``) and read by every layer."""

    rows: Tensor  # int32 [P]: each sequence's real rows (the rest of its N are padding)
    context_lens: Tensor  # int64 [P]
    keys: int  # static bound on any sequence's context + rows: sizes the TMA descriptors and the splits
    bits: Tensor | None  # int32 [P, N, ceil(N / 32)] ancestor-or-self bitmasks; None: every one causal
    all_visible: bool = False
    window: int | None = None


@dataclass(frozen=True)
class AttentionConfig:
    """Launch configuration; ``None`` fields are chosen by the wrapper from the grid size.

    ``tail``: where the last ``rows % block_m`` packed rows go (the 4 rows of a 257-node tree's
    257th node): ``"plain"``, a whole ``block_m`` tile program per KV head; ``"separate"``, a second
    launch of 16-row tiles. A layout the shape cannot take falls back to plain.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    splits: int | None = None
    tail: str | None = None

    def __post_init__(self) -> None:
        if self.tail not in (None, *TAIL_LAYOUTS):
            raise RuntimeError(
                f"AttentionConfig.tail must be one of {TAIL_LAYOUTS} or None, got {self.tail!r}"
            )


TAIL_LAYOUTS = ("plain", "separate")


@triton.jit
def _visibility_kernel(
    PARENTS,
    DEPTH,
    BITS,
    stride_bn,
    WORDS: tl.constexpr,
    WORDS_PAD: tl.constexpr,
):
    """Program i walks from node i to the root, setting one bit per node it passes."""
    node = tl.program_id(0)
    words = tl.arange(0, WORDS_PAD)
    acc = tl.zeros([WORDS_PAD], dtype=tl.int32)
    steps = tl.load(DEPTH + node).to(tl.int32) + 1
    cur = node.to(tl.int32)
    for _ in range(steps):
        bit = (tl.full([WORDS_PAD], 1, tl.int32) << (cur % 32)).to(tl.int32)
        acc = tl.where(words == cur // 32, acc | bit, acc)
        cur = tl.load(PARENTS + tl.maximum(cur, 0)).to(tl.int32)
    tl.store(BITS + node * stride_bn + words, acc, mask=words < WORDS)


@triton.jit
def _softmax_step(s, v, m_i, l_i, acc, PRECISION: tl.constexpr, MASKED: tl.constexpr):
    """One key tile of the online softmax for scores ``s`` (base 2); MASKED: a row may see none of it."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new) if MASKED else m_new
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISION)
    return m_new, l_i, acc


@triton.jit
def _mask_scores(
    s,
    start,
    hi,
    context_len,
    node,
    row_ok,
    BITS,
    stride_bn,
    n_nodes,
    ROWS_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TREE: tl.constexpr,
    ALL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """Scores of rows ``node`` (ROWS_M of them) against keys [start, start + BLOCK_N), -inf where hidden."""
    pos = start + tl.arange(0, BLOCK_N)
    key_ok = pos < hi
    j = pos - context_len  # tree index of the key (negative inside the context)
    if TREE:
        # BLOCK_N consecutive keys span at most (BLOCK_N + 30) // 32 + 1 bitmask words: load
        # each as a per-row vector and pick per column, instead of a [ROWS_M, BLOCK_N] gather
        n_words = (n_nodes + 31) // 32
        jc = tl.maximum(j, 0)
        w0 = tl.maximum(start - context_len, 0) // 32
        word = tl.zeros([ROWS_M, BLOCK_N], dtype=tl.int32)
        for t in tl.static_range((BLOCK_N + 30) // 32 + 1):
            w_idx = tl.full([ROWS_M], 0, tl.int32) + w0 + t
            w = tl.load(BITS + node * stride_bn + w_idx, mask=row_ok & (w_idx < n_words), other=0)
            word = tl.where((jc // 32 == w0 + t)[None, :], w[:, None], word)
        seen = ((word >> (jc % 32)[None, :]) & 1) != 0
    elif ALL:
        seen = j[None, :] < n_nodes
    else:
        seen = j[None, :] <= node[:, None]
    visible = ((j < 0)[None, :] | seen) & key_ok[None, :]
    if WINDOW > 0:  # key position - query position within (-WINDOW, WINDOW) (past only, unless ALL)
        dist = j[None, :] - node[:, None]
        visible &= dist > -WINDOW
        if ALL:
            visible &= dist < WINDOW
    return tl.where(visible, s, float("-inf"))


@triton.jit
def _store_rows(
    acc,
    m_i,
    l_i,
    node,
    head,
    row_ok,
    split,
    OUT,
    PART_ACC,
    PART_ML,
    stride_oh,
    stride_on,
    stride_od,
    stride_ps,
    stride_ph,
    stride_pn,
    part_node0,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """A split's (acc, m, l) partial of these rows, or (one split) their output acc / l."""
    dims = tl.arange(0, D_PAD)
    out_mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]
    if SPLIT:
        part = split * stride_ps + head * stride_ph + (node - part_node0) * stride_pn
        tl.store(PART_ACC + part[:, None] + dims[None, :], acc, mask=out_mask)
        tl.store(PART_ML + 2 * (part // D_PAD), m_i, mask=row_ok)
        tl.store(PART_ML + 2 * (part // D_PAD) + 1, l_i, mask=row_ok)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l_i == 0 only on padding rows
        tl.store(
            OUT + head[:, None] * stride_oh + node[:, None] * stride_on + dims[None, :] * stride_od,
            out.to(OUT.dtype.element_ty),
            mask=out_mask,
        )


@triton.jit
def _tree_attention_kernel(
    Q,
    K,
    V,
    BITS,
    OUT,
    PART_ACC,
    PART_ML,
    SLOTS,
    ROWS,
    stride_qz,
    stride_qh,
    stride_qn,
    stride_qd,
    stride_oz,
    stride_oh,
    stride_on,
    stride_od,
    stride_bz,
    stride_bn,
    stride_ps,
    stride_pz,
    stride_ph,
    stride_pn,
    n_nodes,
    row0,
    part_node0,
    CTX,
    qk_scale,
    kv_heads,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TREE: tl.constexpr,
    ALL: tl.constexpr,
    WINDOW: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16, "tl.dot needs tiles of at least 16")
    wait_for_producer(PDL)
    pid_m = tl.program_id(0)
    kvh = tl.program_id(1) % kv_heads
    seq = tl.program_id(1) // kv_heads  # the sequence (0 but in tree_attention_parts)
    split = tl.program_id(2)
    slot = seq if SLOTS is None else tl.load(SLOTS + seq).to(tl.int32)
    if ROWS is not None:  # several sequences in one launch: each its own row count (n_nodes: padded)
        n_nodes = tl.load(ROWS + seq).to(tl.int32)
    Q += seq * stride_qz
    OUT += seq * stride_oz
    BITS += seq * stride_bz
    PART_ACC += seq * stride_pz  # a whole number of D_PAD rows, so the (m, l) pairs follow
    PART_ML += 2 * (seq * stride_pz // D_PAD)
    # the context length lives on the device, so one captured launch serves a whole range of them;
    # the split-K ranges follow it (a split past the keys writes an empty partial: m = -inf, l = 0)
    context_len = tl.load(CTX + seq).to(tl.int32)
    # a sliding window (WINDOW > 0) hides every key WINDOW or more positions before the first node
    key0 = (tl.maximum(context_len - WINDOW + 1, 0) // BLOCK_N) * BLOCK_N if WINDOW > 0 else 0
    keys_per_split = tl.cdiv(tl.cdiv(context_len + n_nodes - key0, BLOCK_N), tl.num_programs(2)) * BLOCK_N

    rows = row0 + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # packed rows: node * GROUP + g
    node = rows // GROUP
    head = kvh * GROUP + rows % GROUP
    row_ok = node < n_nodes
    dims = tl.arange(0, D_PAD)
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        Q + head[:, None] * stride_qh + node[:, None] * stride_qn + dims[None, :] * stride_qd,
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    # keys [lo, hi) of this split; ancestors have smaller indices, so nothing past the tile's
    # last node is visible (causal skip).
    if ALL:  # every new row sees every new row (a drafter block): no causal skip
        last_node = n_nodes - 1
    else:
        last_node = tl.minimum(row0 + (pid_m + 1) * BLOCK_M - 1, n_nodes * GROUP - 1) // GROUP
    lo = key0 + split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, context_len + last_node + 1)
    if ROWS is not None:  # a shorter sequence's tiles past its rows skip the keys
        hi = tl.where(row0 + pid_m * BLOCK_M < n_nodes * GROUP, hi, lo)
    # whole tiles inside the context are visible to every row, unless a window cuts them
    ctx_full = lo if WINDOW > 0 else (context_len // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)

    # phase 1: whole tiles inside the context, every key visible
    for start in range(lo, tl.minimum(hi, ctx_full), BLOCK_N):
        k = K.load([slot, kvh, start, 0]).reshape(BLOCK_N, D_PAD)
        v = V.load([slot, kvh, start, 0]).reshape(BLOCK_N, D_PAD)
        s = dot(q, tl.trans(k), PRECISION) * qk_scale
        m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, PRECISION, False)

    # phase 2: the context's ragged tail and the tree rows, masked
    for start in range(tl.maximum(lo, ctx_full), hi, BLOCK_N):
        k = K.load([slot, kvh, start, 0]).reshape(BLOCK_N, D_PAD)
        v = V.load([slot, kvh, start, 0]).reshape(BLOCK_N, D_PAD)
        s = dot(q, tl.trans(k), PRECISION) * qk_scale
        s = _mask_scores(
            s,
            start,
            hi,
            context_len,
            node,
            row_ok,
            BITS,
            stride_bn,
            n_nodes,
            BLOCK_M,
            BLOCK_N,
            TREE,
            ALL,
            WINDOW,
        )
        m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, PRECISION, True)

    _store_rows(
        acc,
        m_i,
        l_i,
        node,
        head,
        row_ok,
        split,
        OUT,
        PART_ACC,
        PART_ML,
        stride_oh,
        stride_on,
        stride_od,
        stride_ps,
        stride_ph,
        stride_pn,
        part_node0,
        HEAD_DIM,
        D_PAD,
        SPLIT,
    )


@triton.jit
def _merge_splits_kernel(
    MAIN_ACC,
    MAIN_ML,
    TAIL_ACC,
    TAIL_ML,
    OUT,
    stride_ms,
    stride_mh,
    stride_mn,
    stride_ts,
    stride_th,
    stride_tn,
    stride_oh,
    stride_on,
    stride_od,
    n_nodes,
    main_splits,
    tail_splits,
    tail_node0,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_R: tl.constexpr,
    SPLITS_C: tl.constexpr,
    PDL: tl.constexpr,
):
    """Merge the splits' (acc, m, l) of BLOCK_R nodes of one head: one log-sum-exp per row.

    Nodes from ``tail_node0`` on came from the tail launch (their own buffers and split count);
    rows of a launch that did not split were written directly and are left alone.
    """
    release_then_wait(PDL)  # o_proj may start fetching its weight
    node = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    head = tl.program_id(1)
    dims = tl.arange(0, D_PAD)
    is_tail = node >= tail_node0
    n_splits = tl.where(is_tail, tail_splits, main_splits)
    row_ok = (node < n_nodes) & (n_splits > 1)
    row_part = tl.where(
        is_tail, head * stride_th + (node - tail_node0) * stride_tn, head * stride_mh + node * stride_mn
    )
    split_stride = tl.where(is_tail, stride_ts, stride_ms)
    acc_base = tl.where(is_tail, TAIL_ACC + row_part, MAIN_ACC + row_part)
    ml_base = tl.where(is_tail, TAIL_ML + 2 * (row_part // D_PAD), MAIN_ML + 2 * (row_part // D_PAD))
    block_splits = tl.max(tl.where(row_ok, n_splits, 0), 0)  # main-only blocks skip the tail's splits
    # SPLITS_C splits at a time in one load each (a loop of one split per step was a chain of
    # dependent loads: 6.6-12 µs for one decode row on the H200), combined as online softmax
    m_all = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_all = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, D_PAD], dtype=tl.float32)
    for s0 in range(0, block_splits, SPLITS_C):
        s = s0 + tl.arange(0, SPLITS_C)
        ok = row_ok[None, :] & (s[:, None] < n_splits[None, :])  # [SPLITS_C, BLOCK_R]
        offset = s[:, None] * split_stride[None, :]
        ml = ml_base[None, :] + 2 * (offset // D_PAD)
        m_s = tl.load(ml, mask=ok, other=float("-inf"))
        l_s = tl.load(ml + 1, mask=ok, other=0.0)
        a_s = tl.load(
            (acc_base[None, :] + offset)[:, :, None] + dims[None, None, :], mask=ok[:, :, None], other=0.0
        )
        m_new = tl.maximum(m_all, tl.max(m_s, 0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_all - m_ref)
        w = tl.math.exp2(m_s - m_ref[None, :])
        l_all = l_all * alpha + tl.sum(w * l_s, 0)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * a_s, 0)
        m_all = m_new
    out = acc / tl.where(row_ok, l_all, 1.0)[:, None]
    tl.store(
        OUT + head * stride_oh + node[:, None] * stride_on + dims[None, :] * stride_od,
        out.to(OUT.dtype.element_ty),
        mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :],
    )


def _default_config(rows: int, arch: ArchRow) -> AttentionConfig:
    """Small row counts (decode, small trees) are memory-bound: short tiles, many splits.

    The tiles come from the device family's row in ddtree_kernels/arch.py, which fit its shared memory.
    """
    if rows <= 16:
        return AttentionConfig(*arch.decode)
    if rows <= 256:
        return AttentionConfig(*arch.small)
    return AttentionConfig(*arch.large)


# The tail launch's tiles on sm_90: 16 rows (the smallest tl.dot tile), many splits over the keys;
# other families take theirs from ddtree_kernels/arch.py.
_TAIL_CONFIG = AttentionConfig(*ROWS["sm_90"].tail)
# Costs are in steps of one main-tile program over one key tile. Per-program cost outside the key
# loop (prologue, partial store, merge share), and the cost of a second (tail) launch; fitted to the
# H200 sweep in RESULTS.md.
_PROGRAM_OVERHEAD_TILES = 4
_TAIL_LAUNCH_TILES = 4
# The tail's splits are merged row by row; more than this costs the merge more than it saves.
_TAIL_MAX_SPLITS = 16
# The kernel's tile maths over HBM bandwidth on the H200 (~1.3 µs per 128x64 key tile at head_dim 128
# on 132 SMs: ~425 TFLOP/s, against ~4.2 TB/s): how many FLOPs of tile work take as long as reading
# one byte of K/V. It prices a launch's read of the KV range in key-tile steps.
_FLOPS_PER_BYTE = 100


def _split_cost(
    programs: int, key_tiles: int, sms: int, max_splits: int = 64, step: float = 1.0
) -> tuple[float, int]:
    """(cost, splits) for the best split-K: cost ~ waves x (key tiles per program x ``step`` + overhead)."""
    options = range(1, max(1, min(max_splits, key_tiles // 2)) + 1)
    return min(
        (cdiv(programs * sp, sms) * (cdiv(key_tiles, sp) * step + _PROGRAM_OVERHEAD_TILES), sp)
        for sp in options
    )


def _kv_read_cost(hkv: int, key_tiles: int, block_m: int, sms: int, elem_bytes: int) -> float:
    """One read of the KV range from HBM, in key-tile steps: the floor of any launch over it.

    A step is 4 * block_m * block_n * D FLOPs on every SM; the read is hkv * key_tiles * block_n * D
    * 2 (K and V) * elem_bytes bytes, so D and block_n cancel.
    """
    return hkv * key_tiles * elem_bytes * _FLOPS_PER_BYTE / (2 * sms * block_m)


def merge_tiles(splits: int, d_pad: int) -> tuple[int, int]:
    """(rows per merge program, splits per load): up to 16 splits' partials of a few rows in one
    [splits, rows, D] load, about 4K fp32 values a program."""
    splits_c = min(next_pow2(splits), 16)
    return max(1, min(16, 4096 // (splits_c * d_pad))), splits_c


class _Partials(NamedTuple):
    """One launch's split-K partials: (acc, m/l) buffers over its nodes [node0, N), and its split count."""

    acc: Tensor
    ml: Tensor
    splits: int
    node0: int


@dataclass(frozen=True)
class _Launch:
    """One launch of the attention kernel over packed rows [row0, row0 + rows) with ``splits`` key
    ranges."""

    row0: int
    rows: int
    config: AttentionConfig
    splits: int


@lru_cache(maxsize=1024)
def _plan(
    rows: int,
    group: int,
    keys: int,
    hkv: int,
    cfg: AttentionConfig,
    sms: int,
    tail_cfg: AttentionConfig = _TAIL_CONFIG,
    elem_bytes: int = 2,
) -> tuple[_Launch, ...]:
    """The launches of the cheapest tail layout (``cfg.tail`` picks one; one the shape cannot take
    falls back to plain). Cached: a decode loop asks for the same few shapes every layer, and eager
    launches pay for any host work."""
    plans = tail_layouts(rows, group, keys, hkv, cfg, sms, tail_cfg, elem_bytes)
    if cfg.tail is not None:
        return plans.get(cfg.tail, plans["plain"])[1]
    return min(plans.values(), key=lambda plan: plan[0])[1]


def tail_layouts(
    rows: int,
    group: int,
    keys: int,
    hkv: int,
    cfg: AttentionConfig,
    sms: int,
    tail_cfg: AttentionConfig,
    elem_bytes: int,
) -> dict[str, tuple[float, tuple[_Launch, ...]]]:
    """Each tail layout this shape can take: its modelled cost in key-tile steps, and its launches.

    Every launch reads the whole KV range at least once (``_kv_read_cost``), so a separate tail
    launch pays that read a second time. Its 16-row programs do little maths per byte, so their
    steps (prologue, key tiles, partial store, merge share) add to that read instead of hiding
    under it: fitted to the H200's ``benchmarks/kernels_bench.py --tail`` (Qwen3-8B, 4K-32K),
    where the tail launch of a 65-node tree was 3-4 µs slower than a plain tile and that of a
    257-node tree 8-19 µs faster. That command prints these costs beside the measured times.
    """
    tail = rows % cfg.block_m
    m_tiles = cdiv(rows, cfg.block_m)
    key_tiles = cdiv(keys, cfg.block_n)
    kv_read = _kv_read_cost(hkv, key_tiles, cfg.block_m, sms, elem_bytes)
    cost, splits = _split_cost(m_tiles * hkv, key_tiles, sms)
    plans = {"plain": (max(cost, kv_read), (_Launch(0, rows, cfg, cfg.splits or splits),))}
    if tail and rows > cfg.block_m > tail_cfg.block_m and cfg.block_m % group == 0:
        cost, splits = _split_cost((m_tiles - 1) * hkv, key_tiles, sms)
        tail_tiles = cdiv(keys, tail_cfg.block_n)
        step = tail_cfg.block_m * tail_cfg.block_n / (cfg.block_m * cfg.block_n)
        tail_cost, tail_splits = _split_cost(
            cdiv(tail, tail_cfg.block_m) * hkv, tail_tiles, sms, _TAIL_MAX_SPLITS, step
        )
        cost = max(cost, kv_read) + tail_cost + kv_read + _TAIL_LAUNCH_TILES
        launches = (
            _Launch(0, rows - tail, cfg, cfg.splits or splits),
            _Launch(rows - tail, tail, tail_cfg, tail_splits),
        )
        plans["separate"] = (cost, launches)
    return plans


def _check_inputs(q: Tensor, k_cache: Tensor, v_cache: Tensor, key_bound: int, visibility) -> None:
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.shape != k_cache.shape:
        raise RuntimeError(
            f"tree attention wants q [Hq, N, D] and k/v caches [Hkv, S_max, D] of one shape, got "
            f"q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}"
        )
    hq, n, d = q.shape
    hkv, s_max, dk = k_cache.shape
    if dk != d or hq % hkv:
        raise RuntimeError(
            f"tree attention needs equal head dims and Hq % Hkv == 0, got q {tuple(q.shape)}, k {tuple(k_cache.shape)}"
        )
    if not n <= key_bound <= s_max:
        raise RuntimeError(
            f"a key bound of {key_bound} rows (context + {n} tree rows) does not fit the cache of {s_max} rows"
        )
    if d < 16:
        raise RuntimeError(f"tree attention needs head_dim >= 16 (tl.dot tiles), got {d}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        size = cache.element_size()
        if (
            cache.stride(-1) != 1
            or cache.data_ptr() % 16
            or any(st * size % 16 for st in cache.stride()[:-1])
        ):
            raise RuntimeError(
                f"tree attention reads {name} through TMA, which needs a unit last stride and 16-byte aligned "
                f"base and strides; got strides {cache.stride()} ({size}-byte elements): pass a contiguous cache "
                f"with head_dim * element size a multiple of 16"
            )
    if visibility is not None and visibility.num_nodes != n:
        raise RuntimeError(f"visibility describes {visibility.num_nodes} nodes but q has {n} rows")


def _kv_descriptor(caches: Tensor, key_bound: int, block_n: int, d_pad: int) -> TensorDescriptor:
    """A TMA descriptor over [S, Hkv, key_bound, D] caches: rows past the bound read as zeros, rows
    between a live length and the bound are masked, and K/V addressing costs no registers."""
    s, hkv, _, d = caches.shape
    return TensorDescriptor(caches, [s, hkv, key_bound, d], list(caches.stride()), [1, 1, block_n, d_pad])


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    context_len: int | Tensor,
    visibility: TreeVisibility | None,
    scale: float,
    config: AttentionConfig | None = None,
    key_bound: int | None = None,
    all_visible: bool = False,
    window: int | None = None,
) -> Tensor:
    """q [Hq, N, D] over cache rows [0, context_len) plus the visible tree rows; returns [Hq, N, D].

    ``context_len``: an int, or a 0-d int64 device tensor (read by the kernel, so a captured CUDA
    graph serves every length up to ``key_bound``, the static bound on context + N that sizes the
    grid). ``all_visible``: every new row sees every new row (a drafter block), else ``visibility``
    (None: causal). ``window``: only keys fewer than ``window`` positions from the query are seen
    (a drafter's sliding layers; row i's position is context_len + i). The result is a [Hq, N, D]
    view of an [N, Hq, D] buffer, so that merging the heads back into [N, Hq * D] is free.
    """
    hq, n, d = q.shape
    if isinstance(context_len, int):
        key_bound = context_len + n if key_bound is None else key_bound
        if context_len < 0 or context_len + n > key_bound:
            raise RuntimeError(f"context_len {context_len} + {n} tree rows exceeds the key bound {key_bound}")
        context_len = torch.full((), context_len, dtype=torch.int64, device=q.device)
    elif key_bound is None:
        raise RuntimeError("a device context length needs a static key_bound (the most keys it can reach)")
    _check_inputs(q, k_cache, v_cache, key_bound, visibility)
    hkv = k_cache.shape[0]
    group = hq // hkv
    d_pad = max(16, next_pow2(d))
    arch = device_row(q.device, d)
    cfg = config or _default_config(n * group, arch)
    if window is not None and window < 1:
        raise RuntimeError(f"a sliding window must be at least 1 position, got {window}")
    keys = key_bound if window is None else min(key_bound, window + n + cfg.block_n)  # keys a row can see
    tail_cfg = AttentionConfig(*arch.tail)
    launches = _plan(
        n * group,
        group,
        keys,
        hkv,
        cfg,
        num_sms(q.device),
        tail_cfg,
        k_cache.element_size(),
    )

    out = torch.empty(n, hq, d, device=q.device, dtype=q.dtype).transpose(0, 1)
    bits = visibility.bits if visibility is not None else q  # q: a placeholder, never read
    partials = []
    for launch in launches:
        c = launch.config
        splits = min(launch.splits, cdiv(keys, c.block_n))
        node0 = launch.row0 // group
        if splits > 1:
            part_acc = torch.empty(splits, hq, n - node0, d_pad, device=q.device, dtype=torch.float32)
            part_ml = torch.empty(splits, hq, n - node0, 2, device=q.device, dtype=torch.float32)
        else:
            part_acc = part_ml = out  # unused: this launch writes out directly
        partials.append(_Partials(part_acc, part_ml, splits, node0))
        _tree_attention_kernel[(cdiv(launch.rows, c.block_m), hkv, splits)](
            q,
            _kv_descriptor(k_cache[None], key_bound, c.block_n, d_pad),
            _kv_descriptor(v_cache[None], key_bound, c.block_n, d_pad),
            bits,
            out,
            part_acc,
            part_ml,
            None,
            None,
            0,
            *q.stride(),
            0,
            *out.stride(),
            0,
            bits.stride(0),
            part_acc.stride(0),
            0,
            *part_acc.stride()[1:3],
            n,
            launch.row0,
            node0,
            context_len,
            scale * _LOG2E,
            hkv,
            GROUP=group,
            HEAD_DIM=d,
            D_PAD=d_pad,
            BLOCK_M=c.block_m,
            BLOCK_N=c.block_n,
            TREE=visibility is not None,
            ALL=all_visible,
            WINDOW=window or 0,
            SPLIT=splits > 1,
            PRECISION=dot_precision(q.dtype),
            PDL=pdl.enabled(q.device),
            num_warps=c.num_warps,
            num_stages=c.num_stages,
            **pdl.seam_launch_options(q.device, n),
        )
    split = [p for p in partials if p.splits > 1]
    if split:
        # a launch that did not split (or a missing tail) merges no row; fp32 buffers of one that
        # did stand in for its pointers
        main, tail = (
            p if p.splits > 1 else p._replace(acc=split[0].acc, ml=split[0].ml)
            for p in (*partials, _Partials(out, out, 1, n))[:2]
        )
        _merge(main, tail, out)
    return out


def tree_attention_parts(
    q: Tensor,
    k_caches: Tensor,
    v_caches: Tensor,
    slots: Tensor | slice,
    parts: PartsVisibility,
    scale: float,
    config: AttentionConfig | None = None,
) -> Tensor:
    """``tree_attention`` of P sequences in one launch (a batched pass: one launch per layer, not
    one per sequence), each over its own cache slot, context length, rows and visibility.

    q [P, Hq, N, D]: sequence p's first ``parts.rows[p]`` rows, then padding; k_caches, v_caches:
    one layer of every slot [S, Hkv, S_max, D] with the new rows written; ``slots`` [P] (device),
    or a slice of consecutive slots. The kernel folds the sequence into the KV-head grid axis and
    reads its slot, rows and length from ``parts``, so nothing syncs the host. Returns
    [P, Hq, N, D] (padding rows undefined), a view of an [Hq, P, N, D] buffer so that gathering
    the real rows back into [Hq, T, D] is free.
    """
    if q.dim() != 4 or k_caches.dim() != 4:
        raise RuntimeError(
            f"batched tree attention wants q [P, Hq, N, D] and caches [S, Hkv, S_max, D], got "
            f"q {tuple(q.shape)}, k {tuple(k_caches.shape)}"
        )
    p, hq, n, d = q.shape
    if parts.rows.shape != (p,) or (parts.bits is not None and parts.bits.shape[:2] != (p, n)):
        raise RuntimeError(
            f"the parts describe {parts.rows.shape[0]} sequences"
            f"{'' if parts.bits is None else f' of {parts.bits.shape[1]} rows'} but q has {p} of {n} rows"
        )
    slot_ids = None  # a slice reads a view of its slots: sequence p is slot p of the view
    if isinstance(slots, slice):
        k_caches, v_caches = k_caches[slots], v_caches[slots]
    else:
        slot_ids = slots
    _check_inputs(q[0], k_caches[0], v_caches[0], parts.keys, None)
    if any(c.stride(0) * c.element_size() % 16 for c in (k_caches, v_caches)):
        raise RuntimeError(
            f"TMA needs 16-byte aligned slot strides, got {k_caches.stride()}, {v_caches.stride()}"
        )
    hkv = k_caches.shape[1]
    group = hq // hkv
    d_pad = max(16, next_pow2(d))
    cfg = config or _default_config(n * group, device_row(q.device, d))
    window = parts.window
    keys = parts.keys if window is None else min(parts.keys, window + n + cfg.block_n)  # keys a row can see
    m_tiles = cdiv(n * group, cfg.block_m)
    _, splits = _split_cost(m_tiles * hkv * p, cdiv(keys, cfg.block_n), num_sms(q.device))
    splits = min(cfg.splits or splits, cdiv(keys, cfg.block_n))

    out = torch.empty(hq, p, n, d, device=q.device, dtype=q.dtype).transpose(0, 1)
    bits = parts.bits if parts.bits is not None else q  # q: a placeholder, never read
    if splits > 1:
        part_acc = torch.empty(splits, hq, p, n, d_pad, device=q.device, dtype=torch.float32)
        part_ml = torch.empty(splits, hq, p, n, 2, device=q.device, dtype=torch.float32)
        ps, ph, pz, pn = part_acc.stride()[:4]
    else:
        part_acc = part_ml = out  # unused: the launch writes out directly
        ps = ph = pz = pn = 0
    _tree_attention_kernel[(m_tiles, p * hkv, splits)](
        q,
        _kv_descriptor(k_caches, parts.keys, cfg.block_n, d_pad),
        _kv_descriptor(v_caches, parts.keys, cfg.block_n, d_pad),
        bits,
        out,
        part_acc,
        part_ml,
        slot_ids,
        parts.rows,
        *q.stride(),
        *out.stride(),
        *bits.stride()[:2],
        ps,
        pz,
        ph,
        pn,
        n,
        0,
        0,
        parts.context_lens,
        scale * _LOG2E,
        hkv,
        GROUP=group,
        HEAD_DIM=d,
        D_PAD=d_pad,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        TREE=parts.bits is not None,
        ALL=parts.all_visible,
        WINDOW=window or 0,
        SPLIT=splits > 1,
        PRECISION=dot_precision(q.dtype),
        PDL=pdl.enabled(q.device),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl.seam_launch_options(q.device, p * n),
    )
    if splits > 1:  # the sequences' rows side by side: [splits, Hq, P * N, .] into [Hq, P * N, D]
        rows = _Partials(
            part_acc.view(splits, hq, p * n, d_pad), part_ml.view(splits, hq, p * n, 2), splits, 0
        )
        _merge(rows, rows._replace(node0=p * n), out.transpose(0, 1).view(hq, p * n, d))  # no tail rows
    return out


def _merge(main: _Partials, tail: _Partials, out: Tensor) -> None:
    """The split-K partials of a main launch and of a tail launch (its rows from ``tail.node0``)
    merged into ``out`` [Hq, N, D]."""
    hq, n, head_dim = out.shape
    d_pad = main.acc.shape[-1]
    block_r, splits_c = merge_tiles(max(main.splits, tail.splits), d_pad)
    _merge_splits_kernel[(cdiv(n, block_r), hq)](
        main.acc,
        main.ml,
        tail.acc,
        tail.ml,
        out,
        *main.acc.stride()[:3],
        *tail.acc.stride()[:3],
        *out.stride(),
        n,
        main.splits,
        tail.splits,
        tail.node0,
        HEAD_DIM=head_dim,
        D_PAD=d_pad,
        BLOCK_R=block_r,
        SPLITS_C=splits_c,
        PDL=pdl.enabled(out.device),
        num_warps=4,
        **pdl.seam_launch_options(out.device, n),
    )


def tree_visibility(parents: Tensor, depth: Tensor) -> TreeVisibility:
    """Ancestor-or-self bitmasks from ``parents`` (parents[i] < i, root -1) and ``depth``, on the device."""
    if parents.dim() != 1 or depth.shape != parents.shape:
        raise RuntimeError(
            f"parents and depth must be [N], got {tuple(parents.shape)} and {tuple(depth.shape)}"
        )
    n = parents.shape[0]
    words = cdiv(n, 32)
    bits = torch.empty(n, words, device=parents.device, dtype=torch.int32)
    _visibility_kernel[(n,)](
        parents,
        depth,
        bits,
        bits.stride(0),
        WORDS=words,
        WORDS_PAD=next_pow2(words),
        num_warps=1,
    )
    return TreeVisibility(bits)


def parts_visibility(
    rows: Sequence[int],
    context_lens: Sequence[int] | Tensor,
    keys: int,
    trees: Sequence[TreeVisibility | None],
    all_visible: bool,
    window: int | None,
    device: torch.device,
) -> PartsVisibility:
    """The ``PartsVisibility`` of P sequences of ``rows`` new rows after ``context_lens`` (at most
    ``keys`` in all): each a tree (its bitmasks) or causal (None). When some are trees, the causal
    ones get a chain's bitmasks, so that one launch describes them all. ``context_lens`` may already
    be the int64 [P] device tensor (a graph's buffer: nothing is copied from the host)."""
    p, n = len(rows), max(rows)
    bits = None
    if any(t is not None for t in trees):
        bits = _chain_bits(n, device).repeat(p, 1, 1)  # [P, N, W]
        for i, (m, tree) in enumerate(zip(rows, trees, strict=True)):
            if tree is not None:
                if tree.num_nodes != m:
                    raise RuntimeError(
                        f"sequence {i}'s visibility describes {tree.num_nodes} nodes, not its {m} rows"
                    )
                bits[i, :m] = 0
                bits[i, :m, : tree.bits.shape[1]] = tree.bits
    uniform = all(m == n for m in rows)  # (a fill, not a copy from the host: a graph can capture it)
    return PartsVisibility(
        torch.full((p,), n, dtype=torch.int32, device=device)
        if uniform
        else torch.tensor(rows, dtype=torch.int32, device=device),
        context_lens
        if isinstance(context_lens, Tensor)
        else torch.tensor(context_lens, dtype=torch.int64, device=device),
        keys,
        bits,
        all_visible,
        window,
    )


def _chain_bits(n: int, device: torch.device) -> Tensor:
    """A causal chain's ancestor-or-self bitmasks, int32 [N, ceil(N / 32)]: bit j of row i iff j <= i."""
    words = cdiv(n, 32)
    j = torch.arange(words * 32, device=device)
    seen = (j[None, :] <= torch.arange(n, device=device)[:, None]).view(n, words, 32).to(torch.int64)
    packed = (seen << torch.arange(32, device=device)).sum(-1)  # in [0, 2^32): int32's bit pattern
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def ancestors_reference(parents: Tensor) -> Tensor:
    """Dense ancestor-or-self matrix (bool [N, N]) by walking parents on the host: the test oracle."""
    n = parents.shape[0]
    par = parents.tolist()
    vis = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            vis[i, j] = True
            j = par[j]
    return vis.to(parents.device)


def tree_attention_reference(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, context_len: int, parents: Tensor | None, scale: float
) -> Tensor:
    """SDPA in fp32 with the dense mask built from ``parents`` (None: causal chain)."""
    hq, n, _ = q.shape
    hkv = k_cache.shape[0]
    total = context_len + n
    k = k_cache[:, :total].float().repeat_interleave(hq // hkv, dim=0)
    v = v_cache[:, :total].float().repeat_interleave(hq // hkv, dim=0)
    if parents is None:
        tree = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    else:
        tree = ancestors_reference(parents)
    mask = torch.cat([torch.ones(n, context_len, dtype=torch.bool, device=q.device), tree], dim=1)
    return F.scaled_dot_product_attention(q.float(), k, v, attn_mask=mask, scale=scale).to(q.dtype)


def attention_flops(hq: int, n: int, context_len: int, head_dim: int) -> float:
    """Useful FLOPs of tree attention if every query saw every key (the dense-SDPA count)."""
    return 4.0 * hq * n * (context_len + n) * head_dim


__all__ = [
    "AttentionConfig",
    "PartsVisibility",
    "TreeVisibility",
    "ancestors_reference",
    "attention_flops",
    "parts_visibility",
    "tree_attention",
    "tree_attention_parts",
    "tree_attention_reference",
    "tree_visibility",
]
