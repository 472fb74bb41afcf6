"""Per-position top-k log-probabilities of the drafter's logits, without a sort of the vocabulary.

DDTree's tree build (ddtree_kernels/tree_build.py) needs, for each draft position d, the k = min(B, V) best
tokens and their log-probabilities ``log softmax(x_d)`` sorted descending. ``torch.topk`` over
V = 152k costs far more than reading the row; here each row is read twice and only ~M candidates
are ever ranked.

**Why a chunk threshold is exact.** Split a row into M strided chunks, chunk c = {i : i % M = c}
(strided, so that a correlation of logits with token id does not pile the top tokens into one
chunk). If tau is the k-th largest of the M chunk maxima, the k chunks at or above tau hold k
distinct elements >= tau, so the row's k-th largest value is >= tau: every top-k element is a
*candidate* (x >= tau). With M >= 2k and unstructured data the candidates number
~M ln(M / (M - k)) <= M ln 2 (~710 for k = 512, M = 1024), CAP = 4 M by default. For V <= M each
chunk is one element and tau is the k-th value.

Order: key = monotone int32 image of the fp32 value << 32 | (2^32 - 1 - index), so equal values
rank lower token index first and keys are distinct. Output values are ``x - lse`` with the row's
log-sum-exp from an online (max, sum exp) pass, like ``torch.log_softmax``.

Five launches, no host sync (stream order is the only barrier). Loops that load are not
software-pipelined by Triton, so each program issues few, wide loads (T tiles of M at once):
  1. ``_partials_kernel`` grid (D, P): each program reads its 2T tiles once; per lane the running
     max (the chunk maximum over its tiles) and an online sum exp. Writes [D, P, M] chunk maxima
     and [D, P] (max, sum exp). P ~ V / (8 M): 19 programs a row at V = 152k, M = 1024.
  2. ``_threshold_kernel`` grid (D,): lse; chunk maxima = max over P; tau = the k-th largest,
     rounded down to bf16 resolution (a lower bound is all exactness needs), by a 16-way search on
     the int32 image (4 rounds of 16 compare-and-count probes, no sort); zeroes the row's counter.
  3. ``_collect_kernel`` grid (D, P): every element >= tau appended (key) to a [D, CAP] buffer,
     each hit taking its slot by an atomic on the row's counter, which keeps counting past CAP.
  4. ``_exact_kernel`` grid (D,): nothing unless count > CAP (massive ties, e.g. equal logits):
     then the exact k-th key by bisection (value bits, then index among the tied values) with
     counting passes over the row, and the buffer is rewritten with exactly the top k. Slow, exact.
  5. ``_rank_kernel`` grid (D, CAP / 64): rank of each candidate among the row's candidates
     (# larger keys, 256 at a time); rank < k lands at [d, rank] as (value - lse, token).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import cdiv, next_pow2


@triton.jit
def _mono(x):
    """int32 image of fp32 that orders like the floats (larger float, larger int)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _unmono(m):
    """fp32 from its ``_mono`` image (the map is an involution on the bits)."""
    return tl.where(m >= 0, m, m ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _key(mono, index):
    """Distinct int64 order key: value first, then the lower token index."""
    return (mono.to(tl.int64) << 32) | (4294967295 - index.to(tl.int64))


@triton.jit
def _partials_kernel(
    X,
    PART_MAX,
    PART_M,
    PART_S,
    stride_row,
    vocab,
    tiles_per_prog,
    n_prog,
    M: tl.constexpr,
    T: tl.constexpr,
):
    """Chunk maxima and an online (max, sum exp) over one program's tiles, T tiles per load."""
    row = tl.program_id(0)
    p = tl.program_id(1)
    run_max = tl.full([M], float("-inf"), tl.float32)
    run_sum = tl.zeros([M], tl.float32)
    for t0 in range(p * tiles_per_prog, (p + 1) * tiles_per_prog, T):
        i = t0 * M + tl.arange(0, T * M)
        x = tl.load(X + row * stride_row + i, mask=i < vocab, other=float("-inf")).to(tl.float32)
        x = tl.reshape(x, [T, M])  # [t, j]: element (t0 + t) * M + j, chunk j
        new = tl.maximum(run_max, tl.max(x, 0))
        base = tl.where(new > float("-inf"), new, 0.0)  # all -inf so far: the sum stays 0, no NaN
        run_sum = run_sum * tl.exp(run_max - base) + tl.sum(tl.exp(x - base[None, :]), 0)
        run_max = new
    tl.store(PART_MAX + (row * n_prog + p) * M + tl.arange(0, M), run_max)
    m = tl.max(run_max, 0)
    s = tl.sum(run_sum * tl.exp(run_max - tl.where(m > float("-inf"), m, 0.0)), 0)
    tl.store(PART_M + row * n_prog + p, m)
    tl.store(PART_S + row * n_prog + p, s)


@triton.jit
def _threshold_kernel(
    PART_MAX,
    PART_M,
    PART_S,
    TAU,
    LSE,
    COUNT,
    n_prog,
    k,
    M: tl.constexpr,
    P_POW2: tl.constexpr,
    P_BLOCK: tl.constexpr,
    ROUNDS: tl.constexpr,
):
    """Row lse and tau = the k-th largest chunk maximum (16-way search on the int32 image)."""
    row = tl.program_id(0)
    lane = tl.arange(0, M)
    chunk_max = tl.full([M], float("-inf"), tl.float32)
    for p0 in range(0, n_prog, P_BLOCK):
        p = p0 + tl.arange(0, P_BLOCK)
        part = tl.load(
            PART_MAX + (row * n_prog + p[:, None]) * M + lane[None, :],
            mask=(p < n_prog)[:, None],
            other=float("-inf"),
        )
        chunk_max = tl.maximum(chunk_max, tl.max(part, 0))
    mono = _mono(chunk_max).to(tl.int64)
    # invariant: count(mono >= lo) >= k > count(mono >= lo + width); 16 probes a round cut the
    # width 2^32 by 16. After ROUNDS rounds lo is a lower bound within 2^(32 - 4 ROUNDS) of the
    # k-th largest image (8 rounds: exact); 4 rounds stop at bf16 resolution, which admits a few
    # more candidates for half the rounds
    lo = tl.zeros([], tl.int64) - 2147483648
    q = tl.arange(0, 16).to(tl.int64)
    for shift in tl.static_range(28, 28 - 4 * ROUNDS, -4):
        probe = lo + (q << shift)
        count = tl.sum((mono[None, :] >= probe[:, None]).to(tl.int32), 1)
        lo += tl.max(tl.where(count >= k, q, 0), 0) << shift
    tl.store(TAU + row, lo.to(tl.int32))
    j = tl.arange(0, P_POW2)
    pm = tl.load(PART_M + row * n_prog + j, mask=j < n_prog, other=float("-inf"))
    ps = tl.load(PART_S + row * n_prog + j, mask=j < n_prog, other=0.0)
    m = tl.max(pm, 0)
    s = tl.sum(ps * tl.exp(pm - tl.where(m > float("-inf"), m, 0.0)), 0)
    tl.store(LSE + row, m + tl.log(s))
    tl.store(COUNT + row, 0)


@triton.jit
def _collect_kernel(
    X,
    TAU,
    COUNT,
    CAND,
    stride_row,
    vocab,
    tiles_per_prog,
    cap,
    M: tl.constexpr,
    T: tl.constexpr,
):
    """Append the key of every element >= tau: each hit takes its slot with its own atomic.

    Hits are rare (~M ln 2 a row over all programs), so per-element atomics on the row counter
    cost less than a program-wide count and prefix sum per load.
    """
    row = tl.program_id(0)
    p = tl.program_id(1)
    tau = tl.load(TAU + row)
    for t0 in range(p * tiles_per_prog, (p + 1) * tiles_per_prog, T):
        i = t0 * M + tl.arange(0, T * M)
        ok = i < vocab
        mono = _mono(tl.load(X + row * stride_row + i, mask=ok, other=float("-inf")).to(tl.float32))
        hit = ok & (mono >= tau)
        pos = tl.atomic_add(COUNT + row + tl.zeros_like(i), 1, mask=hit, sem="relaxed")
        tl.store(CAND + row * cap + pos, _key(mono, i), mask=hit & (pos < cap))


@triton.jit
def _at_or_above(X, stride_row, vocab, i, lo_mono, lo_index):
    """Images of the program's row at positions i, and whether (value, -index) >= (lo_mono, -lo_index)."""
    ok = i < vocab
    mono = _mono(tl.load(X + tl.program_id(0) * stride_row + i, mask=ok, other=float("-inf")).to(tl.float32))
    return mono, ok & ((mono > lo_mono) | ((mono == lo_mono) & (i <= lo_index)))


@triton.jit
def _count_ge(X, stride_row, vocab, lo_mono, lo_index, M: tl.constexpr):
    """# row elements whose (value, -index) is >= (lo_mono, -lo_index), by one pass."""
    total = tl.zeros([], tl.int32)
    for t0 in range(0, vocab, M):
        _, hit = _at_or_above(X, stride_row, vocab, t0 + tl.arange(0, M), lo_mono, lo_index)
        total += tl.sum(hit.to(tl.int32), 0)
    return total


@triton.jit
def _exact_kernel(
    X,
    COUNT,
    CAND,
    stride_row,
    vocab,
    k,
    cap,
    index_bits,
    M: tl.constexpr,
):
    """Only when the buffer overflowed: rewrite it with exactly the row's top k by bisection."""
    row = tl.program_id(0)
    if tl.load(COUNT + row) > cap:
        # value: the k-th largest image v (largest lo with count(mono >= lo) >= k)
        lo = tl.zeros([], tl.int64) - 2147483648
        hi = tl.zeros([], tl.int64) + 2147483648
        for _ in range(32):
            mid = (lo + hi) >> 1
            enough = _count_ge(X, stride_row, vocab, mid.to(tl.int32), vocab, M) >= k
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid)
        v = lo.to(tl.int32)
        # index: the smallest j with count(mono > v, or mono == v and i <= j) >= k
        j_lo = tl.zeros([], tl.int32) - 1
        j_hi = tl.zeros([], tl.int32) + vocab - 1
        for _ in range(index_bits):
            mid = (j_lo + j_hi) >> 1
            enough = _count_ge(X, stride_row, vocab, v, mid, M) >= k
            j_lo = tl.where(enough, j_lo, mid)
            j_hi = tl.where(enough, mid, j_hi)
        off = tl.zeros([], tl.int32)
        for t0 in range(0, vocab, M):
            i = t0 + tl.arange(0, M)
            mono, take = _at_or_above(X, stride_row, vocab, i, v, j_hi)
            pos = off + tl.cumsum(take.to(tl.int32), 0) - 1
            tl.store(CAND + row * cap + pos, _key(mono, i), mask=take)
            off += tl.sum(take.to(tl.int32), 0)
        tl.store(COUNT + row, off)


