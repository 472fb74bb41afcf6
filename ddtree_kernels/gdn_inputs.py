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

One program per (16 tokens, head of q | k | v): ``[tokens, channels]`` tiles, each token's K window
rows read once. The conv output is rounded to the model dtype before the norm (the reference
computes the conv in that dtype). Options:

- ``update_conv`` (one chain token, the ``ar`` step): the conv state moves by one row in place; each
  program owns its channels, reads them all, then writes.
- ``stage_x`` (a verify pass): the raw mixed rows are copied out, so that the conv state can be moved
  along whichever path is accepted (``ddtree_kernels/gdn_commit.py``) without a second target pass.
- ``slots`` (the ``ar`` rows of a batched pass): each token is a one-token chain of its own
  sequence, whose conv state is that of its cache slot (read on the device); with ``update_conv``
  every sequence's conv state moves by its token, all in one launch.
- ``slots`` with ``windows`` (a forest: the verify trees of a batched pass, all of one size): the
  tokens are P trees of N nodes one after the other, tree p reads the conv state of cache slot
  ``slots[p]`` and stages its k and raw rows in that slot's staging.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels import pdl
from ddtree_kernels.host import next_pow2
from ddtree_kernels.pdl import wait_for_producer

# a program per token and head left 20K tiny programs at 257 nodes (18 µs); 8 tokens on 4 warps beat
# 16 on 8 (H200, 27B layer, a verify tree with its staging): 65 nodes 10.9 -> 8.1 µs, 257 nodes
# 20.8 -> 13.2
TOKENS_PER_PROGRAM = 8


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
    toks,
    tok_ok,
    chans,
    chan_ok,
    stride_pt,
    stride_cs,
    stride_wt,
    KERNEL: tl.constexpr,
    CHAIN: tl.constexpr,
):
    """silu of the depthwise conv of channels ``chans`` along each token's window: [tokens, chans] fp32."""
    ok = tok_ok[:, None] & chan_ok[None, :]
    acc = tl.zeros([toks.shape[0], chans.shape[0]], dtype=tl.float32)
    for j in tl.static_range(KERNEL):
        # the hist row (conv state rows first, then the T tokens) that each token's tap j reads
        if CHAIN:
            row = toks + j
        else:
            row = tl.load(WINDOWS + toks * stride_wt + j, mask=tok_ok, other=0).to(tl.int32)
        x = hist_row(CONV_STATE, PROJ, row[:, None], chans[None, :], ok, stride_cs, stride_pt, KERNEL)
        w = tl.load(CONV_W + chans * KERNEL + j, mask=chan_ok, other=0.0)
        acc += x.to(tl.float32) * w.to(tl.float32)[None, :]
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
    K_STAGE,
    SLOTS,
    n_tokens,
    n_part,
    stride_pt,
    stride_slot,
    stride_cs,
    stride_wt,
    stride_xt,
    stride_xslot,
    stride_kslot,
    q_scale,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    KERNEL: tl.constexpr,
    CHAIN: tl.constexpr,
    UPDATE_CONV: tl.constexpr,
    STAGE_X: tl.constexpr,
    STAGE_K: tl.constexpr,
    BATCHED: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_producer(PDL)
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    grp = tl.program_id(1)  # q heads, then k heads, then v heads
    tok_ok = toks < n_tokens
    offs = tl.arange(0, BLOCK_D)
    is_qk = grp < 2 * HK
    width = tl.where(is_qk, DK, DV)
    chan_ok = offs < width
    ok = tok_ok[:, None] & chan_ok[None, :]
    chans = tl.where(is_qk, grp * DK, 2 * HK * DK + (grp - 2 * HK) * DV) + offs
    # each token's conv state, its part's conv inputs, and its index along its chain (or its
    # window's row: the windows are per token)
    conv, src, along, stage_x = CONV_STATE, PROJ, toks, toks[:, None] * stride_xt
    if BATCHED:  # token t: row t % n_part of part t // n_part, after the conv state of its slot
        part = toks // n_part
        local = toks - part * n_part
        slot = tl.load(SLOTS + part, mask=tok_ok, other=0).to(tl.int64)
        conv, src = CONV_STATE + slot[:, None] * stride_slot, PROJ + (part * n_part)[:, None] * stride_pt
        if CHAIN:
            along = local
        stage_x = slot[:, None] * stride_xslot + local[:, None] * stride_xt
    x = _conv_silu(
        src,
        conv,
        CONV_W,
        WINDOWS,
        along,
        tok_ok,
        chans,
        chan_ok,
        stride_pt,
        stride_cs,
        stride_wt,
        KERNEL,
        CHAIN,
    )
    x = x.to(Q.dtype.element_ty).to(tl.float32)  # the conv's output in the model dtype
    if is_qk:
        x = x / tl.maximum(tl.sqrt(tl.sum(x * x, 1)), 1e-6)[:, None]  # F.normalize(eps=1e-6)
        if grp < HK:
            out = Q + (toks[:, None] * HK + grp) * DK + offs[None, :]
            tl.store(out, (x * q_scale).to(Q.dtype.element_ty), mask=ok)
        else:
            tl.store(
                K + (toks[:, None] * HK + grp - HK) * DK + offs[None, :], x.to(K.dtype.element_ty), mask=ok
            )
            if STAGE_K:  # a forest's k, also in its slot's staging
                staged = K_STAGE + slot[:, None] * stride_kslot + (local[:, None] * HK + grp - HK) * DK
                tl.store(staged + offs[None, :], x.to(K_STAGE.dtype.element_ty), mask=ok)
    else:
        vh = grp - 2 * HK
        tl.store(V + (toks[:, None] * HV + vh) * DV + offs[None, :], x.to(V.dtype.element_ty), mask=ok)
        gate_cols = 2 * HK * DK + HV * DV + HV * DV  # b, then a, after mixed and z
        b = tl.load(PROJ + toks * stride_pt + gate_cols + vh, mask=tok_ok, other=0.0).to(tl.float32)
        a = tl.load(PROJ + toks * stride_pt + gate_cols + HV + vh, mask=tok_ok, other=0.0).to(tl.float32)
        a += tl.load(DT_BIAS + vh).to(tl.float32)
        softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
        tl.store(G + toks * HV + vh, -tl.exp(tl.load(A_LOG + vh).to(tl.float32)) * softplus, mask=tok_ok)
        tl.store(BETA + toks * HV + vh, 1.0 / (1.0 + tl.exp(-b)), mask=tok_ok)
    if STAGE_X:
        raw = tl.load(PROJ + toks[:, None] * stride_pt + chans[None, :], mask=ok)
        tl.store(X_STAGE + stage_x + chans[None, :], raw, mask=ok)
    if UPDATE_CONV:  # one token per conv state: its row j <- hist row j + 1, in order (row j + 1 read first)
        tl.debug_barrier()  # every tap of the conv above has read the old rows
        cols, keep = chans, chan_ok  # one conv state: a row of channels
        if BATCHED:  # a conv state per token: [tokens, channels]
            cols, keep = chans[None, :], ok
        for j in tl.static_range(KERNEL - 2):
            row = conv + j * stride_cs + cols
            tl.store(row, tl.load(row + stride_cs, mask=keep), mask=keep)
        tl.store(conv + (KERNEL - 2) * stride_cs + cols, tl.load(src + cols, mask=keep), mask=keep)


