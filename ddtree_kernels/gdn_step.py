"""One token through a Gated DeltaNet layer's recurrence and output norm: the `ar` step, one launch.

Per value head h (state S [Dk, Dv] in fp32, q/k of key head h // (Hv / Hk), Yang et al., "Gated
Delta Networks", arXiv 2412.06464):

    S <- exp(g) S;   d = beta (v - S^T k);   S <- S + k d^T;   o = S^T q

which, with S the cached state, is d = beta (v - exp(g) S^T k) and o = exp(g) S^T q + (q . k) d:
both products read S once. Then the gated RMSNorm of o with silu(z)
(`ddtree_kernels/gated_rms_norm.py`). One program per value head holds the head's whole state in
registers, reads it once and writes it once, and writes the head's normed output. At batch 1 the
state is the step's only sizeable traffic outside the weights (Hv Dk Dv fp32 read and written per
layer); everything else is launches, which this fuses away: the whole DeltaNet mixer of an `ar`
step is this and `gdn_inputs`.

The state's value columns are independent, so where the heads alone would leave most SMs idle (the
27B's 48 heads on 132 SMs: 6.9 µs a layer, 64 KB in and out per program) each head's columns are
split across programs (`column_splits`). The norm needs the whole head: each split stores its
columns of o in the model dtype (the norm's first rounding) and bumps the head's arrival count;
the last to arrive reads the head back and normalizes it, as `split_k.store_tile` sums partials.

A batched pass (continuous batching) steps P sequences at once, each in its own cache slot: the
same program per (value head, sequence), the sequence's slot index read on the device, so the `ar`
rows of a round cost one launch per layer instead of one per sequence.

For an FP8 target's ``out_proj`` (``group``) each program writes its head quantized instead, as
``fp8_gemm.act_quant`` would quantize the normed row, when whole groups fall in a head
(``gdn_step_fits``: Qwen's 128-column groups and 128-wide value heads); else the row stays in the
model dtype and the linear quantizes it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels import pdl
from ddtree_kernels.fp8_gemm import quantize_row
from ddtree_kernels.gated_rms_norm import gated_norm, whole_groups
from ddtree_kernels.host import QuantizedRows, cdiv, next_pow2, num_sms
from ddtree_kernels.pdl import release_dependents
from ddtree_kernels.split_k import arrival_counts, arrived_last, checked_tiles

MIN_SPLIT_COLUMNS = 16  # the narrowest slice of a head's value columns a program takes


@triton.jit
def _gdn_step_kernel(
    Q,
    K,
    V,
    G,
    BETA,
    STATE,
    PROJ,
    W,
    OUT,
    Q_OUT,
    S_OUT,
    SLOTS,
    O_PART,
    COUNTS,
    z_col,
    eps,
    stride_pt,
    stride_slot,
    stride_q,
    stride_s,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    DK_PAD: tl.constexpr,
    DV_PAD: tl.constexpr,
    BATCHED: tl.constexpr,
    GROUP: tl.constexpr,
    SPLITS: tl.constexpr,
    PDL: tl.constexpr,
):
    """GROUP 0: the normed output into OUT in the model dtype; else quantized into Q_OUT, S_OUT.
    Program (h * SPLITS + part, t) advances value columns ``part`` of head h; with SPLITS > 1 the
    head's last split to arrive writes its output (O_PART [T, HV, DV_PAD] holds o, COUNTS the
    arrivals)."""
    release_dependents(PDL)  # out_proj may start fetching its weight
    h = tl.program_id(0) // SPLITS
    part = tl.program_id(0) % SPLITS
    hk = h // (HV // HK)
    t = tl.program_id(1)
    if BATCHED:  # sequence t's token in row t of every input, its state in slot SLOTS[t]
        STATE += tl.load(SLOTS + t).to(tl.int64) * stride_slot
        Q += t * HK * DK
        K += t * HK * DK
        V += t * HV * DV
        G += t * HV
        BETA += t * HV
        PROJ += t * stride_pt
        OUT += t * HV * DV
        Q_OUT += t * stride_q
        S_OUT += t * stride_s
    rows = tl.arange(0, DK_PAD)
    cols = part * (DV_PAD // SPLITS) + tl.arange(0, DV_PAD // SPLITS)
    r_ok, v_ok = rows < DK, cols < DV
    mask = r_ok[:, None] & v_ok[None, :]
    STATE += h * DK * DV
    decay = tl.exp(tl.load(G + h))
    kv = tl.load(K + hk * DK + rows, mask=r_ok, other=0.0).to(tl.float32)
    qv = tl.load(Q + hk * DK + rows, mask=r_ok, other=0.0).to(tl.float32)
    v = tl.load(V + h * DV + cols, mask=v_ok, other=0.0).to(tl.float32)
    s = tl.load(STATE + rows[:, None] * DV + cols[None, :], mask=mask, other=0.0)
    d = tl.load(BETA + h) * (v - decay * tl.sum(kv[:, None] * s, 0))
    o = decay * tl.sum(qv[:, None] * s, 0) + tl.sum(qv * kv, 0) * d
    tl.store(STATE + rows[:, None] * DV + cols[None, :], decay * s + kv[:, None] * d[None, :], mask=mask)
    if SPLITS > 1:
        head = O_PART + (t * HV + h) * DV_PAD
        tl.store(head + cols, o.to(PROJ.dtype.element_ty))
        if arrived_last(COUNTS, t * HV + h, SPLITS):
            head_cols = tl.arange(0, DV_PAD)
            o_head = tl.load(head + head_cols, cache_modifier=".cg").to(tl.float32)
            _norm_out(
                o_head, head_cols, head_cols < DV, h, PROJ, W, OUT, Q_OUT, S_OUT, z_col, eps, HV, DV, GROUP
            )
    else:
        _norm_out(o, cols, v_ok, h, PROJ, W, OUT, Q_OUT, S_OUT, z_col, eps, HV, DV, GROUP)


@triton.jit
def _norm_out(
    o,
    cols,
    v_ok,
    h,
    PROJ,
    W,
    OUT,
    Q_OUT,
    S_OUT,
    z_col,
    eps,
    HV: tl.constexpr,
    DV: tl.constexpr,
    GROUP: tl.constexpr,
):
    """Head h's gated RMSNorm of o (its whole [DV_PAD] row), stored or quantized."""
    z = tl.load(PROJ + z_col + h * DV + cols, mask=v_ok, other=0.0)
    w = tl.load(W + cols, mask=v_ok, other=0.0)
    out = gated_norm(o, z, w, v_ok, eps, DV, PROJ.dtype.element_ty)
    if GROUP == 0:
        tl.store(OUT + h * DV + cols, out, mask=v_ok)
    else:  # DV == DV_PAD
        quantize_row(out.to(tl.float32), Q_OUT, S_OUT, h * DV, HV * DV, GROUP, DV)


