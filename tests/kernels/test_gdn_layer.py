"""A Gated DeltaNet layer's mixer on the kernels (TritonBackend) against TorchBackend, seam by seam:
the `ar` step, a verify pass and its commit, and a whole hybrid target's verify + commit."""

from __future__ import annotations

import pytest
import torch

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.config import Qwen3_5Config
from ddtree_runtime.gated_delta import GdnSpec
from ddtree_runtime.models.qwen3_5 import Qwen3_5
from ddtree_runtime.tiny_hybrid import _hybrid_config
from ddtree_runtime.triton_backend import TritonBackend
from tests.kernels.trees import DEVICE, depths_of, make_parents

TORCH, TRITON = TorchBackend(), TritonBackend()


def layer(gen: torch.Generator, n_k: int = 2, n_v: int = 4, dk: int = 16, dv: int = 16) -> GdnSpec:
    c = 2 * n_k * dk + n_v * dv
    return GdnSpec(
        n_k,
        n_v,
        dk,
        dv,
        1e-6,
        (torch.randn(c, 4, generator=gen) * 0.5).to(DEVICE),
        torch.empty(n_v).uniform_(-3.0, -1.0, generator=gen).to(DEVICE),
        torch.empty(n_v).uniform_(-1.0, 0.0, generator=gen).to(DEVICE),
        (1 + 0.1 * torch.randn(dv, generator=gen)).to(DEVICE),
    )


def states(spec: GdnSpec, gen: torch.Generator, layers: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    conv = torch.randn(layers, spec.kernel - 1, spec.conv_dim, generator=gen).to(DEVICE)
    rec = (torch.randn(layers, spec.n_v, spec.dk, spec.dv, generator=gen) * 0.5).to(DEVICE)
    return conv, rec


def projection(spec: GdnSpec, n: int, gen: torch.Generator) -> torch.Tensor:
    width = spec.conv_dim + spec.n_v * spec.dv + 2 * spec.n_v
    return torch.randn(n, width, generator=gen).to(DEVICE)


def test_the_ar_step_matches_torch() -> None:
    """One token: the fused step's output and both advanced states, over a few steps in a row."""
    gen = torch.Generator().manual_seed(0)
    spec = layer(gen)
    conv, rec = states(spec, gen)
    conv_t, rec_t = conv.clone(), rec.clone()
    for _ in range(3):
        proj = projection(spec, 1, gen)
        got = TRITON.gdn_chain(proj, spec, conv[0], rec[0])
        want = TORCH.gdn_chain(proj, spec, conv_t[0], rec_t[0])
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(rec, rec_t, atol=2e-5, rtol=2e-5)
        assert torch.equal(conv, conv_t)


@pytest.mark.parametrize("shape", ["bushy", "chain"])
def test_a_verify_pass_and_its_commit_match_torch(shape: str) -> None:
    gen = torch.Generator().manual_seed(1)
    spec = layer(gen)
    n = 21  # two programs of 16 tokens, the second mostly padding
    parents = make_parents(shape, n, gen)
    par = torch.tensor(parents, device=DEVICE)
    depth = torch.tensor(depths_of(parents), device=DEVICE)
    conv, rec = states(spec, gen, layers=2)
    results = []
    for backend in (TORCH, TRITON):
        c, r = conv.clone(), rec.clone()
        plan = backend.gdn_plan(par, depth, spec.kernel)
        staging = backend.gdn_staging(2, n, spec, torch.float32)
        outs = [
            backend.gdn_tree(
                projection(spec, n, torch.Generator().manual_seed(7 + slot)),
                spec,
                c[slot],
                r[slot],
                plan,
                staging,
                slot,
            )
            for slot in range(2)
        ]
        deepest = int(depth.argmax())
        path = [deepest]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        padded = torch.tensor(path + [-1] * (n - len(path)), device=DEVICE)
        backend.gdn_commit(c, r, staging, plan, padded, torch.tensor(len(path), device=DEVICE))
        results.append((*outs, c, r))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5)


def test_hybrid_verify_and_commit_on_the_kernels_match_torch(tmp_path) -> None:
    """One DDTree verify + commit of a random Qwen3.5 hybrid (fused, as loaded) on each backend."""
    torch.manual_seed(0)
    model = Qwen3_5(Qwen3_5Config.from_dict(_hybrid_config(40, 64, 4), tmp_path / "config.json")).to(DEVICE)
    model.fuse()
    model.setup_caches(64)
    gen = torch.Generator().manual_seed(2)
    tokens, parents, depth = TORCH.build_tree(torch.randn(4, 40, generator=gen), 10, torch.tensor(7))
    tokens, parents, depth = tokens.to(DEVICE), parents.to(DEVICE), depth.to(DEVICE)
    context = torch.tensor([3, 9, 27, 1, 30], device=DEVICE)
    results = []
    for backend in (TORCH, TRITON):
        with torch.inference_mode():
            model(context, torch.arange(5, device=DEVICE), 0, None, TORCH, capture=False)
            step, _ = model(
                torch.tensor([11], device=DEVICE), torch.tensor([5], device=DEVICE), 5, None, backend
            )
            tree = model.plan(parents, depth, backend, chain=False)
            logits, _ = model(tokens, 6 + depth, 6, tree, backend, capture=False)
            path = torch.full_like(parents, -1)
            deepest = [int(depth.argmax())]
            while int(parents[deepest[0]]) >= 0:
                deepest.insert(0, int(parents[deepest[0]]))
            path[: len(deepest)] = torch.tensor(deepest, device=DEVICE)
            model.commit(6, tree, path, torch.tensor(len(deepest), device=DEVICE), backend)
        results.append(
            (
                step,
                logits,
                model.rec_state.clone(),
                model.conv_state.clone(),
                model.k_cache[:, :, :12].clone(),
            )
        )
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5)
