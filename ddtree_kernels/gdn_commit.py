"""After a verify pass: every Gated DeltaNet layer's states moved along the accepted path, two launches.

The verify pass (``gdn_tree.py``) leaves the cached states alone and stages, per layer, each node's
key k, correction d and path sum G, and its raw conv inputs x. Once the walk has chosen the
accepted path p_0 .. p_{n-1} (p_0 the root), the recurrent state of every head becomes

    S_new = exp(G_last) S0 + sum_a exp(G_last - G_{p_a}) k_{p_a} d_{p_a}^T          (G_last = G_{p_{n-1}})

(the chain's recurrence folded along the path: see ``gdn_tree.py``), and the conv state the last K-1
inputs along the path, which are the rows of the last node's conv window after its first
(``TreePlan.windows``), read from cat(conv_state, x). The path lives on the device (padded with -1,
its length a 0-d tensor), so a captured graph serves every outcome. All layers' staging buffers are
stacked ``[L, ...]``, so each update is one launch for the whole model.

A batched round (continuous batching) commits P sequences at once, each in its own cache slot
(``slots``: its states and the staging its verify pass wrote, ``gdn_forest``): the same programs
per sequence, its slot, path, path length and conv windows read on the device, so the round's
commit is still two launches whatever P.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.gdn_inputs import hist_row
from ddtree_kernels.host import cdiv, next_pow2
from ddtree_kernels.precision import dot, dot_precision


@triton.jit
def _commit_state_kernel(
    STATES,
    K,
    D,
    GSUM,
    PATH,
    PATH_LEN,
    SLOTS,
    n_nodes,
    stride_state,
    stride_k,
    stride_d,
    stride_g,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    DK_PAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_P: tl.constexpr,
    PRECISION: tl.constexpr,
    BATCHED: tl.constexpr,
):
    seq = tl.program_id(2)  # a batched round's sequence (0 alone)
    if BATCHED:  # its cache slot's states and staging
        cache_slot = tl.load(SLOTS + seq).to(tl.int64)
        STATES += cache_slot * stride_state
        K += cache_slot * stride_k
        D += cache_slot * stride_d
        GSUM += cache_slot * stride_g
    PATH += seq * n_nodes
    PATH_LEN += seq
    layer = tl.program_id(0) // HV
    h = tl.program_id(0) % HV
    hk = h // (HV // HK)
    vcol = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    dk = tl.arange(0, DK_PAD)
    v_ok, k_ok = vcol < DV, dk < DK
    mask = k_ok[:, None] & v_ok[None, :]
    # states [L, HV, DK, DV]; k [L, N, HK, DK]; d [L, HV, N, DV]; gsum [L, HV, N]
    STATES += (layer * HV + h) * DK * DV
    K += layer * n_nodes * HK * DK + hk * DK
    D += (layer * HV + h) * n_nodes * DV
    GSUM += (layer * HV + h) * n_nodes
    path_len = tl.load(PATH_LEN).to(tl.int32)
    g_last = tl.load(GSUM + tl.load(PATH + path_len - 1))
    s = tl.exp(g_last) * tl.load(STATES + dk[:, None] * DV + vcol[None, :], mask=mask, other=0.0)
    # the path's nodes BLOCK_P at a time, gathered at once: one [DK, P] x [P, BLOCK_V] product each
    # (tf32 for a bf16 model, true fp32 for an fp32 one, as every other product of the state)
    for a0 in range(0, path_len, BLOCK_P):
        slot = a0 + tl.arange(0, BLOCK_P)
        on = slot < path_len
        node = tl.load(PATH + slot, mask=on, other=0)
        w = tl.where(on, tl.exp(g_last - tl.load(GSUM + node, mask=on, other=0.0)), 0.0)
        kp = tl.load(K + node[None, :] * HK * DK + dk[:, None], mask=k_ok[:, None] & on[None, :], other=0.0)
        dp = tl.load(D + node[:, None] * DV + vcol[None, :], mask=on[:, None] & v_ok[None, :], other=0.0)
        s = dot(kp.to(tl.float32) * w[None, :], dp, PRECISION, s)
    tl.store(STATES + dk[:, None] * DV + vcol[None, :], s, mask=mask)


@triton.jit
def _commit_conv_kernel(
    CONV,
    X,
    WINDOWS,
    PATH,
    PATH_LEN,
    SLOTS,
    n_nodes,
    channels,
    stride_conv,
    stride_x,
    KERNEL: tl.constexpr,
    BLOCK: tl.constexpr,
    BATCHED: tl.constexpr,
):
    seq = tl.program_id(2)  # a batched round's sequence (0 alone)
    if BATCHED:  # its cache slot's conv states and staged inputs
        cache_slot = tl.load(SLOTS + seq).to(tl.int64)
        CONV += cache_slot * stride_conv
        X += cache_slot * stride_x
    PATH += seq * n_nodes
    PATH_LEN += seq
    WINDOWS += seq * n_nodes * KERNEL
    layer = tl.program_id(0)
    chans = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = chans < channels
    # conv [L, K - 1, C]; x [L, N, C]
    CONV += layer * (KERNEL - 1) * channels
    X += layer * n_nodes * channels
    last = tl.load(PATH + tl.load(PATH_LEN) - 1)
    # the last node's window after its oldest tap; taps are in ascending hist order, and a tap
    # that reads a conv row j reads it before row j is written (row j is written by tap j + 1)
    for j in tl.static_range(KERNEL - 1):
        row = tl.load(WINDOWS + last * KERNEL + 1 + j) + tl.zeros_like(chans)  # as a block: masks need one
        value = hist_row(CONV, X, row, chans, ok, channels, channels, KERNEL)
        tl.debug_barrier()
        tl.store(CONV + j * channels + chans, value, mask=ok)


def gdn_commit(
    states: Tensor,
    conv_states: Tensor,
    k: Tensor,
    d: Tensor,
    gsum: Tensor,
    x: Tensor,
    windows: Tensor,
    path: Tensor,
    path_len: Tensor,
    slots: Tensor | None = None,
) -> None:
    """Move every layer's states along the accepted path, in place.

    states [L, Hv, Dk, Dv] fp32; conv_states [L, K-1, C]; the staging of the verify pass: k
    [L, N, Hk, Dk], d [L, Hv, N, Dv] and gsum [L, Hv, N] (fp32), x [L, N, C]; the plan's windows
    [N, K]; path [N] (node indices, padded with -1) and path_len (0-d, the root counted).

    With ``slots`` [P] (cache slots on the device, distinct but for a scratch slot that padding
    sequences may repeat, whose states then come out undefined): P sequences, sequence p in slot
    ``slots[p]`` of every slot's states and staging (each of the tensors above with a leading slot
    axis [S, ...]), along its tree's windows ``windows[p]`` [P, N, K] and its path ``path[p]``
    [P, N] of length ``path_len[p]`` [P].
    """
    seqs = 1 if slots is None else slots.shape[0]

    def one(t: Tensor) -> Tensor:  # a slot's own
        return t if slots is None else t[0]

    layers, hv, dk, dv = one(states).shape
    _, n, hk, _ = one(k).shape
    channels = one(conv_states).shape[2]
    kernel = windows.shape[-1]
    want = {
        "k": (k, (layers, n, hk, dk)),
        "d": (d, (layers, hv, n, dv)),
        "gsum": (gsum, (layers, hv, n)),
        "x": (x, (layers, n, channels)),
        "conv_states": (conv_states, (layers, kernel - 1, channels)),
    }
    for name, (tensor, shape) in want.items():
        if tuple(one(tensor).shape) != shape or not one(tensor).is_contiguous():
            raise RuntimeError(
                f"gdn_commit wants {name} {list(shape)} contiguous (per slot), got {tuple(tensor.shape)}"
            )
    paths = (n,) if slots is None else (seqs, n)
    if not one(states).is_contiguous() or states.dtype != torch.float32 or path.shape != paths:
        raise RuntimeError(
            f"gdn_commit wants a contiguous fp32 states tensor (per slot) and paths {list(paths)}, got "
            f"{tuple(states.shape)} {states.dtype} and {tuple(path.shape)}"
        )
    if not path.is_contiguous():
        raise RuntimeError("gdn_commit wants contiguous paths")
    if windows.shape != (*paths, kernel) or not windows.is_contiguous() or path_len.numel() != seqs:
        raise RuntimeError(
            f"gdn_commit wants windows {[*paths, kernel]} and {seqs} path length(s), got windows "
            f"{tuple(windows.shape)} and path_len {tuple(path_len.shape)}"
        )

    def slot_stride(t: Tensor) -> int:
        return 0 if slots is None else t.stride(0)

    block_v = max(16, min(32, next_pow2(dv)))
    _commit_state_kernel[(layers * hv, cdiv(dv, block_v), seqs)](
        states,
        k,
        d,
        gsum,
        path,
        path_len,
        path if slots is None else slots,
        n,
        *(slot_stride(t) for t in (states, k, d, gsum)),
        HK=hk,
        HV=hv,
        DK=dk,
        DV=dv,
        DK_PAD=max(16, next_pow2(dk)),
        BLOCK_V=block_v,
        BLOCK_P=16,
        PRECISION=dot_precision(k.dtype),
        BATCHED=slots is not None,
        num_warps=4,
    )
    block = 1024
    _commit_conv_kernel[(layers, cdiv(channels, block), seqs)](
        conv_states,
        x,
        windows,
        path,
        path_len,
        path if slots is None else slots,
        n,
        channels,
        slot_stride(conv_states),
        slot_stride(x),
        KERNEL=kernel,
        BLOCK=block,
        BATCHED=slots is not None,
        num_warps=4,
    )
