"""KV compaction: move the accepted path's K/V rows into place, every layer, one launch.

After a DDTree round (Ringel & Romano, arXiv 2604.12989) the accepted nodes ``path[0..a)`` sit at
cache rows ``C + path[a]`` (C = context_len); the next round needs them contiguous at ``C + a``.
Node indices grow along a root path (``parents[i] < i``), so ``path[a] >= a``: a row never moves
up, and in a single pass over ``a`` in increasing order no destination overwrites a source that is
still to be read, *provided* each chunk of rows is fully read before it is written. One program
per (layer, KV head) copies its K and V ``path_len`` rows of D elements in chunks of BLOCK_P rows, with
a barrier between a chunk's loads and its stores. Rows with ``path[a] == a`` are skipped.

A batched round (continuous batching) compacts P sequences at once, each in its own cache slot
(``compact_forest``): the same program per (layer and KV head, sequence), the sequence's slot,
context length, path and path length read on the device, so the round's commit is one launch
whatever P, and a CUDA graph serves every outcome.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import next_pow2


@triton.jit
def _compact_kernel(
    K,
    V,
    SLOTS,
    PATH,
    PATH_LEN,
    CTX,
    stride_slot,
    stride_h,
    stride_s,
    stride_d,
    n_path,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BATCHED: tl.constexpr,
):
    head = tl.program_id(0)  # layer * Hkv + kv head: the caches are viewed as [L * Hkv, S_max, D]
    seq = tl.program_id(1)  # a batched round's sequence (0 alone)
    if BATCHED:  # the sequence's cache slot; the caches are viewed as [S, L * Hkv, S_max, D]
        slot = tl.load(SLOTS + seq).to(tl.int64) * stride_slot
        K += slot
        V += slot
    PATH += seq * n_path
    dims = tl.arange(0, D_PAD)
    dim_ok = dims < HEAD_DIM
    length = tl.minimum(tl.load(PATH_LEN + seq).to(tl.int32), n_path)
    context_len = tl.load(CTX + seq)
    for start in range(0, length, BLOCK_P):
        a = start + tl.arange(0, BLOCK_P)
        src = tl.load(PATH + a, mask=a < length, other=0).to(tl.int32)
        move = ((a < length) & (src != a))[:, None] & dim_ok[None, :]
        src_off = head * stride_h + (context_len + src)[:, None] * stride_s + dims[None, :] * stride_d
        dst_off = head * stride_h + (context_len + a)[:, None] * stride_s + dims[None, :] * stride_d
        k_rows = tl.load(K + src_off, mask=move)
        v_rows = tl.load(V + src_off, mask=move)
        tl.debug_barrier()  # every source row of this chunk is read before any is overwritten
        tl.store(K + dst_off, k_rows, mask=move)
        tl.store(V + dst_off, v_rows, mask=move)


def _launch(
    k_caches: Tensor,
    v_caches: Tensor,
    slots: Tensor | None,
    context_lens: Tensor,
    paths: Tensor,
    path_lens: Tensor,
) -> None:
    """One program per (layer and KV head, sequence) over caches [S, L, Hkv, S_max, D]; without
    ``slots`` the one sequence in the one slot given."""
    n_slots, layers, hkv, s_max, d = k_caches.shape
    k4 = k_caches.view(n_slots, layers * hkv, s_max, d)  # view: needs the layer and head dims mergeable
    v4 = v_caches.view(n_slots, layers * hkv, s_max, d)
    if k4.stride() != v4.stride():
        raise RuntimeError(
            f"compact wants k and v caches with equal strides, got {k4.stride()} and {v4.stride()}"
        )
    _compact_kernel[(layers * hkv, paths.shape[0])](
        k4,
        v4,
        paths if slots is None else slots,
        paths,
        path_lens,
        context_lens,
        *k4.stride(),
        paths.shape[1],
        HEAD_DIM=d,
        D_PAD=max(16, next_pow2(d)),
        BLOCK_P=16,
        BATCHED=slots is not None,
        num_warps=4,
    )


def compact(
    k_cache: Tensor, v_cache: Tensor, context_len: int | Tensor, path: Tensor, path_len: Tensor
) -> None:
    """In place: for a < path_len, row ``context_len + path[a]`` -> ``context_len + a`` in [L, Hkv, S_max, D].

    ``context_len``: an int, or a 0-d int64 device tensor (read by the kernel: graph-capturable)."""
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise RuntimeError(
            f"compact wants k/v caches [L, Hkv, S_max, D] of one shape, got {tuple(k_cache.shape)} "
            f"and {tuple(v_cache.shape)}"
        )
    if isinstance(context_len, int):
        if context_len + path.shape[0] > k_cache.shape[2]:
            raise RuntimeError(
                f"context_len {context_len} + {path.shape[0]} path rows exceed the cache's {k_cache.shape[2]} rows"
            )
        context_len = torch.full((), context_len, dtype=torch.int64, device=path.device)
    _launch(k_cache[None], v_cache[None], None, context_len, path[None], path_len)


def compact_forest(
    k_caches: Tensor, v_caches: Tensor, slots: Tensor, context_lens: Tensor, paths: Tensor, path_lens: Tensor
) -> None:
    """``compact`` of P sequences in one launch, sequence p in cache slot ``slots[p]`` of every
    slot's caches [S, L, Hkv, S_max, D]: context_lens, path_lens [P] and paths [P, N] on the device.
    Slots are distinct but for a scratch slot that padding sequences may repeat (its rows come out
    undefined)."""
    p, n = paths.shape
    if k_caches.dim() != 5 or v_caches.shape != k_caches.shape:
        raise RuntimeError(
            f"compact_forest wants k/v caches [S, L, Hkv, S_max, D] of one shape, got "
            f"{tuple(k_caches.shape)} and {tuple(v_caches.shape)}"
        )
    if slots.shape != (p,) or context_lens.shape != (p,) or path_lens.shape != (p,):
        raise RuntimeError(
            f"compact_forest wants slots, context_lens and path_lens [{p}] for paths [{p}, {n}], got "
            f"{tuple(slots.shape)}, {tuple(context_lens.shape)} and {tuple(path_lens.shape)}"
        )
    _launch(k_caches, v_caches, slots, context_lens, paths.contiguous(), path_lens)


def compact_reference(k_cache: Tensor, v_cache: Tensor, context_len: int, path: list[int]) -> None:
    """Row-by-row copy in increasing order on the host-visible tensors (the test oracle)."""
    for a, src in enumerate(path):
        for cache in (k_cache, v_cache):
            cache[:, :, context_len + a] = cache[:, :, context_len + src].clone()


__all__ = ["compact", "compact_forest", "compact_reference"]