@triton.jit
def _rank_kernel(
    CAND,
    COUNT,
    LSE,
    VALS,
    TOKS,
    k,
    cap,
    BLOCK_X: tl.constexpr,
    BLOCK_Y: tl.constexpr,
):
    """Candidate x lands at slot rank(x) = #{y : key_y > key_x} when that is < k."""
    row = tl.program_id(0)
    x0 = tl.program_id(1) * BLOCK_X
    count = tl.minimum(tl.load(COUNT + row), cap)
    xs = x0 + tl.arange(0, BLOCK_X)
    x_ok = xs < count
    kx = tl.load(CAND + row * cap + xs, mask=x_ok, other=0)
    rank = tl.zeros([BLOCK_X], tl.int32)
    for y0 in range(0, tl.where(x0 < count, count, 0), BLOCK_Y):
        ys = y0 + tl.arange(0, BLOCK_Y)
        ky = tl.load(CAND + row * cap + ys, mask=ys < count, other=-9223372036854775807 - 1)
        rank += tl.sum((ky[None, :] > kx[:, None]).to(tl.int32), 1)
    keep = x_ok & (rank < k)
    value = _unmono((kx >> 32).to(tl.int32)) - tl.load(LSE + row)
    token = 4294967295 - (kx & 4294967295)
    tl.store(VALS + row * k + rank, value, mask=keep)
    tl.store(TOKS + row * k + rank, token, mask=keep)


