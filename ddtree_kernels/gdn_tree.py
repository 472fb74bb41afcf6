"""Tree-aware Gated DeltaNet: every node of a token tree through the recurrence of its own root path.

The gated delta rule (Yang et al., "Gated Delta Networks", arXiv 2412.06464), per value head, state
S [Dk, Dv], per token t (q, k l2-normalised, q scaled by Dk^-1/2, log-decay g_t <= 0):

    S <- exp(g_t) S;   d_t = beta_t (v_t - S^T k_t);   S <- S + k_t d_t^T;   o_t = S^T q_t

DDTree verification (Ringel & Romano, arXiv 2604.12989) feeds N nodes in topological order (node 0
the root, parents[i] < i). Node i must see the recurrence along its own root path from the cached
state S0. Unroll it along that path: with G_i the sum of g over the ancestors-or-self of i and
anc(i) the strict ancestors,

    d_i = beta_i (v_i - exp(G_i) k_i^T S0 - sum_{s in anc(i)} exp(G_i - G_s) (k_i . k_s) d_s)    (1)
    o_i = exp(G_i) q_i^T S0 + sum_{s in anc(i) + {i}} exp(G_i - G_s) (q_i . k_s) d_s              (2)

which is the chunked (WY / UT) form of the chain with the causal triangle replaced by the
strict-ancestor mask and the cumulative gates summed along the ancestor path: (I + A) D = R with
A[i, s] = beta_i exp(G_i - G_s) (k_i . k_s) on strict ancestors. Restricted to any root path it is
exactly the chain. Ancestors come first, so the system is unit lower triangular and is solved
block by block in node order: node block b subtracts A[b, c] D_c for every earlier block c, then
solves its own diagonal block with the Neumann series D_b = sum_m (-A_bb)^m R_b, which is exact
after L terms because A_bb only links a node to strictly shallower ones (A_bb^(L+1) = 0 when the
block's depths span L levels: L <= min(tree depth, BLOCK_T - 1), so a DDTree block of depth <= 15
needs at most 15 small matmuls and a chain block at most BLOCK_T - 1). G_s, the ancestor relation and the depth come from
walking `parents` up inside the kernel, so nothing syncs with the host.

The corrections d and the path sums G are returned too: the state after an accepted root path
p_0..p_{n-1} is then exp(G_last) S0 + sum_a exp(G_last - G_{p_a}) k_{p_a} d_{p_a}^T, with no
second pass (`ddtree_runtime.models.gdn.advance_state`).

One program per (value head, block of BLOCK_V value columns) holds its S0 columns [Dk, BLOCK_V] and
walks the node blocks of BLOCK_T nodes in order, reading back the corrections its earlier blocks
stored. fp32 throughout (`input_precision="ieee"`: tf32 would break T = 0 exactness).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import next_pow2

MAX_NODES = 4096


@triton.jit
def _ancestry(PARENTS, G, rows, cols, n_nodes):
    """anc[i, s]: col s is an ancestor-or-self of row i; the row nodes' path-summed gates; levels:
    the longest strict-ancestor chain that can stay inside the rows (the rows' depth spread)."""
    row_ok = rows < n_nodes
    anc = (rows[:, None] == cols[None, :]) & row_ok[:, None]
    gsum = tl.load(G + rows, mask=row_ok, other=0.0)
    cur = tl.load(PARENTS + rows, mask=row_ok, other=-1)
    depth = tl.zeros_like(cur)
    while tl.max(cur, axis=0) >= 0:
        anc = anc | (cur[:, None] == cols[None, :])
        gsum += tl.load(G + cur, mask=cur >= 0, other=0.0)
        depth += (cur >= 0).to(depth.dtype)
        cur = tl.load(PARENTS + cur, mask=cur >= 0, other=-1)
    levels = tl.max(depth, axis=0) - tl.min(tl.where(row_ok, depth, n_nodes), axis=0)
    return anc, gsum, levels


@triton.jit
def _gdn_tree_kernel(
    Q,
    K,
    V,
    G,
    BETA,
    PARENTS,
    S0,
    OUT,
    D,
    GSUM,
    n_nodes,
    DK: tl.constexpr,
    DV: tl.constexpr,
    DK_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    tl.static_assert(BLOCK_T >= 16 and DK_PAD >= 16 and BLOCK_V >= 16)  # tl.dot's smallest tile
    head = tl.program_id(0)
    vcol = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    dk = tl.arange(0, DK_PAD)
    v_ok, k_ok = vcol < DV, dk < DK
    # inputs are contiguous: q, k [H, N, DK]; v, o, d [H, N, DV]; g, beta, gsum [H, N]; s0 [H, DK, DV]
    Q, K = Q + head * n_nodes * DK, K + head * n_nodes * DK
    V, OUT, D = V + head * n_nodes * DV, OUT + head * n_nodes * DV, D + head * n_nodes * DV
    G, BETA, GSUM = G + head * n_nodes, BETA + head * n_nodes, GSUM + head * n_nodes
    s0 = tl.load(
        S0 + head * DK * DV + dk[:, None] * DV + vcol[None, :], mask=k_ok[:, None] & v_ok[None, :], other=0.0
    )

    for b0 in range(0, n_nodes, BLOCK_T):
        rows = b0 + tl.arange(0, BLOCK_T)
        r_ok = rows < n_nodes
        kb = tl.load(K + rows[:, None] * DK + dk[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        qb = tl.load(Q + rows[:, None] * DK + dk[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        vb = tl.load(V + rows[:, None] * DV + vcol[None, :], mask=r_ok[:, None] & v_ok[None, :], other=0.0)
        beta = tl.load(BETA + rows, mask=r_ok, other=0.0)
        anc, gb, levels = _ancestry(PARENTS, G, rows, rows, n_nodes)
        # (1) and (2) against the cached state
        rhs = beta[:, None] * (vb - tl.exp(gb)[:, None] * tl.dot(kb, s0, input_precision="ieee"))
        out = tl.exp(gb)[:, None] * tl.dot(qb, s0, input_precision="ieee")
        # ... against the corrections of the earlier node blocks (ancestors only)
        for c0 in range(0, b0, BLOCK_T):
            cols = c0 + tl.arange(0, BLOCK_T)
            kc = tl.load(K + cols[:, None] * DK + dk[None, :], mask=k_ok[None, :], other=0.0)
            dc = tl.load(D + cols[:, None] * DV + vcol[None, :], mask=v_ok[None, :], other=0.0)
            gc = tl.load(GSUM + cols)
            anc_c, _, _ = _ancestry(PARENTS, G, rows, cols, n_nodes)
            decay = tl.where(anc_c, tl.exp(gb[:, None] - gc[None, :]), 0.0)
            kk = tl.dot(kb, tl.trans(kc), input_precision="ieee")
            rhs -= tl.dot(beta[:, None] * kk * decay, dc, input_precision="ieee")
            out += tl.dot(
                tl.dot(qb, tl.trans(kc), input_precision="ieee") * decay, dc, input_precision="ieee"
            )
        # the diagonal block: Neumann series of its strict-ancestor part, exact after `levels` terms
        decay = tl.where(anc, tl.exp(gb[:, None] - gb[None, :]), 0.0)
        strict = tl.where(rows[:, None] == rows[None, :], 0.0, decay)
        a = beta[:, None] * tl.dot(kb, tl.trans(kb), input_precision="ieee") * strict
        d = rhs
        for _ in range(tl.minimum(levels, BLOCK_T - 1)):
            d = rhs - tl.dot(a, d, input_precision="ieee")
        out += tl.dot(tl.dot(qb, tl.trans(kb), input_precision="ieee") * decay, d, input_precision="ieee")
        tile = rows[:, None] * DV + vcol[None, :]
        tl.store(D + tile, d, mask=r_ok[:, None] & v_ok[None, :])
        tl.store(OUT + tile, out, mask=r_ok[:, None] & v_ok[None, :])
        tl.store(GSUM + rows, gb, mask=r_ok)  # every program writes the same values
        tl.debug_barrier()  # this block's D and G are read back by the later blocks


def _launch(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, parents: Tensor, state: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    h, n, dk = q.shape
    dv = v.shape[-1]
    if k.shape != q.shape or v.shape[:2] != (h, n) or g.shape != (h, n) or beta.shape != (h, n):
        raise RuntimeError(
            f"gdn_tree wants q, k [H, N, Dk], v [H, N, Dv], g, beta [H, N]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)}"
        )
    if parents.shape != (n,) or state.shape != (h, dk, dv):
        raise RuntimeError(
            f"gdn_tree wants parents [{n}] and state [{h}, {dk}, {dv}]; got {tuple(parents.shape)} and "
            f"{tuple(state.shape)}"
        )
    if not 1 <= n <= MAX_NODES:
        raise RuntimeError(f"gdn_tree supports 1..{MAX_NODES} nodes, got {n}")
    f32 = [x.float().contiguous() for x in (q, k, v, g, beta, state)]
    o = torch.empty(h, n, dv, device=q.device, dtype=torch.float32)
    d = torch.empty_like(o)
    gsum = torch.empty(h, n, device=q.device, dtype=torch.float32)
    block_v = max(16, min(64, next_pow2(dv)))
    grid = (h, -(-dv // block_v))
    _gdn_tree_kernel[grid](
        *f32[:5],
        parents.to(torch.int32).contiguous(),
        f32[5],
        o,
        d,
        gsum,
        n,
        DK=dk,
        DV=dv,
        DK_PAD=max(16, next_pow2(dk)),
        BLOCK_T=32,
        BLOCK_V=block_v,
    )
    return o, d, gsum


def gdn_tree(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, parents: Tensor, state: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Gated DeltaNet over a tree from the cached state (the docstring's (1), (2)).

    q, k: [H, N, Dk] (l2-normalised, q scaled); v: [H, N, Dv]; g (log-decay), beta: [H, N];
    parents: [N] with parents[0] = -1 and parents[i] < i; state: [H, Dk, Dv]. Returns fp32
    o [H, N, Dv], corrections d [H, N, Dv] and path-summed gates G [H, N].
    """
    return _launch(q, k, v, g, beta, parents, state)


def gdn_tree_reference(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, parents: Tensor, state: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The definition, node by node: each node's state is its parent's state stepped once."""
    n = q.shape[1]
    q, k, v, g, beta, state = (x.double() for x in (q, k, v, g, beta, state))
    states, gsum = [], []
    o, d = torch.zeros_like(v), torch.zeros_like(v)
    for i in range(n):
        p = int(parents[i])
        s = state if p < 0 else states[p]
        gsum.append(g[:, i] + (0.0 if p < 0 else gsum[p]))
        s = s * g[:, i].exp()[:, None, None]
        d[:, i] = beta[:, i, None] * (v[:, i] - torch.einsum("hkv,hk->hv", s, k[:, i]))
        s = s + k[:, i, :, None] * d[:, i, None, :]
        o[:, i] = torch.einsum("hkv,hk->hv", s, q[:, i])
        states.append(s)
    return o.float(), d.float(), torch.stack(gsum, dim=1).float()
