"""The inputs of the gated delta rule, from a Gated DeltaNet layer's fused input projection, in one launch.

A Qwen3.5 / 3.6 DeltaNet layer projects each token to ``[mixed (C) | z (Hv Dv) | b (Hv) | a (Hv)]``
(``C = 2 Hk Dk + Hv Dv``: the q, k and v channels). Before the recurrence the mixed channels go
through a depthwise causal conv1d of width K and a silu; q and k are l2-normalised per head (q also
scaled by Dk^-1/2), and each value head gets its decay and write strength:

    x_t  = silu(sum_j w[:, j] * hist[window_t[j]])      hist = cat(conv_state [K-1], mixed [T])
    q, k = l2norm(x_t[q | k head])  (q * Dk^-1/2);  v = x_t[v head]
    g    = -exp(A_log) * softplus(a + dt_bias)  (log-decay, <= 0);   beta = sigmoid(b)

A token's window is its K-1 predecessors then itself: along the chain for a committed sequence, and
along the token's ancestors for a draft tree (DDTree verification: ``window_t`` from the round's
tree plan, ``ddtree_kernels/gdn_tree.py``), continuing into the cached conv inputs above the root.

One program per (token, head of q | k | v): 2 Hk + Hv programs per token, each reading its channels'
K window rows once. The conv output is rounded to the model dtype before the norm (the reference
computes the conv in that dtype). Options:

- ``update_conv`` (one chain token, the ``ar`` step): the conv state moves by one row in place; each
  program owns its channels, reads them all, then writes.
- ``stage_x`` (a verify pass): the raw mixed rows are copied out, so that the conv state can be moved
  along whichever path is accepted (``ddtree_kernels/gdn_commit.py``) without a second target pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import next_pow2


@triton.jit
def _window_row(WINDOWS, t, j, stride_wt, KERNEL: tl.constexpr, CHAIN: tl.constexpr):
    """The hist row (conv state rows first, then the T tokens) that token t's tap j reads."""
    return t + j if CHAIN else tl.load(WINDOWS + t * stride_wt + j).to(tl.int32)


@triton.jit
def hist_row(CONV_STATE, X, row, chans, ok, stride_cs, stride_x, KERNEL: tl.constexpr):
    """Channels ``chans`` of row ``row`` (a block, one value per channel) of cat(conv_state [K-1], x):
    the cached conv inputs first, then the tokens'."""
    in_state = row < KERNEL - 1
    xs = tl.load(CONV_STATE + tl.minimum(row, KERNEL - 2) * stride_cs + chans, mask=ok & in_state, other=0.0)
    xp = tl.load(X + tl.maximum(row - (KERNEL - 1), 0) * stride_x + chans, mask=ok & ~in_state, other=0.0)
    return tl.where(in_state, xs, xp)


@triton.jit
def _conv_silu(
    PROJ,
    CONV_STATE,
    CONV_W,
    WINDOWS,
    t,
    chans,
    ok,
    stride_pt,
    stride_cs,
    stride_wt,
    KERNEL: tl.constexpr,
    CHAIN: tl.constexpr,
):
    """silu of the depthwise conv of channels ``chans`` along token t's window, fp32."""
    acc = tl.zeros(chans.shape, dtype=tl.float32)
    for j in tl.static_range(KERNEL):
        row = _window_row(WINDOWS, t, j, stride_wt, KERNEL, CHAIN) + tl.zeros_like(
            chans
        )  # a block: masks need one
        x = hist_row(CONV_STATE, PROJ, row, chans, ok, stride_cs, stride_pt, KERNEL)
        w = tl.load(CONV_W + chans * KERNEL + j, mask=ok, other=0.0)
        acc += x.to(tl.float32) * w.to(tl.float32)
    return acc / (1.0 + tl.exp(-acc))


@triton.jit
def _gdn_inputs_kernel(
    PROJ,
    CONV_STATE,
    CONV_W,
    WINDOWS,
    A_LOG,
    DT_BIAS,
    Q,
    K,
    V,
    G,
    BETA,
    X_STAGE,
    stride_pt,
    stride_cs,
    stride_wt,
    stride_xt,
    q_scale,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    KERNEL: tl.constexpr,
    CHAIN: tl.constexpr,
    UPDATE_CONV: tl.constexpr,
    STAGE_X: tl.constexpr,
):
    t = tl.program_id(0)
    grp = tl.program_id(1)  # q heads, then k heads, then v heads
    offs = tl.arange(0, BLOCK_D)
    is_qk = grp < 2 * HK
    width = tl.where(is_qk, DK, DV)
    ok = offs < width
    chans = tl.where(is_qk, grp * DK, 2 * HK * DK + (grp - 2 * HK) * DV) + offs
    x = _conv_silu(
        PROJ, CONV_STATE, CONV_W, WINDOWS, t, chans, ok, stride_pt, stride_cs, stride_wt, KERNEL, CHAIN
    )
    x = x.to(Q.dtype.element_ty).to(tl.float32)  # the conv's output in the model dtype
    if is_qk:
        x = x / tl.maximum(tl.sqrt(tl.sum(x * x, 0)), 1e-6)  # F.normalize(eps=1e-6)
        if grp < HK:
            tl.store(Q + (t * HK + grp) * DK + offs, (x * q_scale).to(Q.dtype.element_ty), mask=ok)
        else:
            tl.store(K + (t * HK + grp - HK) * DK + offs, x.to(K.dtype.element_ty), mask=ok)
    else:
        vh = grp - 2 * HK
        tl.store(V + (t * HV + vh) * DV + offs, x.to(V.dtype.element_ty), mask=ok)
        gate_cols = 2 * HK * DK + HV * DV + HV * DV  # b, then a, after mixed and z
        b = tl.load(PROJ + t * stride_pt + gate_cols + vh).to(tl.float32)
        a = tl.load(PROJ + t * stride_pt + gate_cols + HV + vh).to(tl.float32) + tl.load(DT_BIAS + vh).to(
            tl.float32
        )
        softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
        tl.store(G + t * HV + vh, -tl.exp(tl.load(A_LOG + vh).to(tl.float32)) * softplus)
        tl.store(BETA + t * HV + vh, 1.0 / (1.0 + tl.exp(-b)))
    if STAGE_X:
        tl.store(X_STAGE + t * stride_xt + chans, tl.load(PROJ + t * stride_pt + chans, mask=ok), mask=ok)
    if UPDATE_CONV:  # one token: state row j <- hist row j + 1, in order (row j + 1 is read first)
        tl.debug_barrier()  # every tap of the conv above has read the old rows
        for j in tl.static_range(KERNEL - 2):
            tl.store(
                CONV_STATE + j * stride_cs + chans,
                tl.load(CONV_STATE + (j + 1) * stride_cs + chans, mask=ok),
                mask=ok,
            )
        tl.store(CONV_STATE + (KERNEL - 2) * stride_cs + chans, tl.load(PROJ + chans, mask=ok), mask=ok)