def tile(tokens: int, head_dim: int) -> tuple[int, int]:
    """(tokens per program, warps) of a launch over `tokens` tokens: a warp per 256 values (with one
    per 512 the prefill's tile spills)."""
    block_t = min(TOKENS_PER_PROGRAM, next_pow2(tokens))
    return block_t, max(1, min(8, block_t * head_dim // 256))


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
    slots: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """q, k [T, Hk, Dk], v [T, Hv, Dv] (proj's dtype) and g, beta [T, Hv] (fp32) of T tokens.

    proj [T, >= C + Hv Dv + 2 Hv] (the fused projection); conv_state [K-1, C]; conv_weight [C, K];
    heads = (Hk, Hv, Dk, Dv). ``windows`` [T, K] (int) are the tree's rows of cat(conv_state, proj);
    None is the chain. ``update_conv`` (T = 1 chains only) moves the conv state by the token.
    ``k_out`` [T, Hk, Dk] receives k (a verify pass stages it there); ``x_out`` [T, C] receives the
    raw mixed rows. With ``slots`` [T] (cache slots on the device, distinct but for a scratch slot
    that padding rows may repeat, whose rows and state then come out undefined) the T tokens are one
    token each of T sequences: conv_state holds every slot's [S, K-1, C], token t reads (and with
    ``update_conv`` moves) ``conv_state[slots[t]]``.

    A forest: ``slots`` [P] with ``windows`` [P, N, K] (T = P N): tree p's N nodes read
    ``conv_state[slots[p]]`` along their windows; k comes back fresh and is also staged, with the raw
    rows, in ``k_out`` [S, N, Hk, Dk] and ``x_out`` [S, N, C] (every slot's staging, each slot's
    rows contiguous) at ``slots[p]``.
    """
    hk, hv, dk, dv = heads
    t = proj.shape[0]
    kernel = conv_weight.shape[1]
    c = 2 * hk * dk + hv * dv
    one_state = conv_state if slots is None else conv_state[0]
    forest = slots is not None and windows is not None
    n_part = windows.shape[1] if forest else 1
    if forest and (
        windows.shape != (slots.shape[0], n_part, kernel)
        or slots.shape[0] * n_part != t
        or not windows.is_contiguous()
    ):
        raise RuntimeError(
            f"gdn_inputs wants a forest's windows [P, N, {kernel}] and slots [P] of P N = {t} tokens, got "
            f"windows {tuple(windows.shape)} and slots {tuple(slots.shape)}"
        )
    if slots is not None and not forest and (slots.shape != (t,) or x_out is not None):
        raise RuntimeError(
            f"gdn_inputs wants slots [{t}] (one per token) for chains of one, got {tuple(slots.shape)}"
        )
    if proj.dim() != 2 or proj.stride(1) != 1 or proj.shape[1] < c + hv * dv + 2 * hv:
        raise RuntimeError(
            f"gdn_inputs wants proj [T, >= {c + hv * dv + 2 * hv}] with unit last stride, got {tuple(proj.shape)}"
        )
    if one_state.shape != (kernel - 1, c) or one_state.stride(1) != 1 or conv_weight.shape != (c, kernel):
        raise RuntimeError(
            f"gdn_inputs wants conv_state [{kernel - 1}, {c}] and conv_weight [{c}, {kernel}], got "
            f"{tuple(conv_state.shape)} and {tuple(conv_weight.shape)}"
        )
    if update_conv and ((t != 1 and slots is None) or windows is not None):
        raise RuntimeError("gdn_inputs moves a conv state in place for one chain token only")
    if windows is not None and not forest and windows.shape != (t, kernel):
        raise RuntimeError(f"gdn_inputs wants windows [{t}, {kernel}], got {tuple(windows.shape)}")
    if kernel < 2:
        raise RuntimeError(f"gdn_inputs wants a conv of width >= 2, got {kernel}")
    dev, dtype = proj.device, proj.dtype
    q = torch.empty(t, hk, dk, device=dev, dtype=dtype)
    k = torch.empty(t, hk, dk, device=dev, dtype=dtype) if k_out is None or forest else k_out
    v = torch.empty(t, hv, dv, device=dev, dtype=dtype)
    g = torch.empty(t, hv, device=dev, dtype=torch.float32)
    beta = torch.empty(t, hv, device=dev, dtype=torch.float32)
    rows = n_part if forest else t  # the rows of one staging (a forest's: of each slot)
    one_k = k_out[0] if forest and k_out is not None else k_out
    one_x = x_out[0] if forest and x_out is not None else x_out
    if one_k is not None and (one_k.shape != (rows, hk, dk) or not one_k.is_contiguous()):
        raise RuntimeError(
            f"gdn_inputs wants k_out [{rows}, {hk}, {dk}] contiguous, got {tuple(k_out.shape)}"
        )
    if one_x is not None and (one_x.shape != (rows, c) or one_x.stride(1) != 1):
        raise RuntimeError(
            f"gdn_inputs wants x_out [{rows}, {c}] with unit last stride, got {tuple(x_out.shape)}"
        )
    stage_k = forest and k_out is not None
    block_t, warps = tile(t, max(dk, dv))
    _gdn_inputs_kernel[(triton.cdiv(t, block_t), 2 * hk + hv)](
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
        k_out if stage_k else proj,
        slots if slots is not None else proj,
        t,
        n_part,
        proj.stride(0),
        conv_state.stride(0) if slots is not None else 0,
        one_state.stride(0),
        windows.stride(-2) if windows is not None else 0,
        one_x.stride(0) if one_x is not None else 0,
        x_out.stride(0) if x_out is not None and forest else 0,
        k_out.stride(0) if stage_k else 0,
        dk**-0.5,
        HK=hk,
        HV=hv,
        DK=dk,
        DV=dv,
        BLOCK_T=block_t,
        BLOCK_D=max(16, next_pow2(max(dk, dv))),
        KERNEL=kernel,
        CHAIN=windows is None,
        UPDATE_CONV=update_conv,
        STAGE_X=x_out is not None,
        STAGE_K=stage_k,
        BATCHED=slots is not None,
        PDL=pdl.enabled(dev),
        num_warps=warps,
        **pdl.seam_launch_options(dev, t),
    )
    return q, k, v, g, beta
