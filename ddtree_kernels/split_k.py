"""Split-K for the linears: K cut across programs, whose fp32 partials the last one to finish sums.

When a projection's output columns alone cannot fill the GPU (decode rows of a 4096-column
``o_proj``, a 65-row tree through a 5120-column GEMM), its K range is split across programs
(``skinny_matmul``, ``fp8_skinny``, ``fp8_gemm``), each writing an fp32 partial. A second kernel
used to sum them: in an 8B `ar` step that was 108 extra launches, 1.3 µs each graphed on the H200
(benchmarks/RESULTS.md). Now each split stores its partial and bumps its output tile's arrival
count; the split that arrives last reads all partials back, in split order (so the sum does not
depend on which split finished last), writes the output and re-arms the count to zero for the next
launch or graph replay. The counts live in one zeroed int32 buffer per device: a device's linears
run one after another on one stream, so no two launches hold a count at once.
"""

from __future__ import annotations

from functools import cache

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import cdiv

MAX_TILES = 8192  # output tiles of one split launch (the default configs split only below ~3 programs an SM)


def split_span(k: int, split_k: int, block_k: int) -> int:
    """K per split program: whole ``block_k`` steps (the last split's range may run past K)."""
    return cdiv(cdiv(k, split_k), block_k) * block_k


def partials(out: Tensor, split_k: int) -> Tensor:
    """The fp32 partials [split_k, T, N] of a split launch into ``out`` [T, N], laid out as
    ``store_tile`` reads them (``out`` itself stands in, unused, when K is not split)."""
    return torch.empty(split_k, *out.shape, device=out.device, dtype=torch.float32) if split_k > 1 else out


@cache
def arrival_counts(device: torch.device) -> Tensor:
    """The device's zeroed per-tile arrival counts, made once, before any graph capture (a count
    made inside a capture would live in that graph's memory pool)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "split-K arrival counts must be made before a CUDA graph capture: run the launch once eagerly"
        )
    return torch.zeros(MAX_TILES, dtype=torch.int32, device=device)


def checked_tiles(tiles: int, split_k: int) -> int:
    """The launch's output tile count, if its splits' arrival counts fit the buffer."""
    if split_k > 1 and tiles > MAX_TILES:
        raise RuntimeError(f"a split-K launch of {tiles} output tiles exceeds the {MAX_TILES} arrival counts")
    return tiles


@triton.jit
def arrived_last(COUNTS, slot, arrivals):
    """After this program's stores: whether it is the last of ``arrivals`` programs to bump count
    ``slot``, so that every other program's stores are visible to it (read them with ``.cg``: from L2,
    where the other SMs' stores are, never a stale L1 line). The last one re-arms the count to zero
    for the next launch: no program of this one touches it again."""
    tl.debug_barrier()  # every thread's stores are written before the count (a release) says so
    last = tl.atomic_add(COUNTS + slot, 1) == arrivals - 1  # acquire: the other programs' stores
    if last:
        tl.store(COUNTS + slot, 0)
    return last


@triton.jit
def store_tile(
    acc, OUT, PART, COUNTS, tile, rows, cols, mask, stride_ot, n_rows, n_cols, SPLIT: tl.constexpr
):
    """Write an fp32 tile ``acc`` [rows, cols] of the output: directly, or (SPLIT) as this split's
    partial, the tile's last split summing them all into OUT."""
    out = OUT + rows[:, None] * stride_ot + cols[None, :]
    if SPLIT:
        part = PART + rows[:, None] * n_cols + cols[None, :]
        split_stride = n_rows * n_cols
        tl.store(part + tl.program_id(1) * split_stride, acc, mask=mask)
        splits = tl.num_programs(1)
        if arrived_last(COUNTS, tile, splits):
            total = tl.zeros_like(acc)
            for s in range(0, splits):
                total += tl.load(part + s * split_stride, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out, total.to(OUT.dtype.element_ty), mask=mask)
    else:
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=mask)
