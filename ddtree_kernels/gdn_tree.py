"""Tree-aware Gated DeltaNet: every node of a token tree through the recurrence of its own root path.

The gated delta rule (Yang et al., "Gated Delta Networks", arXiv 2412.06464), per value head, state
S [Dk, Dv], per token t (q, k l2-normalised, q scaled by Dk^-1/2, log-decay g_t <= 0):

    S <- exp(g_t) S;   d_t = beta_t (v_t - S^T k_t);   S <- S + k_t d_t^T;   o_t = S^T q_t

DDTree verification (Ringel & Romano, arXiv 2604.12989) feeds N nodes in topological order (node 0
the root, parents[i] < i). Node i must see the recurrence along its own root path from the cached
state S0. Unrolled along that path, with G_i the sum of g over the ancestors-or-self of i and
anc(i) the strict ancestors,

    d_i = beta_i (v_i - exp(G_i) k_i^T S0 - sum_{s in anc(i)} exp(G_i - G_s) (k_i . k_s) d_s)    (1)
    o_i = exp(G_i) q_i^T S0 + sum_{s in anc(i) + {i}} exp(G_i - G_s) (q_i . k_s) d_s              (2)

the chunked (WY / UT) form of the chain with the causal triangle replaced by the ancestor relation:
(I + A) D = R, A[i, s] = beta_i exp(G_i - G_s) (k_i . k_s) on strict ancestors. Restricted to a
root path it is exactly the chain.

**The ancestor structure is computed once per round** (``tree_plan``): the tree is the same for all
heads and all DeltaNet layers of a verify pass. The plan holds the dense ancestor-or-self matrix
(0/1, int8, padded to whole node blocks of BLOCK_T), which blocks pairs of node blocks have any
ancestor link at all (a best-first tree hangs most nodes off a few early ones, so most pairs are
empty and skipped), for each diagonal block the number of squarings its solve needs, and each
node's conv window (``ddtree_kernels/gdn_inputs.py``). One launch walks every node's parent chain.

**Two kernels.** The intra-tree terms depend on q, k, beta and G only, not on the state or v, so
the first kernel (one program per value head and pair of node blocks (i, c) that holds ancestor
links, all in parallel) computes them as matmuls over the key dimension: the off-diagonal blocks
A[i, c] and P[i, c] = (q_i . k_s) exp(G_i - G_s) on ancestors, and for each diagonal block P[i, i]
and the inverse of its (I + A_ii) by repeated squaring: A_ii only links a node to strictly
shallower ones, so with L the longest ancestor chain inside the block, (-A_ii)^(L+1) = 0 and

    (I + A_ii)^-1 = sum_{m <= L} (-A_ii)^m = (I - A_ii)(I + A_ii^2)(I + A_ii^4) ...

ceil(log2(L + 1)) factors: 4 for a DDTree block of depth <= 15, 6 for a 64-node chain. Further
programs of the same launch (one per value head and node block) take each block against the cached
state, which needs no other block either: its right-hand side R_i = beta (V - exp(G) K S0) and its
outputs' start O0_i = exp(G) Q S0. The second kernel (one program per value head and block of value
columns) is the forward substitution in node order, the serial part of the layer, so it is left
only what depends on the earlier blocks: row block i starts from R_i, subtracts A[i, c] D_c for the
earlier blocks that hold its ancestors (read back from the D it stored), applies the inverse, and
gathers o_i = O0_i + sum_c P[i, c] D_c. A verify tree has 2^k + 1 nodes (the root and a budget of
2^k), so whole blocks would leave the last node alone in a block step of its own (5 steps for 257
nodes in 64-node blocks, 2 for 65). That lone node is a leaf (nothing depends on it), so it rides
along as the solve's **tail** instead: after the last full block, its row against the blocks that
hold its ancestors (row-vector products, not a matmul tile), with no squarings (its diagonal block
is 1); the plan says ``tail``. Measured on the H200 (Qwen3.6-27B's 48 value heads, graph-timed per layer)
against the schedule before these two (the state products inside the solve's steps, the lone node a
step of its own): 257 nodes 84.3 -> 75.3 µs (fla's chunked chain over 257 tokens: 59.6), 65 nodes
35.5 -> 31.1; 17 nodes, one block and no tail, 19.1 -> 19.5.

**A forest** (continuous batching): the verify trees of several sequences, all of one size, go
through both kernels at once (``gdn_forest``), a third grid axis over the trees: each tree reads its
inputs, plan and scratch at its own index, and its cached state (and stages its d and G) in its
sequence's cache slot, read on the device. A batched round then costs one launch pair per layer
whatever the number of sequences, instead of a pair per sequence.

The path sums G = anc @ g come out of the first kernel too: each program sums its rows' and columns'
ancestors in fp32 (an fp32 GEMM launch of its own cost 8 µs a layer on the H200, the first kernel's
whole run 13), and the diagonal programs store them. Every product is a tensor-core matmul (bf16 for
the q.k terms of a bf16 model, tf32 for the state and the solve; true fp32 for an fp32 model, which
must stay exact), computed in BLOCK_K slices of the key dimension so that no program holds a whole
[BLOCK_T, Dk] tile. The blocks A and P that the first kernel hands the second are stored in the
model's dtype (a 16-bit model's, as fla keeps its inverted blocks in bf16; an fp32 model stays
exact), the inverses and the blocks against the state in fp32: the solve reads every block once per
value block, and on the H100 (27B layer, 257 nodes, graph-timed, with the tail above as a row) the
pair took 58.9 µs a layer against 66.0 with fp32 blocks, an fp32 ancestor matrix and a 16-row tail,
for an error against fp64 of 1.88e-3 against 1.76e-3. The outputs come with the corrections d and
the path sums G, from which the state after an accepted path p_0..p_{n-1} follows with no second
pass:

    S_new = exp(G_last) S0 + sum_a exp(G_last - G_{p_a}) k_{p_a} d_{p_a}^T    (gdn_commit.py)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree_kernels.host import cdiv, next_pow2
from ddtree_kernels.precision import dot, dot_precision

MAX_NODES = 4096
# the solve's launch: value columns per program, warps; 32 columns against 64 on the H200 (27B layer,
# the solve alone, µs): 65 nodes 13.3 -> 12.8, 257 nodes 40.8 -> 36.5
BLOCK_V, NUM_WARPS = 32, 4
STATE_BLOCK_V = 64  # value columns per slice of the first kernel's programs against the cached state


def node_block(n: int, cc: int) -> int:
    """BLOCK_T for a tree of n nodes on compute capability `cc` (90, 100, 120): one block for a
    small tree, 64-node blocks for big trees on sm_90, whose solve's products are wgmma, and 32-node
    blocks otherwise: elsewhere a 64-node solve spills registers (ARCH.md), and on the H200 a
    65-node tree in 32-node blocks took 26.1 µs a layer against 31.3 in 64-node ones (257 nodes:
    94.3 against 74.8)."""
    return 16 if n <= 16 else 32 if n <= 128 or cc // 10 != 9 else 64


def lone_tail(n: int, block: int) -> bool:
    """Whether n nodes in blocks of ``block`` leave one node alone in the last block (2^k + 1)."""
    return n > block and n % block == 1


def _capability(device: torch.device) -> int:
    """major * 10 + minor of a CUDA device; the CPU interpreter stands in for an sm_90."""
    if device.type != "cuda":
        return 90
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


@dataclass(frozen=True)
class TreePlan:
    """What every DeltaNet layer of one verify pass shares about its tree (see the module docstring)."""

    anc: Tensor  # [NP, NP] int8 0/1: anc[i, j] = 1 iff j is an ancestor-or-self of i (NP = blocks * block)
    blocks: Tensor  # [NB, NB] int32: 1 iff node block i has an ancestor in node block c
    steps: Tensor  # [NB] int32: squarings of diagonal block i's solve
    windows: Tensor  # [N, K] int32: hist rows of each node's conv window, oldest first
    block: int  # BLOCK_T
    tail: bool  # the last node block holds one node, which the solve carries as a row (no step of its own)

    @property
    def num_nodes(self) -> int:
        return self.windows.shape[0]


@triton.jit
def _plan_kernel(PARENTS, DEPTH, ANC, WINDOWS, stride_anc, KERNEL: tl.constexpr):
    """Program i walks from node i to the root: its ancestor row, and its conv window's rows."""
    node = tl.program_id(0)
    cur = node.to(tl.int32)
    for _ in range(tl.load(DEPTH + node).to(tl.int32) + 1):
        tl.store(ANC + node * stride_anc + cur, 1)
        cur = tl.load(PARENTS + tl.maximum(cur, 0)).to(tl.int32)
    # window: the node, then its K - 1 nearest ancestors, then the cached conv rows above the root
    cur = node.to(tl.int32)
    row = cur + KERNEL - 1
    tl.store(WINDOWS + node * KERNEL + KERNEL - 1, row)
    for j in tl.static_range(KERNEL - 1):
        par = tl.load(PARENTS + tl.maximum(cur, 0)).to(tl.int32)
        row = tl.where(cur < 0, tl.maximum(row - 1, 0), tl.where(par >= 0, par + KERNEL - 1, KERNEL - 2))
        cur = tl.where(cur < 0, cur, par)
        tl.store(WINDOWS + node * KERNEL + KERNEL - 2 - j, row)


