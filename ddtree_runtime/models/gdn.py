"""Gated DeltaNet over a token tree, in PyTorch: the CPU path and the oracle of `ddtree_kernels/gdn_tree.py`.

The gated delta rule (Yang et al., "Gated Delta Networks", arXiv 2412.06464), per value head, with
the state S [Dk, Dv] and for each token t (q, k l2-normalised, q scaled by Dk^-1/2, g_t <= 0):

    S <- exp(g_t) S;   d_t = beta_t (v_t - S^T k_t);   S <- S + k_t d_t^T;   o_t = S^T q_t

A verify pass feeds a *tree* of N nodes (node 0 the root, parents[i] < i). Node i's state must be
the recurrence along its own root path from the cached state S0, never along the flattened order.
Unrolling the recurrence along that path (the WY / UT form of the chunked delta rule) with
G_i = sum of g over the ancestors-or-self of i and anc(i) the strict ancestors:

    d_i = beta_i (v_i - exp(G_i) S0^T k_i - sum_{s in anc(i)} exp(G_i - G_s) (k_i . k_s) d_s)
    o_i = exp(G_i) S0^T q_i + sum_{s in anc(i) + {i}} exp(G_i - G_s) (q_i . k_s) d_s

So D = (I + A)^-1 R with A[i, s] = beta_i exp(G_i - G_s) (k_i . k_s) on strict ancestors and
R = beta (V - exp(G) K S0): the chain's causal triangle with the strict-ancestor mask in its place.
Ancestors have smaller indices, so I + A stays unit lower triangular; restricted to one root path it
is exactly the chain computation. Because d_s depends only on the ancestors of s, the state after an
accepted path p_0..p_{n-1} needs no second pass:

    S_new = exp(G_last) S0 + sum_a exp(G_last - G_{p_a}) k_{p_a} d_{p_a}^T

The short causal conv1d in front of the recurrence reads its window along the ancestors as well:
node i's window is its K-1 nearest ancestors (then the cached conv inputs) and itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree_runtime.backend import _ancestors

CHUNK = 64  # prefill runs as chains of this many tokens, each one "tree" of the form above


def conv_windows(parents: Tensor, kernel: int) -> Tensor:
    """Rows [N, kernel] of `cat(conv_state [kernel - 1], x [N])` that node i's conv reads, oldest
    first: its kernel - 1 nearest ancestors, continuing into the cached inputs above the root."""
    n, hist = parents.shape[0], kernel - 1
    rows = torch.arange(hist + n, device=parents.device)
    node_parent = torch.where(parents >= 0, parents + hist, torch.full_like(parents, hist - 1))
    up = torch.cat([(rows[:hist] - 1).clamp(min=0), node_parent])  # the row each row follows
    cols = [rows[hist:]]
    for _ in range(hist):
        cols.append(up[cols[-1]])
    return torch.stack(cols[::-1], dim=1)


def tree_conv(x: Tensor, conv_state: Tensor, weight: Tensor, windows: Tensor) -> Tensor:
    """silu(depthwise causal conv) along each node's window. x: [N, C]; conv_state: [K-1, C];
    weight: [C, K]; windows: [N, K]. Returns [N, C] in x's dtype."""
    hist = torch.cat([conv_state.to(weight.dtype), x.to(weight.dtype)])  # [K-1 + N, C]
    out = (hist[windows] * weight.t()[None]).sum(dim=1)  # [N, C]
    return F.silu(out).to(x.dtype)


def gdn_tree_torch(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, parents: Tensor, state: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The WY form above. q, k: [H, N, Dk]; v: [H, N, Dv]; g, beta: [H, N]; state: [H, Dk, Dv]
    (all fp32). Returns o [H, N, Dv], d [H, N, Dv] and G [H, N] (what `advance_state` needs)."""
    n = parents.shape[0]
    anc = _ancestors(parents)  # ancestor-or-self [N, N]
    strict = anc & ~torch.eye(n, dtype=torch.bool, device=anc.device)
    big_g = g @ anc.t().float()  # [H, N]: G_i = sum over ancestors-or-self
    decay = (big_g[:, :, None] - big_g[:, None, :]).masked_fill(~anc, float("-inf")).exp()  # [H, N, N]
    a = (beta[:, :, None] * (k @ k.transpose(1, 2)) * decay).masked_fill(~strict, 0.0)
    rhs = beta[:, :, None] * (v - big_g.exp()[:, :, None] * (k @ state))  # [H, N, Dv]
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    d = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    o = big_g.exp()[:, :, None] * (q @ state) + ((q @ k.transpose(1, 2)) * decay) @ d
    return o, d, big_g


def advance_state(
    state: Tensor, k: Tensor, d: Tensor, big_g: Tensor, path: Tensor, path_len: Tensor
) -> Tensor:
    """The state after the accepted path (padded with -1 past `path_len`), with no host sync.
    state: [H, Dk, Dv]; k: [H, N, Dk]; d: [H, N, Dv]; big_g: [H, N]. Returns [H, Dk, Dv]."""
    slots = torch.arange(path.shape[0], device=path.device)
    valid = slots < path_len
    nodes = path.clamp(min=0)
    last = path.gather(0, (path_len - 1).reshape(1))  # [1]
    g_last = big_g[:, last]  # [H, 1]
    w = (g_last - big_g[:, nodes]).masked_fill(~valid, float("-inf")).exp()  # [H, P]
    update = (k[:, nodes] * w[:, :, None]).transpose(1, 2) @ d[:, nodes]  # [H, Dk, Dv]
    return g_last.exp()[:, :, None] * state + update


def gdn_chain(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """A committed chain (prefill, `ar`): chunks of CHUNK tokens, each the tree form of a chain.
    Shapes as `gdn_tree_torch`; returns o [H, T, Dv] and the final state."""
    outs = []
    for s in range(0, q.shape[1], CHUNK):
        e = min(s + CHUNK, q.shape[1])
        parents = torch.arange(-1, e - s - 1, device=q.device)
        o, d, big_g = gdn_tree_torch(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], parents, state)
        state = advance_state(state, k[:, s:e], d, big_g, parents + 1, torch.tensor(e - s, device=q.device))
        outs.append(o)
    return torch.cat(outs, dim=1), state
