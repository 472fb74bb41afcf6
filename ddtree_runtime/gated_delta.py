"""Gated DeltaNet in PyTorch: the CPU path of the hybrid's DeltaNet layers and the kernels' oracle.

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
Because d_s depends only on the ancestors of s, the state after an accepted path p_0..p_{n-1} needs
no second pass:

    S_new = exp(G_last) S0 + sum_a exp(G_last - G_{p_a}) k_{p_a} d_{p_a}^T

The short causal conv1d in front of the recurrence reads its window along the ancestors as well:
node i's window is its K-1 nearest ancestors (then the cached conv inputs) and itself.

A layer's inputs come from its fused projection ``[mixed (C) | z (Hv Dv) | b (Hv) | a (Hv)]``
(``ddtree_kernels/gdn_inputs.py`` says how); the output leaves through the gated RMSNorm. Layouts here
are head-major fp32 with the key heads repeated to the value heads ([H, N, D]), the clearest form of
the maths; the Triton path keeps token-major tensors of the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK = 64  # prefill runs as chains of this many tokens, each one "tree" of the form above


@dataclass(frozen=True)
class GdnSpec:
    """One DeltaNet layer's sizes and small weights: what the backends need beside its projection."""

    n_k: int
    n_v: int
    dk: int
    dv: int
    eps: float
    conv_weight: Tensor  # [C, K]
    a_log: Tensor  # [Hv]
    dt_bias: Tensor  # [Hv]
    norm_weight: Tensor  # [Dv]

    @property
    def heads(self) -> tuple[int, int, int, int]:
        return self.n_k, self.n_v, self.dk, self.dv

    @property
    def conv_dim(self) -> int:
        return 2 * self.n_k * self.dk + self.n_v * self.dv

    @property
    def kernel(self) -> int:
        return self.conv_weight.shape[1]


@dataclass(frozen=True)
class TreeAncestry:
    """The torch backend's per-round plan of a tree: ancestor-or-self matrix and conv windows."""

    anc: Tensor  # bool [N, N]
    windows: Tensor  # [N, K] rows of cat(conv_state, x)


@dataclass
class Staged:
    """What a verify pass keeps per DeltaNet layer so that the commit can advance its states."""

    x: Tensor  # [N, C] conv inputs
    k: Tensor  # [H, N, Dk]
    d: Tensor  # [H, N, Dv]
    big_g: Tensor  # [H, N]


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


def chain_parents(n: int, device: torch.device) -> Tensor:
    return torch.arange(-1, n - 1, device=device)


def inputs(proj: Tensor, conv_state: Tensor, spec: GdnSpec, windows: Tensor) -> tuple[Tensor, ...]:
    """q, k [Hv, N, Dk], v [Hv, N, Dv], g, beta [Hv, N] (fp32) from the fused projection [N, ...]."""
    n, c = proj.shape[0], spec.conv_dim
    hist = torch.cat([conv_state, proj[:, :c].to(conv_state.dtype)])  # [K-1 + N, C]
    w = spec.conv_weight.to(hist.dtype)
    qkv = F.silu((hist[windows] * w.t()[None]).sum(dim=1)).float()  # the conv in the model dtype
    q, k, v = qkv.split([spec.n_k * spec.dk, spec.n_k * spec.dk, spec.n_v * spec.dv], dim=-1)
    rep = spec.n_v // spec.n_k
    q = F.normalize(q.view(n, spec.n_k, spec.dk), dim=-1, eps=1e-6)  # l2norm, as transformers
    k = F.normalize(k.view(n, spec.n_k, spec.dk), dim=-1, eps=1e-6)
    q = q.repeat_interleave(rep, dim=1).transpose(0, 1) * spec.dk**-0.5  # [Hv, N, Dk]
    k = k.repeat_interleave(rep, dim=1).transpose(0, 1)
    v = v.view(n, spec.n_v, spec.dv).transpose(0, 1)  # [Hv, N, Dv]
    gates = c + spec.n_v * spec.dv
    b, a = proj[:, gates : gates + spec.n_v].float(), proj[:, gates + spec.n_v : gates + 2 * spec.n_v].float()
    beta = torch.sigmoid(b).t()  # [Hv, N]
    g = (-spec.a_log.float().exp() * F.softplus(a + spec.dt_bias.float())).t()
    return q, k, v, g, beta


def advance_conv(conv_state: Tensor, proj: Tensor, spec: GdnSpec) -> None:
    """A committed chain's conv state: the last K-1 conv inputs of cat(conv_state, mixed), in place
    (call after the chain's conv has read the old rows)."""
    hist = torch.cat([conv_state, proj[:, : spec.conv_dim].to(conv_state.dtype)])
    conv_state.copy_(hist[-(spec.kernel - 1) :])


def gated_norm(o: Tensor, proj: Tensor, spec: GdnSpec) -> Tensor:
    """o [Hv, N, Dv] (fp32) -> RMSNorm per head, times silu(z): [N, Hv Dv] in proj's dtype."""
    n, dtype = proj.shape[0], proj.dtype
    z = proj[:, spec.conv_dim : spec.conv_dim + spec.n_v * spec.dv].reshape(n, spec.n_v, spec.dv)
    x = o.transpose(0, 1).to(dtype).float()  # [N, Hv, Dv]
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + spec.eps)).to(dtype)
    return (spec.norm_weight * normed * F.silu(z.float())).to(dtype).reshape(n, -1)


def tree_form(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, anc: Tensor, state: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The WY form above. q, k: [H, N, Dk]; v: [H, N, Dv]; g, beta: [H, N]; anc: bool [N, N]
    ancestor-or-self; state: [H, Dk, Dv] (all fp32). Returns o [H, N, Dv], d [H, N, Dv], G [H, N]."""
    n = anc.shape[0]
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


def chain(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """A committed chain (prefill, `ar`): chunks of CHUNK tokens, each the tree form of a chain.
    Shapes as `tree_form`; returns o [H, T, Dv] and the final state."""
    outs = []
    for s in range(0, q.shape[1], CHUNK):
        e = min(s + CHUNK, q.shape[1])
        anc = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
        o, d, big_g = tree_form(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], anc, state)
        path = torch.arange(e - s, device=q.device)
        state = advance_state(state, k[:, s:e], d, big_g, path, torch.tensor(e - s, device=q.device))
        outs.append(o)
    return torch.cat(outs, dim=1), state
