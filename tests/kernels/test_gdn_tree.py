"""Tree Gated DeltaNet: the Triton kernel, the runtime's WY form and the node-by-node reference agree,
every node equals the sequential recurrence along its own root path, and the commit along an
accepted path gives that path's chain state (chains, stars, bushy, deep and random trees)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddtree_kernels.gdn_commit import gdn_commit
from ddtree_kernels.gdn_tree import gdn_tree, gdn_tree_reference, tree_plan
from ddtree_runtime import gated_delta
from ddtree_runtime.backend import ancestors
from tests.kernels.trees import DEVICE, depths_of, make_parents


def inputs(hk: int, hv: int, n: int, dk: int, dv: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """q, k [N, Hk, Dk], v [N, Hv, Dv], g, beta [N, Hv] and a state [Hv, Dk, Dv], fp32."""
    q = F.normalize(torch.randn(n, hk, dk, generator=gen), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(n, hk, dk, generator=gen), dim=-1)
    v = torch.randn(n, hv, dv, generator=gen)
    g = -torch.rand(n, hv, generator=gen) * 0.7  # log-decays <= 0
    beta = torch.rand(n, hv, generator=gen)
    state = torch.randn(hv, dk, dv, generator=gen) * 0.5
    return tuple(x.to(DEVICE) for x in (q, k, v, g, beta, state))


def plan_of(parents: list[int], kernel: int = 4, block: int | None = None) -> tuple[torch.Tensor, object]:
    par = torch.tensor(parents, device=DEVICE)
    return par, tree_plan(par, torch.tensor(depths_of(parents), device=DEVICE), kernel, block)


def root_path(parents: list[int], leaf: int) -> list[int]:
    path = [leaf]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@pytest.mark.parametrize(
    ("shape", "n", "hk", "hv", "dk", "dv"),
    [
        ("chain", 16, 1, 2, 16, 16),
        ("star", 40, 1, 1, 8, 12),  # odd head dims are padded
        ("bushy", 150, 1, 3, 16, 32),  # three node blocks, value heads sharing a key head
        ("deep", 45, 2, 2, 8, 16),
        ("random", 33, 1, 2, 16, 20),
        ("chain", 100, 1, 1, 16, 16),  # 32-node chain blocks: five squarings, the last block two
        ("chain", 1, 1, 1, 16, 16),  # the root alone (an `ar`-sized verify)
        # 2^k + 1 nodes (a verify at budget 2^k): the last node is the solve's tail
        ("random", 257, 1, 2, 16, 16),  # B=256: four 64-node blocks and the tail
        ("chain", 129, 1, 1, 16, 16),  # 64-node chain blocks (six squarings), all linked, tail last
        ("star", 129, 1, 1, 8, 12),  # the tail hangs off the root: no ancestor in block 1
        ("bushy", 65, 1, 2, 16, 16),  # two 32-node blocks and the tail
        ("deep", 65, 2, 4, 16, 20),  # value heads sharing key heads, odd value dim
    ],
)
def test_kernel_and_wy_form_match_the_node_by_node_reference(shape, n, hk, hv, dk, dv) -> None:
    gen = torch.Generator().manual_seed(n * 7 + hv)
    parents = make_parents(shape, n, gen)
    q, k, v, g, beta, state = inputs(hk, hv, n, dk, dv, gen)
    par, plan = plan_of(parents)
    o_want, d_want, g_want = gdn_tree_reference(q, k, v, g, beta, par, state)
    o, d, big_g = gdn_tree(q, k, v, g, beta, state, plan)
    for got, want in ((o, o_want), (d, d_want), (big_g, g_want)):
        torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5)
    # the runtime's PyTorch form (head-major, key heads repeated)
    rep = hv // hk
    qh, kh = (x.repeat_interleave(rep, dim=1).transpose(0, 1) for x in (q, k))
    o_t, d_t, g_t = gated_delta.tree_form(qh, kh, v.transpose(0, 1), g.t(), beta.t(), ancestors(par), state)
    torch.testing.assert_close(o_t.transpose(0, 1), o_want, atol=3e-5, rtol=3e-5)
    torch.testing.assert_close(d_t, d_want, atol=3e-5, rtol=3e-5)
    torch.testing.assert_close(g_t, g_want, atol=3e-5, rtol=3e-5)


def test_the_plan_skips_empty_block_pairs_and_counts_squarings() -> None:
    """A star's later blocks hang off the root only; a chain block needs log2 of its length."""
    _, star = plan_of([-1] + [0] * 99, block=64)  # 100 nodes: two 64-node blocks
    assert star.blocks.tolist() == [[1, 0], [1, 1]]
    assert star.steps.tolist() == [1, 0]  # depth 1 inside block 0, none inside block 1
    _, chain = plan_of(list(range(-1, 99)), block=64)
    assert chain.steps.tolist() == [6, 6]  # 64 nodes deep inside block 0, 36 inside block 1
    assert chain.windows[0].tolist() == [0, 1, 2, 3] and chain.windows[5].tolist() == [5, 6, 7, 8]