def tree_plan(parents: Tensor, depth: Tensor, kernel: int, block: int | None = None) -> TreePlan:
    """The round's plan from ``parents`` (parents[i] < i, root -1) and ``depth``, with no host sync."""
    if parents.dim() != 1 or depth.shape != parents.shape:
        raise RuntimeError(
            f"tree_plan wants parents and depth [N], got {tuple(parents.shape)}, {tuple(depth.shape)}"
        )
    n = parents.shape[0]
    if not 1 <= n <= MAX_NODES:
        raise RuntimeError(f"tree_plan supports 1..{MAX_NODES} nodes, got {n}")
    block = block or node_block(n, _capability(parents.device))
    nb = cdiv(n, block)
    np_ = nb * block
    anc = torch.zeros(np_, np_, device=parents.device, dtype=torch.int8)
    windows = torch.empty(n, kernel, device=parents.device, dtype=torch.int32)
    _plan_kernel[(n,)](parents, depth, anc, windows, anc.stride(0), KERNEL=kernel, num_warps=1)
    tiles = anc.view(nb, block, nb, block)
    blocks = (tiles.amax(dim=(1, 3)) > 0).to(torch.int32)
    inside = tiles.diagonal(dim1=0, dim2=2).sum(dim=1)  # [block, nb]: in-block ancestors-or-self per node
    longest = (inside.amax(dim=0) - 1).clamp(min=0)  # the longest strict-ancestor chain in each block
    steps = torch.ceil(torch.log2(longest + 1.0)).to(torch.int32)
    return TreePlan(anc, blocks, steps, windows, block, lone_tail(n, block))