def gdn_inputs(
    proj: Tensor,
    conv_state: Tensor,
    conv_weight: Tensor,
    a_log: Tensor,
    dt_bias: Tensor,
    heads: tuple[int, int, int, int],
    windows: Tensor | None = None,
    update_conv: bool = False,
    k_out: Tensor | None = None,
    x_out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """q, k [T, Hk, Dk], v [T, Hv, Dv] (proj's dtype) and g, beta [T, Hv] (fp32) of T tokens.

    proj [T, >= C + Hv Dv + 2 Hv] (the fused projection); conv_state [K-1, C]; conv_weight [C, K];
    heads = (Hk, Hv, Dk, Dv). ``windows`` [T, K] (int) are the tree's rows of cat(conv_state, proj);
    None is the chain. ``update_conv`` (T = 1 chains only) moves the conv state by the token.
    ``k_out`` [T, Hk, Dk] receives k (a verify pass stages it there); ``x_out`` [T, C] receives the
    raw mixed rows.
    """
    hk, hv, dk, dv = heads
    t = proj.shape[0]
    kernel = conv_weight.shape[1]
    c = 2 * hk * dk + hv * dv
    if proj.dim() != 2 or proj.stride(1) != 1 or proj.shape[1] < c + hv * dv + 2 * hv:
        raise RuntimeError(
            f"gdn_inputs wants proj [T, >= {c + hv * dv + 2 * hv}] with unit last stride, got {tuple(proj.shape)}"
        )
    if conv_state.shape != (kernel - 1, c) or conv_state.stride(1) != 1 or conv_weight.shape != (c, kernel):
        raise RuntimeError(
            f"gdn_inputs wants conv_state [{kernel - 1}, {c}] and conv_weight [{c}, {kernel}], got "
            f"{tuple(conv_state.shape)} and {tuple(conv_weight.shape)}"
        )
    if update_conv and (t != 1 or windows is not None):
        raise RuntimeError("gdn_inputs moves the conv state in place for one chain token only")
    if windows is not None and windows.shape != (t, kernel):
        raise RuntimeError(f"gdn_inputs wants windows [{t}, {kernel}], got {tuple(windows.shape)}")
    if kernel < 2:
        raise RuntimeError(f"gdn_inputs wants a conv of width >= 2, got {kernel}")
    dev, dtype = proj.device, proj.dtype
    q = torch.empty(t, hk, dk, device=dev, dtype=dtype)
    k = torch.empty(t, hk, dk, device=dev, dtype=dtype) if k_out is None else k_out
    v = torch.empty(t, hv, dv, device=dev, dtype=dtype)
    g = torch.empty(t, hv, device=dev, dtype=torch.float32)
    beta = torch.empty(t, hv, device=dev, dtype=torch.float32)
    if k.shape != (t, hk, dk) or not k.is_contiguous():
        raise RuntimeError(f"gdn_inputs wants k_out [{t}, {hk}, {dk}] contiguous, got {tuple(k.shape)}")
    if x_out is not None and (x_out.shape != (t, c) or x_out.stride(1) != 1):
        raise RuntimeError(
            f"gdn_inputs wants x_out [{t}, {c}] with unit last stride, got {tuple(x_out.shape)}"
        )
    _gdn_inputs_kernel[(t, 2 * hk + hv)](
        proj,
        conv_state,
        conv_weight,
        windows if windows is not None else proj,
        a_log,
        dt_bias,
        q,
        k,
        v,
        g,
        beta,
        x_out if x_out is not None else proj,
        proj.stride(0),
        conv_state.stride(0),
        windows.stride(0) if windows is not None else 0,
        x_out.stride(0) if x_out is not None else 0,
        dk**-0.5,
        HK=hk,
        HV=hv,
        DK=dk,
        DV=dv,
        BLOCK_D=max(16, next_pow2(max(dk, dv))),
        KERNEL=kernel,
        CHAIN=windows is None,
        UPDATE_CONV=update_conv,
        STAGE_X=x_out is not None,
        num_warps=1 if max(dk, dv) <= 128 else 2,
    )
    return q, k, v, g, beta
