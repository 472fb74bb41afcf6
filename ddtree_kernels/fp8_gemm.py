"""Block-scaled FP8 GEMM: ``x @ W.T`` for the rows of a verify pass or a prefill, on FP8 tensor cores.

The FP8 linear of the checkpoints we serve (fine-grained quantization, DeepSeek-V3, arXiv 2412.19437,
as Qwen's FP8 releases and llm-compressor's FP8_DYNAMIC store it): the weight ``W [N, K]`` is e4m3
with one fp32 scale per ``(block_n, block_k)`` block, ``W = W8 * S_w[n // block_n, k // block_k]``;
activations are quantized on the fly, per row and per group of ``block_k`` columns (one group per
row when the weight has per-channel scales, ``block_k >= K``):

    s_x[t, g] = max(|x[t, group g]|, 1e-10) / 448,    x8 = e4m3(x / s_x)   (round to nearest even)
    out[t, n] = sum_g s_x[t, g] * S_w[n // block_n, g] * sum_{k in g} x8[t, k] * W8[n, k]

The inner sums are exact products of e4m3 values accumulated in fp32 by the tensor cores; the scales are
applied once per group. Where a tile's columns share one weight scale (a 128-column tile inside Qwen's
128-row blocks), the two scales multiply once per row and each element takes one FMA: the per-column form
broadcast the weight scales through shared memory behind a barrier, 245 SASS instructions a K step on
sm_90 against 171 (on the H100: 2-3% off the 27B's verify projections, 9% off the 8B's at 257 rows).
``_act_quant_kernel`` writes x8 and s_x (one program per row and group); ``_fp8_gemm_kernel`` then tiles
``[BLOCK_M, BLOCK_N]`` of the output and walks K in steps of whole groups (or, with per-row groups,
accumulates the whole row unscaled and scales once at the end). Its e4m3 tiles come through TMA
descriptors, which read rows and K past the ends as zeros: no per-element masks or addresses (the
pointer-loaded kernel before it ran 1.07-1.75x slower at a B=64 tree's 65 rows on the H200). When the
tiles leave SMs idle (a 5120-column projection at 65 rows) K is split and each tile's last split sums the
fp32 partials (``split_k.py``). Triton's warp specialization of the K loop (producer/consumer warp
groups, so that the scaling need not wait on each step's product) did not pay on the H100: with Triton
3.6 it failed to compile or never returned, with Triton 3.9 it ran 1.4-1.6x slower on every 4-warp tile
(benchmarks/RESULTS.md, 2026-12-06). ``fp8_skinny`` (ddtree_kernels/fp8_skinny.py) computes the same
function for <= 16 rows.

The kernel that produces the activations can quantize them itself (``quantize_row``: the fused
RMSNorm, SwiGLU and gated norm) and hand both wrappers a ``QuantizedRows``: then no ``act_quant``
launch runs, and the q/k/v or gate/up linears after one norm share one quantization.

The e4m3 rounding is done in fp32 arithmetic (``_round_e4m3``), so the final cast is exact on every
backend: Triton's CPU interpreter rounds fp32 -> e4m3 wrongly where the mantissa carries into the
next binade (7.77 becomes 4, not 8). The PyTorch reference is ``ddtree_runtime/fp8.py`` (the
runtime's CPU path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from ddtree_kernels import pdl
from ddtree_kernels.host import QuantizedRows, cdiv, next_pow2, num_sms
from ddtree_kernels.pdl import release_then_wait
from ddtree_kernels.precision import dot, dot_precision
from ddtree_kernels.split_k import arrival_counts, checked_tiles, partials, split_span, store_tile

QUANT_BLOCK = 1024  # columns per step of the quantization pass over a per-row group


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int  # K per loop step: whole scale groups (128 with per-channel scales)
    num_warps: int
    num_stages: int
    split_k: int = 1


@triton.jit
def _round_e4m3(x, scale):
    """e4m3(x / scale) with round-to-nearest-even and saturation at 448, done exactly in fp32."""
    v = tl.math.div_rn(x, scale)
    a = tl.minimum(tl.abs(v), 448.0)
    exponent = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)  # subnormals: 2^-6
    quantum = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits
    inverse = ((127 + 3 - exponent) << 23).to(tl.float32, bitcast=True)
    rounded = ((a * inverse + 12582912.0) - 12582912.0) * quantum  # 1.5 * 2^23: rint, ties to even
    # v's sign bit onto the magnitude: a tiny negative value rounds to -0 as in PyTorch (a negation
    # compiles to 0 - x on the GPU, which gives +0)
    sign = v.to(tl.int32, bitcast=True) & -2147483648
    return (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True).to(tl.float8e4nv)


@triton.jit
def _group_scale(amax):
    return tl.math.div_rn(tl.maximum(amax, 1e-10), 448.0)


@triton.jit
def quantize_row(x, Q, S, start, n_cols, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    """Quantize a block of one row as ``act_quant`` does: x [BLOCK] (fp32) holds columns
    ``start ..`` (start a multiple of GROUP; columns >= n_cols are ignored); x8 goes to Q + column,
    each group's scale to S + column // GROUP. GROUP >= BLOCK: the block is one whole group."""
    cols = start + tl.arange(0, BLOCK)
    ok = cols < n_cols
    xs = tl.where(ok, x, 0.0)
    if GROUP >= BLOCK:
        scale = _group_scale(tl.max(tl.abs(xs), axis=0))
        tl.store(Q + cols, _round_e4m3(xs, scale), mask=ok)
        tl.store(S + start // GROUP, scale)
    else:
        groups = tl.reshape(xs, [BLOCK // GROUP, GROUP])
        scale = _group_scale(tl.max(tl.abs(groups), axis=1))  # [BLOCK // GROUP]
        q = _round_e4m3(groups, tl.broadcast_to(scale[:, None], [BLOCK // GROUP, GROUP]))
        tl.store(Q + cols, tl.reshape(q, [BLOCK]), mask=ok)
        g = start // GROUP + tl.arange(0, BLOCK // GROUP)
        tl.store(S + g, scale, mask=g * GROUP < n_cols)


@triton.jit
def _act_quant_kernel(
    X,
    Q,
    S,
    stride_x,
    stride_q,
    stride_s,
    n_cols,
    group,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
    PDL: tl.constexpr,
):
    release_then_wait(PDL)  # the linear that reads the rows may start fetching its weight
    row = tl.program_id(0)
    g = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    start = g * group
    end = tl.minimum(start + group, n_cols)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for step in tl.static_range(STEPS):
        cols = start + step * BLOCK + offs
        x = tl.load(X + row * stride_x + cols, mask=cols < end, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = _group_scale(tl.max(amax, axis=0))
    for step in tl.static_range(STEPS):
        cols = start + step * BLOCK + offs
        ok = cols < end
        x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(Q + row * stride_q + cols, _round_e4m3(x, scale), mask=ok)
    tl.store(S + row * stride_s + g, scale)


@triton.jit
def _fp8_gemm_kernel(
    X8,
    X_SCALE,
    W,
    W_SCALE,
    OUT,
    PART,
    COUNTS,
    stride_xs,
    stride_ws,
    stride_ot,
    n_rows,
    n_cols,
    k_total,
    k_per_split,
    block_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_K: tl.constexpr,
    PER_ROW: tl.constexpr,
    TILE_SCALE: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] output tile over this program's K range, its e4m3 tiles fetched by TMA
    descriptors (X8 in [BLOCK_M, GROUP_K] boxes, rows and columns past the ends read as zeros; W in
    [BLOCK_N, GROUP_K]); a split's partial is summed by the tile's last split (``split_k.store_tile``)."""
    # programs walk M fastest: the row tiles that share a weight tile run together, so W is read
    # from memory about once
    num_m = tl.cdiv(n_rows, BLOCK_M)
    pid_m = tl.program_id(0) % num_m
    pid_n = tl.program_id(0) // num_m
    split = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    w_scale_row = W_SCALE + (cols // block_n) * stride_ws  # [BLOCK_N] pointers to each column's scales
    w_scale_tile = W_SCALE + (pid_n * BLOCK_N // block_n) * stride_ws  # the tile's one row of scales
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k0 = split * k_per_split
    for k in range(k0, k0 + k_per_split, BLOCK_K):
        for g in tl.static_range(BLOCK_K // GROUP_K):  # the scale groups of one step
            kk = k + g * GROUP_K
            x8 = X8.load([pid_m * BLOCK_M, kk])
            w = W.load([pid_n * BLOCK_N, kk])
            if PER_ROW:
                acc = dot(x8, tl.trans(w), PRECISION, acc)
            else:
                # a split's last step may lie past K: read the last group's (finite) scales, x8 is 0
                group = tl.minimum(kk // GROUP_K, (k_total - 1) // GROUP_K)
                x_s = tl.load(X_SCALE + rows * stride_xs + group, mask=row_ok, other=0.0)
                if TILE_SCALE:  # one weight scale for the whole tile: one FMA an element
                    row_scale = x_s * tl.load(w_scale_tile + group)
                    acc += dot(x8, tl.trans(w), PRECISION) * row_scale[:, None]
                else:
                    w_s = tl.load(w_scale_row + group, mask=col_ok, other=0.0)
                    acc += dot(x8, tl.trans(w), PRECISION) * x_s[:, None] * w_s[None, :]
    if PER_ROW:
        x_s = tl.load(X_SCALE + rows * stride_xs, mask=row_ok, other=0.0)
        acc = acc * x_s[:, None] * tl.load(w_scale_row, mask=col_ok, other=0.0)[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    store_tile(acc, OUT, PART, COUNTS, tl.program_id(0), rows, cols, mask, stride_ot, n_rows, n_cols, SPLIT)


def check_fp8_operands(
    x: Tensor | QuantizedRows, weight: Tensor, scale: Tensor, block: tuple[int, int]
) -> None:
    """The layout both FP8 kernels read; a RuntimeError with the actual shapes otherwise."""
    n, k = weight.shape
    bn, bk = block
    want_scale = (cdiv(n, bn), cdiv(k, bk))
    if (
        len(x.shape) != 2
        or x.shape[1] != k
        or weight.dtype != torch.float8_e4m3fn
        or scale.dtype != torch.float32
        or tuple(scale.shape) != want_scale
        or (bk < k and bk not in (32, 64, 128, 256))
        or weight.stride(1) != 1
        or scale.stride(1) != 1
    ):
        raise RuntimeError(
            f"FP8 matmul wants x [T, K], an e4m3 weight [N, K] and fp32 scales [ceil(N / block_n), "
            f"ceil(K / block_k)] with block_k 32..256 or >= K; got x {tuple(x.shape)}, weight "
            f"{tuple(weight.shape)} {weight.dtype}, scale {tuple(scale.shape)} {scale.dtype}, block {block}"
        )


def act_quant(x: Tensor, group: int) -> tuple[Tensor, Tensor]:
    """x [T, K] -> (x8 e4m3 [T, K], s_x fp32 [T, ceil(K / group)]), per row and group of columns."""
    t, k = x.shape
    x = x.contiguous()
    groups = cdiv(k, group)
    width = min(group, k)
    block = min(QUANT_BLOCK, max(16, next_pow2(width)))
    q = torch.empty(t, k, device=x.device, dtype=torch.float8_e4m3fn)
    s = torch.empty(t, groups, device=x.device, dtype=torch.float32)
    _act_quant_kernel[(t, groups)](
        x,
        q,
        s,
        x.stride(0),
        q.stride(0),
        s.stride(0),
        k,
        width,
        BLOCK=block,
        STEPS=cdiv(width, block),
        PDL=pdl.enabled(x.device),
        **pdl.seam_launch_options(x.device, t),
    )
    return q, s


def quantized(x: Tensor | QuantizedRows, group: int) -> QuantizedRows:
    """x quantized per row and group of ``group`` columns: by ``act_quant``, or already by its
    producer (then checked to be that layout: a RuntimeError with the shapes otherwise)."""
    if isinstance(x, Tensor):
        return QuantizedRows(*act_quant(x, group), group, x.dtype)
    return x.checked(group)


def gemm_config(rows: int, n: int, k: int, capability: tuple[int, int] | None, sms: int) -> GemmConfig:
    """Tiles by architecture and rows, from a sweep on the H200 (benchmarks/RESULTS.md, 2026-12-05):
    64-row tiles everywhere (a 65-row tree is two; 128-row tiles lost on 4 of 5 Qwen3.6-27B shapes,
    and so did one program taking the 65th row beside its 64 from the same weight tiles: 1.22-1.25x
    slower on the H200, 2026-12-06),
    128 columns and 3 stages for verify rows, 4 stages past 128 rows, 256 columns on 8 warps for
    prefill rows, and for verify rows where 256-column tiles fit the SMs in one wave and 128-column
    ones need more than one (the 27B's gdn_in and attn_qkv at 65 rows: 1.08-1.15x faster on the
    H200, 2026-12-05; best of the configs tried on the H100, 2026-12-06). K is split (up to 4 ways,
    >= 1024 of K each) when the tiles leave SMs idle: a 5120-column projection at 65 rows is 80
    programs on 132 SMs. sm_120 and elsewhere (99 KB of shared memory): 64 x 128 on 8 warps, 3
    stages (with 4 warps the block-scaled tile spills there)."""
    if capability is not None and capability[0] in (9, 10):
        if rows >= 1024:
            return GemmConfig(64, 256, 128, 8, 3)
        if rows <= 128 and cdiv(rows, 64) * cdiv(n, 128) > sms >= cdiv(rows, 64) * cdiv(n, 256):
            return GemmConfig(64, 256, 128, 8, 4)  # one wave, unsplit: as measured
        cfg = GemmConfig(64, 128, 128, 4, 3 if rows <= 128 else 4)
    else:
        cfg = GemmConfig(64, 128, 128, 8, 3)
    programs = cdiv(rows, cfg.block_m) * cdiv(n, cfg.block_n)
    split = 1
    if programs < sms:
        while programs * split < 2 * sms and split < 4 and k // (split * 2) >= 1024:
            split *= 2
    return GemmConfig(cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, split)


def shares_tile_scale(block: tuple[int, int], cfg: GemmConfig) -> bool:
    """Whether each output tile's columns lie in one weight block, so that a K group has one weight
    scale for the whole tile (the kernel's ``TILE_SCALE``: one FMA an element)."""
    return block[0] % cfg.block_n == 0


def fp8_gemm(
    x: Tensor | QuantizedRows,
    weight: Tensor,
    scale: Tensor,
    block: tuple[int, int],
    config: GemmConfig | None = None,
) -> Tensor:
    """x [T, K] (bf16/fp16/fp32, or already quantized; K a multiple of 16, as TMA strides need)
    times the FP8 weight [N, K] transposed: [T, N] in x's dtype."""
    check_fp8_operands(x, weight, scale, block)
    n, k = weight.shape
    if k % 16:
        raise RuntimeError(f"fp8_gemm wants K a multiple of 16 (TMA row strides), got K = {k}")
    per_row = block[1] >= k
    group_k = 128 if per_row else block[1]
    rows = quantized(x, k if per_row else block[1])
    x8, x_scale = rows.x8, rows.scale
    t = x8.shape[0]
    cap = torch.cuda.get_device_capability(x8.device) if x8.device.type == "cuda" else None
    cfg = config or gemm_config(t, n, k, cap, num_sms(x8.device))
    if cfg.block_k % group_k:
        raise RuntimeError(
            f"fp8_gemm steps whole groups: block_k {cfg.block_k} is not a multiple of {group_k}"
        )
    out = torch.empty(t, n, device=x8.device, dtype=rows.dtype)
    k_per_split = split_span(k, cfg.split_k, cfg.block_k)
    part = partials(out, cfg.split_k)
    _fp8_gemm_kernel[(checked_tiles(cdiv(t, cfg.block_m) * cdiv(n, cfg.block_n), cfg.split_k), cfg.split_k)](
        TensorDescriptor(x8, [t, k], [x8.stride(0), 1], [cfg.block_m, group_k]),
        x_scale,
        TensorDescriptor(weight, [n, k], [weight.stride(0), 1], [cfg.block_n, group_k]),
        scale,
        out,
        part,
        arrival_counts(x8.device),
        x_scale.stride(0),
        scale.stride(0),
        out.stride(0),
        t,
        n,
        k,
        k_per_split,
        block[0],
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_K=group_k,
        PER_ROW=per_row,
        TILE_SCALE=shares_tile_scale(block, cfg),
        SPLIT=cfg.split_k > 1,
        PRECISION=dot_precision(torch.float8_e4m3fn),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