_THRESHOLD_ROUNDS = 4


class TopkLaunch(NamedTuple):
    """``marginal_topk``'s launch choices for one (V, k); ``ddtree_kernels.aot_specs`` uses the same."""

    m: int  # strided chunks: >= 2k (>= 1024), at most the vocabulary padded to a power of two
    tiles_per_prog: int  # two loads a program: enough programs to fill the GPU at D = 15
    n_prog: int  # programs a row in the partials and collect passes
    cap: int  # candidate buffer per row
    kernels: dict[str, tuple[dict[str, int], int]]  # constexprs and warps of each of the five kernels


def topk_launch(vocab: int, k: int, cap: int | None = None, interpret: bool = False) -> TopkLaunch:
    """Chunks, tiles a program, programs, buffer (default 4 M), and each kernel's constexprs and warps.

    ``interpret``: the CPU interpreter runs programs one by one, so the rank pass takes few big
    x-blocks there; a GPU takes small ones over many programs (those past the row's count exit at once).
    """
    m = min(max(1024, next_pow2(2 * k)), next_pow2(vocab))
    n_tiles = cdiv(vocab, m)
    t = min(4096 // m or 1, next_pow2(n_tiles))  # tiles a load: 4096 elements at most
    tiles_per_prog = 2 * t
    n_prog = cdiv(n_tiles, tiles_per_prog)
    warps = 8 if m >= 2048 else 4
    p_pow2 = next_pow2(n_prog)
    kernels = dict(
        partials=(dict(M=m, T=t), warps),
        threshold=(dict(M=m, P_POW2=p_pow2, P_BLOCK=min(8, p_pow2), ROUNDS=_THRESHOLD_ROUNDS), 8),
        collect=(dict(M=m, T=t), 2 * warps),
        exact=(dict(M=m), warps),
        rank=(dict(BLOCK_X=1024 if interpret else 64, BLOCK_Y=256), 4),
    )
    return TopkLaunch(m, tiles_per_prog, n_prog, 4 * m if cap is None else cap, kernels)


def marginal_topk(logits: Tensor, k: int, cap: int | None = None) -> tuple[Tensor, Tensor]:
    """vals [D, k] fp32 log-probabilities sorted descending and toks [D, k] int64 of each row.

    Exact: the same tokens as ``torch.log_softmax(logits.float(), -1).topk(k)``, equal values in
    lower-token-first order. ``cap``: candidate buffer per row (default 4 M); a row with more
    candidates takes the slow exact path (tests pass a small one to force it).
    """
    if logits.dim() != 2:
        raise ValueError(f"marginal_topk expects logits [D, V], got shape {tuple(logits.shape)}")
    rows, vocab = logits.shape
    if not 1 <= k <= vocab:
        raise ValueError(f"k = {k} is outside 1..{vocab} (the vocabulary of logits {tuple(logits.shape)})")
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    device = x.device
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    m, tiles_per_prog, n_prog, cap, kernels = topk_launch(vocab, k, cap, interpret)
    if cap < k:
        raise ValueError(f"candidate buffer cap = {cap} must hold k = {k} entries")
    part_max = torch.empty(rows, n_prog, m, device=device)
    part_m = torch.empty(rows, n_prog, device=device)
    part_s = torch.empty(rows, n_prog, device=device)
    tau = torch.empty(rows, dtype=torch.int32, device=device)
    lse = torch.empty(rows, device=device)
    count = torch.empty(rows, dtype=torch.int32, device=device)
    cand = torch.empty(rows, cap, dtype=torch.int64, device=device)
    vals = torch.empty(rows, k, device=device)
    toks = torch.empty(rows, k, dtype=torch.int64, device=device)
    stride = x.stride(0)
    meta, warps = kernels["partials"]
    _partials_kernel[(rows, n_prog)](
        x,
        part_max,
        part_m,
        part_s,
        stride,
        vocab,
        tiles_per_prog,
        n_prog,
        **meta,
        num_warps=warps,
    )
    meta, warps = kernels["threshold"]
    _threshold_kernel[(rows,)](
        part_max,
        part_m,
        part_s,
        tau,
        lse,
        count,
        n_prog,
        k,
        **meta,
        num_warps=warps,
    )
    meta, warps = kernels["collect"]
    _collect_kernel[(rows, n_prog)](
        x,
        tau,
        count,
        cand,
        stride,
        vocab,
        tiles_per_prog,
        cap,
        **meta,
        num_warps=warps,
    )
    meta, warps = kernels["exact"]
    _exact_kernel[(rows,)](x, count, cand, stride, vocab, k, cap, vocab.bit_length(), **meta, num_warps=warps)
    meta, warps = kernels["rank"]
    _rank_kernel[(rows, cdiv(cap, meta["BLOCK_X"]))](
        cand,
        count,
        lse,
        vals,
        toks,
        k,
        cap,
        **meta,
        num_warps=warps,
    )
    return vals, toks


def marginal_topk_reference(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """PyTorch, the test oracle: a stable descending sort (equal values: lower token first), log_softmax values."""
    x = logits.float()
    toks = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]
    return torch.log_softmax(x, dim=-1).gather(1, toks), toks
