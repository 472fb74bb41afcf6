"""Per-head q/k RMSNorm, RoPE and the K/V cache write, from the fused QKV projection, in one launch.

Qwen3 normalises every query and key head over its head dimension (``q_norm``/``k_norm``), then
rotates it (RoPE, the half-split ``rotate_half`` layout); the new keys and values go to cache rows
``C + t`` (C = the committed context length). Unfused that is ~30 small kernels per layer plus the
strided copies of slicing ``qkv``. Here one program per (token, head of q | k | v) does

    q head:  out[t, h]       = rope(w_q * rmsnorm(q[t, h]), pos[t])
    k head:  K[h, C + t]     = rope(w_k * rmsnorm(k[t, h]), pos[t])
    v head:  V[h, C + t]     = v[t, h]

with ``rope(x)[:D/2] = x1 cos - x2 sin``, ``rope(x)[D/2:] = x2 cos + x1 sin`` (fp32 inside). ``C`` is
read from a device scalar, so one captured CUDA graph serves every context length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import next_pow2


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
    HALF_PAD: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    half: tl.constexpr = HEAD_DIM // 2
    cols = tl.arange(0, HALF_PAD)
    ok = cols < half
    base = QKV + t * stride_t + h * HEAD_DIM
    x1 = tl.load(base + cols, mask=ok, other=0.0)
    x2 = tl.load(base + half + cols, mask=ok, other=0.0)
    row = tl.load(CTX) + t
    if h >= HQ + HKV:  # a value head: straight into the cache
        vh = h - HQ - HKV
        tl.store(V + vh * stride_kh + row * stride_ks + cols, x1, mask=ok)
        tl.store(V + vh * stride_kh + row * stride_ks + half + cols, x2, mask=ok)
    else:
        is_q = h < HQ
        if is_q:
            w1 = tl.load(QW + cols, mask=ok, other=0.0)
            w2 = tl.load(QW + half + cols, mask=ok, other=0.0)
        else:
            w1 = tl.load(KW + cols, mask=ok, other=0.0)
            w2 = tl.load(KW + half + cols, mask=ok, other=0.0)
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        inv = 1.0 / tl.sqrt((tl.sum(f1 * f1, 0) + tl.sum(f2 * f2, 0)) / HEAD_DIM + eps)
        n1 = w1.to(tl.float32) * (f1 * inv).to(x1.dtype).to(tl.float32)
        n2 = w2.to(tl.float32) * (f2 * inv).to(x1.dtype).to(tl.float32)
        n1 = n1.to(x1.dtype).to(tl.float32)
        n2 = n2.to(x1.dtype).to(tl.float32)
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
) -> Tensor:
    """qkv [T, (Hq + 2 Hkv) D] -> q [T, Hq, D]; K/V rows ``context_len + t`` of the layer's caches
    [Hkv, S_max, D] are written. cos, sin: [S_max, D] tables; positions [T]; context_len: 0-d int64."""
    t = qkv.shape[0]
    hkv, _, d = k_cache.shape
    if qkv.shape[1] != (n_heads + 2 * hkv) * d or qkv.stride(1) != 1 or d % 2:
        raise RuntimeError(
            f"qk_rope wants qkv [T, (Hq + 2 Hkv) D] = [{t}, {(n_heads + 2 * hkv) * d}], got {tuple(qkv.shape)}"
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
        HALF_PAD=next_pow2(d // 2),
        num_warps=1,
    )
    return q


def qk_rope_reference(
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
) -> Tensor:
    """PyTorch: Qwen3's q_norm/k_norm and ``apply_rotary_pos_emb`` (in the input dtype), cache rows by index."""
    t = qkv.shape[0]
    hkv, _, d = k_cache.shape
    q, k, v = qkv.view(t, n_heads + 2 * hkv, d).split([n_heads, hkv, hkv], dim=1)

    def norm(x: Tensor, w: Tensor) -> Tensor:
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    c, s = cos[positions].to(qkv.dtype)[:, None], sin[positions].to(qkv.dtype)[:, None]  # [T, 1, D]

    def rope(x: Tensor) -> Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * c + torch.cat([-x2, x1], dim=-1) * s

    rows = context_len + torch.arange(t, device=qkv.device)
    k_cache.index_copy_(1, rows, rope(norm(k, k_weight)).transpose(0, 1))
    v_cache.index_copy_(1, rows, v.transpose(0, 1))
    return rope(norm(q, q_weight)).contiguous()
