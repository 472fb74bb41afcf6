"""TritonBackend against TorchBackend, seam by seam, over one whole DDTree round."""

from __future__ import annotations

import torch

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.triton_backend import TritonBackend
from tests.kernels.trees import DEVICE


def test_one_round_matches_torch_backend() -> None:
    gen = torch.Generator().manual_seed(0)
    triton_be, torch_be = TritonBackend(), TorchBackend()
    depth_max, vocab, budget = 5, 50, 40
    hq, hkv, d, layers, ctx = 4, 2, 32, 2, 23
    draft = (torch.randn(depth_max, vocab, generator=gen) * 3).to(DEVICE)
    root = torch.tensor(3, device=DEVICE)

    tokens, parents, depth = triton_be.build_tree(draft, budget, root)
    t_tokens, t_parents, t_depth = torch_be.build_tree(draft, budget, root)
    lp = torch.log_softmax(draft.double(), -1).cpu()

    def scores(tok, par, dep):
        s = [0.0]
        for i in range(1, tok.shape[0]):
            s.append(s[int(par[i])] + lp[int(dep[i]) - 1, int(tok[i])].item())
        return sorted(s)

    assert torch.allclose(
        torch.tensor(scores(tokens, parents, depth)), torch.tensor(scores(t_tokens, t_parents, t_depth))
    )

    n = budget + 1
    q = torch.randn(hq, n, d, generator=gen).to(DEVICE)
    k = torch.randn(layers, hkv, ctx + n + 4, d, generator=gen).to(DEVICE)
    v = torch.randn(layers, hkv, ctx + n + 4, d, generator=gen).to(DEVICE)
    vis = triton_be.tree_visibility(parents, depth)
    out = triton_be.attention(q, k[0], v[0], ctx, vis, d**-0.5)
    want = torch_be.attention(q, k[0], v[0], ctx, torch_be.tree_visibility(parents, depth), d**-0.5)
    assert torch.allclose(out, want, atol=2e-5, rtol=1e-4)
    out1 = triton_be.attention(q[:, :1], k[1], v[1], ctx, None, 0.1)
    assert torch.allclose(out1, torch_be.attention(q[:, :1], k[1], v[1], ctx, None, 0.1), atol=2e-5)

    logits = torch.randn(n, vocab, generator=gen).to(DEVICE)
    for i in range(1, n):  # make the target agree with the draft along most edges
        if int(parents[i]) % 3 != 2:
            logits[int(parents[i]), int(tokens[i])] += 6.0
    path, path_len, bonus = triton_be.tree_walk(tokens, parents, logits, 0.0, None)
    t_path, t_len, t_bonus = torch_be.tree_walk(tokens, parents, logits, 0.0, None)
    assert torch.equal(path, t_path) and int(path_len) == int(t_len) and int(bonus) == int(t_bonus)

    k_t, v_t = k.clone(), v.clone()
    triton_be.compact(k, v, ctx, path, path_len)
    torch_be.compact(k_t, v_t, ctx, t_path, t_len)
    assert torch.equal(k, k_t) and torch.equal(v, v_t)