def gdn_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    proj: Tensor,
    z_col: int,
    norm_weight: Tensor,
    eps: float,
    slots: Tensor | None = None,
    group: int | None = None,
) -> Tensor | QuantizedRows:
    """One token: q, k [1, Hk, Dk]; v [1, Hv, Dv]; g, beta [1, Hv] (fp32); state [Hv, Dk, Dv] fp32,
    advanced in place; z = proj[0, z_col : z_col + Hv Dv]. Returns the normed output [1, Hv Dv].

    With ``slots`` [P] (cache slots on the device, distinct but for a scratch slot that padding
    rows may repeat, whose rows and state then come out undefined): one token of each of P sequences, the
    inputs [P, ...] and the states of every slot [S, Hv, Dk, Dv] (each slot's contiguous); row p
    advances ``state[slots[p]]``. Returns [P, Hv Dv].

    With ``group`` (which must tile a head: `gdn_step_fits`) the output comes quantized per row and
    group of ``group`` columns, for an FP8 ``out_proj``."""
    p, hk, dk = q.shape
    _, hv, dv = v.shape
    rows = 1 if slots is None else slots.shape[0]
    heads = (p, hv)
    if (
        p != rows
        or k.shape != q.shape
        or hv % hk
        or v.shape[0] != p
        or g.shape != heads
        or beta.shape != heads
    ):
        raise RuntimeError(
            f"gdn_step wants {rows} token(s): q, k [{rows}, Hk, Dk], v [{rows}, Hv, Dv], g, beta [{rows}, Hv]; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}"
        )
    one = state if slots is None else state[0]
    if one.shape != (hv, dk, dv) or state.dtype != torch.float32 or not one.is_contiguous():
        raise RuntimeError(
            f"gdn_step wants a contiguous fp32 state [{hv}, {dk}, {dv}] (per slot), got {tuple(state.shape)}"
        )
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()) or proj.stride(1) != 1:
        raise RuntimeError("gdn_step wants contiguous q, k, v and proj with a unit last stride")
    if group is not None and not gdn_step_fits(group, dv):
        raise RuntimeError(
            f"gdn_step quantizes power-of-two groups of 16..{dv} columns (whole in a head of {dv}), not {group}"
        )
    quant = None if group is None else QuantizedRows.empty(p, hv * dv, group, proj.dtype, q.device)
    out = quant.x8 if quant else torch.empty(p, hv * dv, device=q.device, dtype=proj.dtype)
    dv_pad = max(16, next_pow2(dv))
    splits = column_splits(hv, dv_pad, num_sms(q.device))
    checked_tiles(p * hv, splits)  # a head's arrival count each
    o_part = torch.empty(p, hv, dv_pad, device=q.device, dtype=proj.dtype) if splits > 1 else out
    _gdn_step_kernel[(hv * splits, p)](
        q,
        k,
        v,
        g,
        beta,
        state,
        proj,
        norm_weight,
        out,
        out,
        quant.scale if quant else out,
        state if slots is None else slots,
        o_part,
        arrival_counts(q.device),
        z_col,
        eps,
        proj.stride(0),
        0 if slots is None else state.stride(0),
        quant.x8.stride(0) if quant else 0,
        quant.scale.stride(0) if quant else 0,
        HK=hk,
        HV=hv,
        DK=dk,
        DV=dv,
        DK_PAD=max(16, next_pow2(dk)),
        DV_PAD=dv_pad,
        BATCHED=slots is not None,
        GROUP=0 if group is None else group,
        SPLITS=splits,
        PDL=pdl.enabled(q.device),
        num_warps=8 if splits == 1 else 4,
    )
    return out if quant is None else quant


def column_splits(hv: int, dv_pad: int, sms: int) -> int:
    """Programs per value head: enough for the heads to cover the SMs once, each at least
    ``MIN_SPLIT_COLUMNS`` wide. The same for one sequence and a batch, so that a slot's step has
    the same bits either way."""
    return max(1, min(dv_pad // MIN_SPLIT_COLUMNS, next_pow2(cdiv(sms, hv))))


def gdn_step_fits(group: int, dv: int) -> bool:
    """Whether `gdn_step` can quantize its heads of Dv by `group` columns (whole groups in a head)."""
    return whole_groups(group, 1, dv)
