"""Tree Gated DeltaNet: the Triton kernel, the runtime's WY form and the node-by-node reference agree,
and every node equals the sequential recurrence along its own root path (random trees)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddtree_kernels.gdn_tree import gdn_tree, gdn_tree_reference
from ddtree_runtime.models.gdn import advance_state, gdn_tree_torch
from tests.kernels.trees import DEVICE, make_parents


def inputs(h: int, n: int, dk: int, dv: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    q = F.normalize(torch.randn(h, n, dk, generator=gen), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(h, n, dk, generator=gen), dim=-1)
    v = torch.randn(h, n, dv, generator=gen)
    g = -torch.rand(h, n, generator=gen) * 0.7  # log-decays <= 0
    beta = torch.rand(h, n, generator=gen)
    state = torch.randn(h, dk, dv, generator=gen) * 0.5
    return tuple(x.to(DEVICE) for x in (q, k, v, g, beta, state))


def root_path(parents: list[int], leaf: int) -> list[int]:
    path = [leaf]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@pytest.mark.parametrize(
    ("shape", "n", "h", "dk", "dv"),
    [
        ("chain", 16, 2, 16, 16),
        ("star", 40, 1, 8, 12),  # odd head dims are padded
        ("bushy", 70, 2, 16, 32),  # three node blocks
        ("deep", 45, 2, 8, 16),
        ("random", 33, 3, 16, 20),
        ("chain", 1, 1, 16, 16),  # the root alone (an `ar`-sized verify)
    ],
)
def test_kernel_and_wy_form_match_the_node_by_node_reference(shape, n, h, dk, dv) -> None:
    gen = torch.Generator().manual_seed(n * 7 + h)
    parents = make_parents(shape, n, gen)
    q, k, v, g, beta, state = inputs(h, n, dk, dv, gen)
    par = torch.tensor(parents, device=DEVICE)
    want = gdn_tree_reference(q, k, v, g, beta, par, state)
    for got in (gdn_tree(q, k, v, g, beta, par, state), gdn_tree_torch(q, k, v, g, beta, par, state)):
        for x, y in zip(got, want, strict=True):
            torch.testing.assert_close(x, y, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("shape", ["bushy", "deep", "random"])
def test_every_root_path_is_the_sequential_recurrence(shape: str) -> None:
    """Each leaf's root path run as a plain chain from the cached state gives the same outputs at
    its nodes, and `advance_state` along it gives the chain's final state."""
    n, h, dk, dv = 36, 2, 16, 16
    gen = torch.Generator().manual_seed(11)
    parents = make_parents(shape, n, gen)
    q, k, v, g, beta, state = inputs(h, n, dk, dv, gen)
    o, d, big_g = gdn_tree(q, k, v, g, beta, torch.tensor(parents, device=DEVICE), state)
    leaves = sorted(set(range(n)) - set(parents))
    for leaf in leaves[:: max(1, len(leaves) // 6)]:
        path = root_path(parents, leaf)
        s = state.double()
        for i in path:  # the recurrence itself, token by token
            s = s * g[:, i].double().exp()[:, None, None]
            delta = beta[:, i, None].double() * (
                v[:, i].double() - torch.einsum("hkv,hk->hv", s, k[:, i].double())
            )
            s = s + k[:, i, :, None].double() * delta[:, None, :]
            torch.testing.assert_close(
                o[:, i], torch.einsum("hkv,hk->hv", s, q[:, i].double()).float(), atol=2e-5, rtol=2e-5
            )
        padded = torch.tensor(path + [-1] * (n - len(path)), device=DEVICE)
        new = advance_state(state, k, d, big_g, padded, torch.tensor(len(path), device=DEVICE))
        torch.testing.assert_close(new, s.float(), atol=2e-5, rtol=2e-5)


def test_flattened_order_is_not_the_tree() -> None:
    """Feeding a branching tree through the recurrence in node order gives other outputs."""
    n, h = 12, 1
    gen = torch.Generator().manual_seed(3)
    q, k, v, g, beta, state = inputs(h, n, 16, 16, gen)
    tree = gdn_tree(
        q, k, v, g, beta, torch.tensor([-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7], device=DEVICE), state
    )
    flat = gdn_tree(q, k, v, g, beta, torch.arange(-1, n - 1, device=DEVICE), state)
    assert torch.allclose(tree[0][:, :2], flat[0][:, :2])  # the root and its first child agree
    assert not torch.allclose(tree[0][:, 2:], flat[0][:, 2:], atol=1e-3)


def test_sizes_out_of_range_are_refused() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v, g, beta, state = inputs(1, 4, 16, 16, gen)
    with pytest.raises(RuntimeError, match="parents"):
        gdn_tree(q, k, v, g, beta, torch.tensor([-1, 0, 1], device=DEVICE), state)


def test_hybrid_verify_and_commit_on_the_kernels_match_torch(tmp_path) -> None:
    """One DDTree verify + commit of a random Qwen3.5 hybrid through TritonBackend and TorchBackend."""
    from ddtree_kernels.backend import TritonBackend
    from ddtree_runtime.backend import TorchBackend
    from ddtree_runtime.config import Qwen3_5Config
    from ddtree_runtime.models.qwen3_5 import Qwen3_5
    from ddtree_runtime.tiny_hybrid import _hybrid_config

    torch.manual_seed(0)
    model = Qwen3_5(Qwen3_5Config.from_dict(_hybrid_config(40, 64, 4), tmp_path / "config.json")).to(DEVICE)
    model.setup_caches(64)
    torch_be, triton_be = TorchBackend(), TritonBackend()
    gen = torch.Generator().manual_seed(2)
    tokens, parents, depth = torch_be.build_tree(torch.randn(4, 40, generator=gen), 20, torch.tensor(7))
    tokens, parents, depth = tokens.to(DEVICE), parents.to(DEVICE), depth.to(DEVICE)
    context = torch.tensor([3, 9, 27, 1, 30], device=DEVICE)
    results = []
    for backend in (torch_be, triton_be):
        with torch.inference_mode():
            model(context, torch.arange(5, device=DEVICE), 0, None, torch_be, capture=False)
            vis = backend.tree_visibility(parents, depth)
            logits, _ = model(tokens, 5 + depth, 5, vis, backend, capture=False, parents=parents)
            path = torch.full_like(parents, -1)
            deepest = [int(depth.argmax())]
            while int(parents[deepest[0]]) >= 0:
                deepest.insert(0, int(parents[deepest[0]]))
            path[: len(deepest)] = torch.tensor(deepest, device=DEVICE)
            model.commit(5, path, torch.tensor(len(deepest), device=DEVICE), backend, chain=False)
        results.append(
            (logits, model.rec_state.clone(), model.conv_state.clone(), model.k_cache[:, :, :12].clone())
        )
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