def test_a_lone_last_node_is_the_solves_tail() -> None:
    """2^k + 1 nodes leave one node in the last block: the plan says so and the solve carries it as a
    tail row (no block step of its own) with the reference's outputs."""
    assert [
        (p.block, p.blocks.shape[0], p.tail)
        for p in (plan_of([-1] + [0] * (n - 1))[1] for n in (16, 17, 33, 65, 129))
    ] == [(16, 1, False), (32, 1, False), (32, 2, True), (32, 3, True), (64, 3, True)]
    gen = torch.Generator().manual_seed(5)
    parents = make_parents("deep", 65, gen)
    q, k, v, g, beta, state = inputs(1, 2, 65, 16, 16, gen)
    par, plan = plan_of(parents)
    want = gdn_tree_reference(q, k, v, g, beta, par, state)
    for got, exp in zip(gdn_tree(q, k, v, g, beta, state, plan), want, strict=True):
        torch.testing.assert_close(got, exp, atol=3e-5, rtol=3e-5)


@pytest.mark.parametrize("shape", ["bushy", "deep", "random"])
def test_every_root_path_is_the_sequential_recurrence_and_the_commit_its_state(shape: str) -> None:
    """Each leaf's root path run as a plain chain from the cached state gives the same outputs at
    its nodes, and the commit along it gives the chain's final state (recurrent and conv). 65 nodes:
    two 32-node blocks and the solve's tail, whose path is among those checked."""
    n, hk, hv, dk, dv, kernel, channels = 65, 1, 2, 16, 16, 4, 24
    gen = torch.Generator().manual_seed(11)
    parents = make_parents(shape, n, gen)
    q, k, v, g, beta, state = inputs(hk, hv, n, dk, dv, gen)
    _, plan = plan_of(parents, kernel)
    o, d, big_g = gdn_tree(q, k, v, g, beta, state, plan)
    conv = torch.randn(kernel - 1, channels, generator=gen).to(DEVICE)
    x = torch.randn(n, channels, generator=gen).to(DEVICE)
    leaves = sorted(set(range(n)) - set(parents))
    assert plan.tail
    for leaf in [*leaves[:: max(1, len(leaves) // 5)], n - 1]:
        path = root_path(parents, leaf)
        s = state.double()
        for i in path:  # the recurrence itself, token by token
            s = s * g[i].double().exp()[:, None, None]
            kv = k[i].double().repeat_interleave(hv // hk, dim=0)
            delta = beta[i, :, None].double() * (v[i].double() - torch.einsum("hkv,hk->hv", s, kv))
            s = s + kv[:, :, None] * delta[:, None, :]
            qv = q[i].double().repeat_interleave(hv // hk, dim=0)
            torch.testing.assert_close(o[i], torch.einsum("hkv,hk->hv", s, qv).float(), atol=3e-5, rtol=3e-5)
        states, convs = state[None].clone(), conv[None].clone()
        padded = torch.tensor(path + [-1] * (n - len(path)), device=DEVICE)
        gdn_commit(
            states,
            convs,
            k[None],
            d[None],
            big_g[None],
            x[None],
            plan.windows,
            padded,
            torch.tensor(len(path), device=DEVICE),
        )
        torch.testing.assert_close(states[0], s.float(), atol=3e-5, rtol=3e-5)
        history = torch.cat([conv, x[path]])  # the conv inputs along the path: its last K-1 stay
        assert torch.equal(convs[0], history[-(kernel - 1) :])


def test_flattened_order_is_not_the_tree() -> None:
    """Feeding a branching tree through the recurrence in node order gives other outputs."""
    n = 12
    gen = torch.Generator().manual_seed(3)
    q, k, v, g, beta, state = inputs(1, 1, n, 16, 16, gen)
    _, tree = plan_of([-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7])
    _, flat = plan_of(list(range(-1, n - 1)))
    o_tree = gdn_tree(q, k, v, g, beta, state, tree)[0]
    o_flat = gdn_tree(q, k, v, g, beta, state, flat)[0]
    assert torch.allclose(o_tree[:2], o_flat[:2])  # the root and its first child agree
    assert not torch.allclose(o_tree[2:], o_flat[2:], atol=1e-3)


def test_sizes_out_of_range_are_refused() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v, g, beta, state = inputs(1, 1, 4, 16, 16, gen)
    _, plan = plan_of([-1, 0, 1])
    with pytest.raises(RuntimeError, match="plan of 4 nodes"):
        gdn_tree(q, k, v, g, beta, state, plan)


def test_a_forest_commit_is_each_slots_commit() -> None:
    """P sequences' commits in one launch pair (slots out of order, each its own tree, windows,
    staging and path, from the root alone to a path longer than one block of 16) give each slot the
    states of its own commit, bit for bit; padding sequences repeating a scratch slot touch no
    other slot."""
    n, hk, hv, dk, dv, kernel, channels, layers = 40, 1, 2, 16, 16, 4, 24, 2
    gen = torch.Generator().manual_seed(13)
    slots, scratch, padding = [3, 0, 2], 4, 2

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(DEVICE)

    states, convs = rand(5, layers, hv, dk, dv), rand(5, layers, kernel - 1, channels)  # every slot's
    k, x = rand(5, layers, n, hk, dk), rand(5, layers, n, channels)  # every slot's staging
    d, gsum = rand(5, layers, hv, n, dv), -rand(5, layers, hv, n).abs()
    windows, paths, lens = [], [], []
    for shape, leaf in (("deep", n - 1), ("bushy", None), ("chain", 0)):
        parents = make_parents(shape, n, gen)
        windows.append(plan_of(parents, kernel)[1].windows)
        path = root_path(parents, int(torch.randint(0, n, (1,), generator=gen)) if leaf is None else leaf)
        paths.append(path + [-1] * (n - len(path)))
        lens.append(len(path))
    assert lens[0] > 16 and lens[2] == 1
    want_states, want_convs = states.clone(), convs.clone()
    for slot, w, path, m in zip(slots, windows, paths, lens, strict=True):
        staged = (k[slot], d[slot], gsum[slot], x[slot])
        gdn_commit(
            want_states[slot],
            want_convs[slot],
            *staged,
            w,
            torch.tensor(path, device=DEVICE),
            torch.tensor(m, device=DEVICE),
        )
    before = states.clone()
    gdn_commit(
        states,
        convs,
        k,
        d,
        gsum,
        x,
        torch.stack([*windows, *[windows[0]] * padding]),
        torch.tensor([*paths, *[paths[0]] * padding], device=DEVICE),
        torch.tensor([*lens, *[lens[0]] * padding], device=DEVICE),
        slots=torch.tensor([*slots, *[scratch] * padding], device=DEVICE),
    )
    assert torch.equal(states[:scratch], want_states[:scratch])
    assert torch.equal(convs[:scratch], want_convs[:scratch])
    assert not torch.equal(states[slots[0]], before[slots[0]]) and torch.equal(states[1], before[1])
