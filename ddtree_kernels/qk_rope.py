"""Per-head q/k RMSNorm, RoPE and the K/V cache write, from the fused QKV projection, in one launch.

Qwen3 normalises every query and key head over its head dimension (``q_norm``/``k_norm``), then
rotates it (RoPE, the half-split ``rotate_half`` layout); the new keys and values go to cache rows
``C + t`` (C = the committed context length). Unfused that is ~30 small kernels per layer plus the
strided copies of slicing ``qkv``. Here one program per (token, head of q | k | v) does

    q head:  out[t, h]       = rope(w_q * rmsnorm(q[t, h]), pos[t])
    k head:  K[h, C + t]     = rope(w_k * rmsnorm(k[t, h]), pos[t])
    v head:  V[h, C + t]     = v[t, h]

with ``rope(x)[:R/2] = x1 cos - x2 sin``, ``rope(x)[R/2:R] = x2 cos + x1 sin`` over the first R =
``cos.shape[-1]`` dims (all of them for Qwen3, a quarter for Qwen3.5's partial rotary) and the rest
passed through; fp32 inside, the normalised value rounded to the weight's dtype before its scale
(Qwen3's bf16 weights, Qwen3.5's fp32 (1 + w) scales). In Qwen3.5's gated attention each query head
is followed by its output gate in ``qkv`` (``gated``), which this leaves in place. ``C`` is read from
a device scalar, so one captured CUDA graph serves every context length. The reference is
``ddtree_runtime.backend.TorchBackend.qk_rope``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels import pdl
from ddtree_kernels.host import next_pow2
from ddtree_kernels.pdl import wait_for_producer


@triton.jit
def _qk_rope_kernel(
    QKV,
    QW,
    KW,
    COS,
    SIN,
    POS,
    K,
    V,
    Q_OUT,
    CTX,
    stride_t,
    stride_ct,
    stride_kh,
    stride_ks,
    stride_qt,
    stride_qh,
    eps,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    Q_WIDTH: tl.constexpr,
    ROT: tl.constexpr,
    HALF_PAD: tl.constexpr,
    REST_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_producer(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    half: tl.constexpr = ROT // 2
    rest: tl.constexpr = HEAD_DIM - ROT
    cols = tl.arange(0, HALF_PAD)
    ok = cols < half
    rcols = tl.arange(0, REST_PAD)
    r_ok = rcols < rest
    # q heads (each Q_WIDTH wide: its gate follows when gated), then k heads, then v heads
    base = QKV + t * stride_t + tl.where(h < HQ, h * Q_WIDTH, HQ * Q_WIDTH + (h - HQ) * HEAD_DIM)
    x1 = tl.load(base + cols, mask=ok, other=0.0)
    x2 = tl.load(base + half + cols, mask=ok, other=0.0)
    x3 = tl.load(base + ROT + rcols, mask=r_ok, other=0.0)
    row = tl.load(CTX) + t
    if h >= HQ + HKV:  # a value head: straight into the cache
        dst = V + (h - HQ - HKV) * stride_kh + row * stride_ks
        tl.store(dst + cols, x1, mask=ok)
        tl.store(dst + half + cols, x2, mask=ok)
        tl.store(dst + ROT + rcols, x3, mask=r_ok)
    else:
        is_q = h < HQ
        if is_q:
            w1 = tl.load(QW + cols, mask=ok, other=0.0)
            w2 = tl.load(QW + half + cols, mask=ok, other=0.0)
            w3 = tl.load(QW + ROT + rcols, mask=r_ok, other=0.0)
        else:
            w1 = tl.load(KW + cols, mask=ok, other=0.0)
            w2 = tl.load(KW + half + cols, mask=ok, other=0.0)
            w3 = tl.load(KW + ROT + rcols, mask=r_ok, other=0.0)
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        f3 = x3.to(tl.float32)
        inv = 1.0 / tl.sqrt((tl.sum(f1 * f1, 0) + tl.sum(f2 * f2, 0) + tl.sum(f3 * f3, 0)) / HEAD_DIM + eps)
        n1 = (w1.to(tl.float32) * (f1 * inv).to(w1.dtype).to(tl.float32)).to(x1.dtype).to(tl.float32)
        n2 = (w2.to(tl.float32) * (f2 * inv).to(w1.dtype).to(tl.float32)).to(x1.dtype).to(tl.float32)
        n3 = (w3.to(tl.float32) * (f3 * inv).to(w1.dtype).to(tl.float32)).to(x1.dtype)
        pos = tl.load(POS + t)
        c = tl.load(COS + pos * stride_ct + cols, mask=ok, other=0.0).to(x1.dtype).to(tl.float32)
        s = tl.load(SIN + pos * stride_ct + cols, mask=ok, other=0.0).to(x1.dtype).to(tl.float32)
        r1 = (n1 * c - n2 * s).to(x1.dtype)
        r2 = (n2 * c + n1 * s).to(x1.dtype)
        if is_q:  # noqa: SIM108 (a Triton branch on a runtime value)
            dst = Q_OUT + t * stride_qt + h * stride_qh
        else:
            dst = K + (h - HQ) * stride_kh + row * stride_ks
        tl.store(dst + cols, r1, mask=ok)
        tl.store(dst + half + cols, r2, mask=ok)
        tl.store(dst + ROT + rcols, n3, mask=r_ok)


def qk_rope(
    qkv: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    eps: float,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    context_len: Tensor,
    n_heads: int,
    gated: bool = False,
) -> Tensor:
    """qkv [T, (Hq (x2 gated) + 2 Hkv) D] -> q [T, Hq, D]; K/V rows ``context_len + t`` of the layer's
    caches [Hkv, S_max, D] are written. cos, sin: [S_max, R] tables (R <= D rotated dims);
    positions [T]; context_len: 0-d int64."""
    t = qkv.shape[0]
    hkv, _, d = k_cache.shape
    q_width = 2 * d if gated else d
    rot = cos.shape[1]
    if qkv.shape[1] != n_heads * q_width + 2 * hkv * d or qkv.stride(1) != 1 or rot % 2 or rot > d:
        raise RuntimeError(
            f"qk_rope wants qkv [T, {n_heads * q_width + 2 * hkv * d}] and an even rotary width <= {d}, "
            f"got {tuple(qkv.shape)} and {rot}"
        )
    if k_cache.stride() != v_cache.stride() or k_cache.stride(2) != 1 or cos.stride(1) != 1:
        raise RuntimeError("qk_rope wants K/V caches of equal strides with a unit last stride")
    q = torch.empty(t, n_heads, d, device=qkv.device, dtype=qkv.dtype)
    _qk_rope_kernel[(t, n_heads + 2 * hkv)](
        qkv,
        q_weight,
        k_weight,
        cos,
        sin,
        positions,
        k_cache,
        v_cache,
        q,
        context_len,
        qkv.stride(0),
        cos.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        q.stride(0),
        q.stride(1),
        eps,
        HQ=n_heads,
        HKV=hkv,
        HEAD_DIM=d,
        Q_WIDTH=q_width,
        ROT=rot,
        HALF_PAD=next_pow2(rot // 2),
        REST_PAD=max(1, next_pow2(d - rot)),
        PDL=pdl.enabled(q.device),
        num_warps=1,
        **pdl.seam_launch_options(q.device, t),
    )
    return q