@dataclass(frozen=True)
class ForestPlan:
    """The plans of P trees of one size verified together (``gdn_forest``): each ``TreePlan`` tensor
    stacked along a leading tree axis. Trees of one size share the node block and the tail."""

    anc: Tensor  # [P, NP, NP]
    blocks: Tensor  # [P, NB, NB]
    steps: Tensor  # [P, NB]
    windows: Tensor  # [P, N, K]
    block: int
    tail: bool

    @classmethod
    def of(cls, plans: Sequence[TreePlan]) -> ForestPlan:
        """Stack the plans (one pass's trees of one size; once per pass, for every layer)."""
        first = plans[0]
        if any(p.num_nodes != first.num_nodes or p.block != first.block for p in plans):
            sizes = sorted({(p.num_nodes, p.block) for p in plans})
            raise RuntimeError(f"a forest wants trees of one size and node block, got (nodes, block) {sizes}")
        return cls(
            torch.stack([p.anc for p in plans]),
            torch.stack([p.blocks for p in plans]),
            torch.stack([p.steps for p in plans]),
            torch.stack([p.windows for p in plans]),
            first.block,
            first.tail,
        )

    @property
    def parts(self) -> int:
        return self.windows.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.windows.shape[1]


@triton.jit
def _products(
    A, B, rows, cols, a_ok, b_ok, stride, DK: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr
):
    """Rows of A times rows of B over the key dim, [rows, cols] fp32, in BLOCK_K slices (no whole
    [BLOCK_T, DK] tile lives in registers). A, B: [N, HK, DK] at this program's key head."""
    acc = tl.zeros([rows.shape[0], cols.shape[0]], dtype=tl.float32)
    for k0 in tl.static_range(0, DK, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < DK
        a = tl.load(A + rows[:, None] * stride + kk[None, :], mask=a_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(B + cols[:, None] * stride + kk[None, :], mask=b_ok[:, None] & k_ok[None, :], other=0.0)
        acc = dot(a, tl.trans(b), PRECISION, acc)
    return acc


@triton.jit
def _against_state(
    Q, K, S0, rows, r_ok, vcol, v_ok, stride, DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Rows of Q and of K [N, HK, DK] times the state's columns S0[:, vcol] (fp32 [DK, DV]), each slice
    of S0 loaded once for both: ([rows, vcol], [rows, vcol]) fp32."""
    qs = tl.zeros([rows.shape[0], vcol.shape[0]], dtype=tl.float32)
    ks = tl.zeros([rows.shape[0], vcol.shape[0]], dtype=tl.float32)
    for k0 in tl.static_range(0, DK, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < DK
        s = tl.load(S0 + kk[:, None] * DV + vcol[None, :], mask=k_ok[:, None] & v_ok[None, :], other=0.0)
        tile = rows[:, None] * stride + kk[None, :]
        ok = r_ok[:, None] & k_ok[None, :]
        qs = dot(tl.load(Q + tile, mask=ok, other=0.0).to(tl.float32), s, PRECISION, qs)
        ks = dot(tl.load(K + tile, mask=ok, other=0.0).to(tl.float32), s, PRECISION, ks)
    return qs, ks


@triton.jit
def _path_sums(ANC, G, h, nodes, n_nodes, last_block, stride_anc, HV: tl.constexpr, BLOCK_T: tl.constexpr):
    """G of value head h at ``nodes`` (one node block, up to ``last_block``): the log-decays summed
    over each node's ancestors-or-self, which all sit in node blocks 0..last_block; exact fp32."""
    acc = tl.zeros([BLOCK_T], dtype=tl.float32)
    for jb in range(0, last_block + 1):
        cols = jb * BLOCK_T + tl.arange(0, BLOCK_T)
        g = tl.load(G + cols * HV + h, mask=cols < n_nodes, other=0.0)
        anc = tl.load(ANC + nodes[:, None] * stride_anc + cols[None, :])
        acc += tl.sum(tl.where(anc != 0, g[None, :], 0.0), 1)
    return acc


@triton.jit
def _tree_blocks_kernel(
    Q,
    K,
    V,
    BETA,
    G,
    S0,
    GSUM,
    ANC,
    BLOCKS,
    STEPS,
    A,
    P,
    INV,
    R,
    O0,
    SLOTS,
    n_nodes,
    n_blocks,
    stride_anc,
    stride_state,
    stride_gsum,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr,
    FOREST: tl.constexpr,
):
    """Program (h, c < n_blocks): node block c of value head h against the cached state, for the
    solve: its right-hand side R_c = beta (V - exp(G) K S0) and its outputs' start O0_c = exp(G) Q S0
    (first in the launch: with the diagonal ones, the longest programs). Program (h, n_blocks + pair),
    pair = i * n_blocks + c: A[i, c] and P[i, c] (c < i), or P[i, i] and the inverse of (I + A[i, i])
    (c == i); block pairs with no ancestor link are skipped. In a FOREST, axis 2 is the tree."""
    h = tl.program_id(0)
    pair = tl.program_id(1) - n_blocks
    hk = h // (HV // HK)
    if FOREST:  # tree p: its own inputs, plan and scratch; its state and staged G in slot SLOTS[p]
        part = tl.program_id(2).to(tl.int64)
        slot = tl.load(SLOTS + part).to(tl.int64)
        Q, K = Q + part * n_nodes * HK * DK, K + part * n_nodes * HK * DK
        V = V + part * n_nodes * HV * DV
        BETA, G = BETA + part * n_nodes * HV, G + part * n_nodes * HV
        S0, GSUM = S0 + slot * stride_state, GSUM + slot * stride_gsum
        ANC = ANC + part * stride_anc * stride_anc
        BLOCKS, STEPS = BLOCKS + part * n_blocks * n_blocks, STEPS + part * n_blocks
        A, P = A + part * HV * stride_anc * stride_anc, P + part * HV * stride_anc * stride_anc
        INV = INV + part * HV * n_blocks * BLOCK_T * BLOCK_T
        R, O0 = R + part * HV * stride_anc * DV, O0 + part * HV * stride_anc * DV
    # q, k [N, HK, DK]; beta, g [N, HV]; gsum [HV, N]; a, p [HV, NP, NP]; inv [HV, NB, BLOCK_T, BLOCK_T];
    # v [N, HV, DV]; s0 [HV, DK, DV]; r, o0 [HV, NP, DV]
    Q, K = Q + hk * DK, K + hk * DK
    if pair < 0:
        rows = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        r_ok = rows < n_nodes
        eg = tl.exp(_path_sums(ANC, G, h, rows, n_nodes, tl.program_id(1), stride_anc, HV, BLOCK_T))
        beta = tl.load(BETA + rows * HV + h, mask=r_ok, other=0.0)
        for v0 in range(0, DV, BLOCK_V):  # not unrolled: hoisting all its loads spilled registers
            vcol = v0 + tl.arange(0, BLOCK_V)
            v_ok = vcol < DV
            qs, ks = _against_state(
                Q, K, S0 + h * DK * DV, rows, r_ok, vcol, v_ok, HK * DK, DK, DV, BLOCK_K, PRECISION
            )
            mask = r_ok[:, None] & v_ok[None, :]
            vb = tl.load(V + (rows[:, None] * HV + h) * DV + vcol[None, :], mask=mask, other=0.0)
            out = (h * stride_anc + rows[:, None]) * DV + vcol[None, :]
            tl.store(R + out, beta[:, None] * (vb.to(tl.float32) - eg[:, None] * ks), mask=v_ok[None, :])
            tl.store(O0 + out, eg[:, None] * qs, mask=v_ok[None, :])
        return
    i, c = pair // n_blocks, pair % n_blocks
    if c > i or tl.load(BLOCKS + i * n_blocks + c) == 0:
        return
    rows = i * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = c * BLOCK_T + tl.arange(0, BLOCK_T)
    r_ok, c_ok = rows < n_nodes, cols < n_nodes
    g_r = _path_sums(ANC, G, h, rows, n_nodes, i, stride_anc, HV, BLOCK_T)
    if c == i:  # one program per node block stores its G (the solve and the commit read it)
        tl.store(GSUM + h * n_nodes + rows, g_r, mask=r_ok)
        g_c = g_r
    else:
        g_c = _path_sums(ANC, G, h, cols, n_nodes, c, stride_anc, HV, BLOCK_T)
    anc = tl.load(ANC + rows[:, None] * stride_anc + cols[None, :])
    decay = tl.where(anc > 0, tl.exp(g_r[:, None] - g_c[None, :]), 0.0)
    tile = h * stride_anc * stride_anc + rows[:, None] * stride_anc + cols[None, :]
    qk = _products(Q, K, rows, cols, r_ok, c_ok, HK * DK, DK, BLOCK_K, PRECISION)
    tl.store(P + tile, (qk * decay).to(P.dtype.element_ty))
    beta = tl.load(BETA + rows * HV + h, mask=r_ok, other=0.0)
    a = beta[:, None] * _products(K, K, rows, cols, r_ok, c_ok, HK * DK, DK, BLOCK_K, PRECISION) * decay
    if c < i:
        tl.store(A + tile, a.to(A.dtype.element_ty))
    else:
        eye = rows[:, None] == cols[None, :]
        x = tl.where(eye, 0.0, -a)  # -A_ii, strictly lower in node order
        inv = tl.where(eye, 1.0, 0.0) + x  # (I + X), then (I + X^2)(I + X) ...
        for _ in range(1, tl.load(STEPS + i)):
            x = dot(x, x, PRECISION)
            inv += dot(x, inv, PRECISION)
        if tl.load(STEPS + i) == 0:
            inv = tl.where(eye, 1.0, 0.0)
        local = tl.arange(0, BLOCK_T)
        tl.store(INV + ((h * n_blocks + i) * BLOCK_T + local[:, None]) * BLOCK_T + local[None, :], inv)


@triton.jit
def _tree_solve_kernel(
    BLOCKS,
    A,
    P,
    INV,
    R,
    O0,
    OUT,
    D,
    SLOTS,
    n_nodes,
    n_blocks,
    stride_anc,
    stride_d,
    HV: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    TAIL: tl.constexpr,
    PRECISION: tl.constexpr,
    FOREST: tl.constexpr,
):
    """Program (h, value block): D and the outputs of value head h, node block by node block; with
    TAIL, the last node block is one lone node, taken after the others as a single row. The blocks
    against the cached state (R, O0) come from the first kernel. In a FOREST, axis 2 is the tree."""
    h = tl.program_id(0)
    if FOREST:  # tree p: its own plan, scratch and outputs; its staged D in slot SLOTS[p]
        part = tl.program_id(2).to(tl.int64)
        D += tl.load(SLOTS + part).to(tl.int64) * stride_d
        OUT += part * n_nodes * HV * DV
        BLOCKS += part * n_blocks * n_blocks
        A, P = A + part * HV * stride_anc * stride_anc, P + part * HV * stride_anc * stride_anc
        INV += part * HV * n_blocks * BLOCK_T * BLOCK_T
        R, O0 = R + part * HV * stride_anc * DV, O0 + part * HV * stride_anc * DV
    vcol = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_ok = vcol < DV
    local = tl.arange(0, BLOCK_T)
    # out [N, HV, DV]; d [HV, N, DV]; r, o0 [HV, NP, DV]; the blocks' a, p, inv as the kernel above
    D = D + h * n_nodes * DV
    A, P = A + h * stride_anc * stride_anc, P + h * stride_anc * stride_anc
    R, O0 = R + h * stride_anc * DV, O0 + h * stride_anc * DV
    steps = n_blocks - 1 if TAIL else n_blocks
    for i in range(steps):
        rows = i * BLOCK_T + local
        r_ok = rows < n_nodes
        mask = r_ok[:, None] & v_ok[None, :]
        # (1) and (2) against the cached state, from the first kernel
        rhs = tl.load(R + rows[:, None] * DV + vcol[None, :], mask=v_ok[None, :], other=0.0)
        out = tl.load(O0 + rows[:, None] * DV + vcol[None, :], mask=v_ok[None, :], other=0.0)
        for c in range(i):  # ... and against the earlier node blocks that hold ancestors
            if tl.load(BLOCKS + i * n_blocks + c) != 0:
                cols = c * BLOCK_T + local
                dc = tl.load(
                    D + cols[:, None] * DV + vcol[None, :],
                    mask=(cols < n_nodes)[:, None] & v_ok[None, :],
                    other=0.0,
                )
                tile = rows[:, None] * stride_anc + cols[None, :]
                rhs -= dot(tl.load(A + tile).to(tl.float32), dc, PRECISION)
                out += dot(tl.load(P + tile).to(tl.float32), dc, PRECISION)
        inv = tl.load(INV + ((h * n_blocks + i) * BLOCK_T + local[:, None]) * BLOCK_T + local[None, :])
        d = dot(inv, rhs, PRECISION)
        out += dot(tl.load(P + rows[:, None] * stride_anc + rows[None, :]).to(tl.float32), d, PRECISION)
        tl.store(D + rows[:, None] * DV + vcol[None, :], d, mask=mask)
        tl.store(OUT + (rows[:, None] * HV + h) * DV + vcol[None, :], out.to(OUT.dtype.element_ty), mask=mask)
        tl.debug_barrier()  # this block's D is read back by the later blocks
    if TAIL:  # the lone last node, a row against the blocks that hold its ancestors (its diagonal is 1)
        t = n_nodes - 1
        d_tail = tl.load(R + t * DV + vcol, mask=v_ok, other=0.0)
        out_tail = tl.load(O0 + t * DV + vcol, mask=v_ok, other=0.0)
        for c in range(steps):
            if tl.load(BLOCKS + steps * n_blocks + c) != 0:
                cols = c * BLOCK_T + local
                dc = tl.load(D + cols[:, None] * DV + vcol[None, :], mask=v_ok[None, :], other=0.0)
                d_tail -= tl.sum(tl.load(A + t * stride_anc + cols).to(tl.float32)[:, None] * dc, 0)
                out_tail += tl.sum(tl.load(P + t * stride_anc + cols).to(tl.float32)[:, None] * dc, 0)
        out_tail += tl.load(P + t * stride_anc + t).to(tl.float32) * d_tail
        tl.store(D + t * DV + vcol, d_tail, mask=v_ok)
        tl.store(OUT + (t * HV + h) * DV + vcol, out_tail.to(OUT.dtype.element_ty), mask=v_ok)


def gdn_tree(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    plan: TreePlan,
    d_out: Tensor | None = None,
    gsum_out: Tensor | None = None,
    block_v: int = BLOCK_V,
    num_warps: int = NUM_WARPS,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gated DeltaNet over the plan's tree from the cached state (the docstring's (1), (2)).

    q, k: [N, Hk, Dk] (l2-normalised, q scaled); v: [N, Hv, Dv]; g (log-decay), beta: [N, Hv] fp32;
    state: [Hv, Dk, Dv] fp32. Returns o [N, Hv, Dv] in v's dtype, the corrections d [Hv, N, Dv] and
    the path sums G [Hv, N] (fp32; written into ``d_out``/``gsum_out`` when given). ``block_v``,
    ``num_warps``: the solve's launch.
    """
    n, hk, dk = q.shape
    _, hv, dv = v.shape
    if k.shape != q.shape or v.shape[0] != n or hv % hk or g.shape != (n, hv) or beta.shape != (n, hv):
        raise RuntimeError(
            f"gdn_tree wants q, k [N, Hk, Dk], v [N, Hv, Dv], g, beta [N, Hv]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)}"
        )
    if plan.num_nodes != n or state.shape != (hv, dk, dv) or state.dtype != torch.float32:
        raise RuntimeError(
            f"gdn_tree wants a plan of {n} nodes and an fp32 state [{hv}, {dk}, {dv}]; got a plan of "
            f"{plan.num_nodes} nodes and a state {tuple(state.shape)} ({state.dtype})"
        )
    if not all(x.is_contiguous() for x in (q, k, v, g, beta, state)):
        raise RuntimeError("gdn_tree wants contiguous inputs")
    o = torch.empty(n, hv, dv, device=q.device, dtype=v.dtype)
    d = torch.empty(hv, n, dv, device=q.device, dtype=torch.float32) if d_out is None else d_out
    gsum = torch.empty(hv, n, device=q.device, dtype=torch.float32) if gsum_out is None else gsum_out
    if d.shape != (hv, n, dv) or gsum.shape != (hv, n) or not (d.is_contiguous() and gsum.is_contiguous()):
        raise RuntimeError(f"gdn_tree wants d_out [{hv}, {n}, {dv}] and gsum_out [{hv}, {n}], contiguous")
    _launch(q, k, v, g, beta, state, plan, o, d, gsum, None, block_v, num_warps)
    return o, d, gsum


def gdn_forest(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    states: Tensor,
    slots: Tensor,
    plan: ForestPlan,
    d_out: Tensor,
    gsum_out: Tensor,
    block_v: int = BLOCK_V,
    num_warps: int = NUM_WARPS,
) -> Tensor:
    """P trees of one size, each ``gdn_tree`` from its own cache slot's state, in one launch pair.

    q, k: [P, N, Hk, Dk]; v: [P, N, Hv, Dv]; g, beta: [P, N, Hv] fp32; states: [S, Hv, Dk, Dv] fp32
    (each slot's contiguous); slots: [P] cache slots on the device, distinct but for a scratch slot
    that padding trees may repeat (their outputs and its staging then undefined); plan: the trees' plans
    stacked (``ForestPlan.of``). Tree p starts from ``states[slots[p]]`` and writes its d and G into
    ``d_out`` [S, Hv, N, Dv] and ``gsum_out`` [S, Hv, N] (a verify pass's staging of every slot, each
    slot's contiguous) at ``slots[p]``; the other slots' rows are left alone. Returns o [P, N, Hv, Dv].
    """
    parts, n, hk, dk = q.shape
    hv, dv = v.shape[2:]
    heads = (parts, n, hv)
    if k.shape != q.shape or v.shape[:2] != (parts, n) or hv % hk or g.shape != heads or beta.shape != heads:
        raise RuntimeError(
            f"gdn_forest wants q, k [P, N, Hk, Dk], v [P, N, Hv, Dv], g, beta [P, N, Hv]; got q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}"
        )
    s = states.shape[0]
    if plan.parts != parts or plan.num_nodes != n or slots.shape != (parts,):
        raise RuntimeError(
            f"gdn_forest wants a plan and slots of {parts} trees of {n} nodes; got a plan of "
            f"{plan.parts} x {plan.num_nodes} and slots {tuple(slots.shape)}"
        )
    per_slot = {
        "states": (states, (s, hv, dk, dv)),
        "d_out": (d_out, (s, hv, n, dv)),
        "gsum_out": (gsum_out, (s, hv, n)),
    }
    for name, (x, shape) in per_slot.items():
        if x.shape != shape or x.dtype != torch.float32 or not x[0].is_contiguous():
            raise RuntimeError(
                f"gdn_forest wants {name} {list(shape)} fp32, each slot's contiguous; got {tuple(x.shape)}"
            )
    if not all(x.is_contiguous() for x in (q, k, v, g, beta)):
        raise RuntimeError("gdn_forest wants contiguous inputs")
    o = torch.empty(parts, n, hv, dv, device=q.device, dtype=v.dtype)
    _launch(q, k, v, g, beta, states, plan, o, d_out, gsum_out, slots, block_v, num_warps)
    return o


def _launch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    plan: TreePlan | ForestPlan,
    o: Tensor,
    d: Tensor,
    gsum: Tensor,
    slots: Tensor | None,
    block_v: int,
    num_warps: int,
) -> None:
    """Both kernels over one tree (``slots`` None) or a forest of ``len(slots)`` (checked inputs)."""
    n, hk, dk = q.shape[-3:]
    hv, dv = v.shape[-2:]
    parts = 1 if slots is None else slots.shape[0]
    block, n_blocks, stride = plan.block, plan.blocks.shape[-1], plan.anc.shape[-1]
    a = torch.empty(parts, hv, stride, stride, device=q.device, dtype=q.dtype)  # the model's
    p = torch.empty_like(a)
    inv = torch.empty(parts, hv, n_blocks, block, block, device=q.device, dtype=torch.float32)
    r = torch.empty(parts, hv, stride, dv, device=q.device, dtype=torch.float32)
    o0 = torch.empty_like(r)
    precision = dot_precision(q.dtype)
    block_k = min(32, max(16, next_pow2(dk)))
    forest = slots is not None
    _tree_blocks_kernel[(hv, n_blocks + n_blocks * n_blocks, parts)](  # the state programs, then the pairs
        q,
        k,
        v,
        beta,
        g,
        state,
        gsum,
        plan.anc,
        plan.blocks,
        plan.steps,
        a,
        p,
        inv,
        r,
        o0,
        slots if forest else plan.steps,
        n,
        n_blocks,
        stride,
        state.stride(0) if forest else 0,
        gsum.stride(0) if forest else 0,
        HK=hk,
        HV=hv,
        DK=dk,
        DV=dv,
        BLOCK_K=block_k,
        BLOCK_T=block,
        BLOCK_V=min(STATE_BLOCK_V, max(16, next_pow2(dv))),
        PRECISION=precision,
        FOREST=forest,
        num_warps=4,
        num_stages=1,  # nothing to pipeline but the loop against the state, whose stages would cost smem
    )
    block_v = max(16, min(block_v, next_pow2(dv)))
    _tree_solve_kernel[(hv, cdiv(dv, block_v), parts)](
        plan.blocks,
        a,
        p,
        inv,
        r,
        o0,
        o,
        d,
        slots if forest else plan.steps,
        n,
        n_blocks,
        stride,
        d.stride(0) if forest else 0,
        HV=hv,
        DV=dv,
        BLOCK_T=block,
        BLOCK_V=block_v,
        TAIL=plan.tail,
        PRECISION=precision,
        FOREST=forest,
        num_warps=num_warps,
    )


def gdn_tree_reference(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, parents: Tensor, state: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The definition, node by node, in float64: each node's state is its parent's stepped once.
    Layouts as ``gdn_tree`` (q, k [N, Hk, Dk] shared by Hv / Hk value heads each); returns fp32
    o [N, Hv, Dv], d [Hv, N, Dv], G [Hv, N]."""
    n, hk, _ = q.shape
    hv = v.shape[1]
    rep = hv // hk
    q, k = (x.double().repeat_interleave(rep, dim=1) for x in (q, k))  # [N, Hv, Dk]
    v, g, beta, state = (x.double() for x in (v, g, beta, state))
    states, gsum = [], []
    o, d = torch.zeros_like(v), torch.zeros_like(v)
    for i in range(n):
        p = int(parents[i])
        s = state if p < 0 else states[p]
        gsum.append(g[i] + (0.0 if p < 0 else gsum[p]))
        s = s * g[i].exp()[:, None, None]
        d[i] = beta[i, :, None] * (v[i] - torch.einsum("hkv,hk->hv", s, k[i]))
        s = s + k[i, :, :, None] * d[i, :, None, :]
        o[i] = torch.einsum("hkv,hk->hv", s, q[i])
        states.append(s)
    return o.float(), d.transpose(0, 1).float().contiguous(), torch.stack(gsum, dim=1).float()
