"""A Gated DeltaNet layer's mixer on the kernels (TritonBackend) against TorchBackend, seam by seam:
the `ar` step, a verify pass and its commit, and a whole hybrid target's verify + commit."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from ddtree_kernels.gated_rms_norm import gated_rms_norm
from ddtree_kernels.gdn_step import column_splits
from ddtree_kernels.host import num_sms
from ddtree_runtime import gated_delta
from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.config import Qwen3_5Config
from ddtree_runtime.gated_delta import GdnSpec
from ddtree_runtime.models.qwen3_5 import Qwen3_5
from ddtree_runtime.models.target import Part
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


# (key heads, value heads, value head dim): a program a head; two heads of 64 split across programs
STEP_SHAPES = {"whole heads": (2, 4, 16), "split heads": (1, 2, 64)}


def _step_layer(gen: torch.Generator, shape: str) -> GdnSpec:
    n_k, n_v, dv = STEP_SHAPES[shape]
    spec = layer(gen, n_k=n_k, n_v=n_v, dv=dv)
    splits = column_splits(n_v, dv, num_sms(DEVICE))
    assert (splits > 1) == (shape == "split heads"), splits
    return spec


@pytest.mark.parametrize("shape", STEP_SHAPES)
def test_the_ar_step_matches_torch(shape: str) -> None:
    """One token: the fused step's output and both advanced states, over a few steps in a row, with
    a program per head and with each head's value columns split across programs."""
    gen = torch.Generator().manual_seed(0)
    spec = _step_layer(gen, shape)
    conv, rec = states(spec, gen)
    conv_t, rec_t = conv.clone(), rec.clone()
    for _ in range(3):
        proj = projection(spec, 1, gen)
        got = TRITON.gdn_chain(proj, spec, conv[0], rec[0])
        want = TORCH.gdn_chain(proj, spec, conv_t[0], rec_t[0])
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(rec, rec_t, atol=2e-5, rtol=2e-5)
        assert torch.equal(conv, conv_t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gated_output_norm_matches_torch(dtype: torch.dtype) -> None:
    """Blocks of heads per program: 20 value heads (a full block of 16, then 4 and padding) of an
    odd head dim, over a few rows."""
    gen = torch.Generator().manual_seed(3)
    spec = layer(gen, n_k=2, n_v=20, dk=16, dv=24)
    proj = projection(spec, 3, gen).to(dtype)
    o = torch.randn(spec.n_v, 3, spec.dv, generator=gen).to(DEVICE)
    got = gated_rms_norm(o.transpose(0, 1).contiguous(), proj, spec.conv_dim, spec.norm_weight, spec.eps)
    want = gated_delta.gated_norm(o, proj, spec)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-6
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


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
        staging = backend.gdn_staging(2, n, spec, torch.float32)[0]
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


@pytest.mark.parametrize("shape", STEP_SHAPES)
def test_the_batched_step_equals_each_slots_own_step_bit_for_bit(shape: str) -> None:
    """`gdn_steps` over five sequences (slots out of order, two slots left alone) gives every slot
    exactly the output and states that its own `gdn_chain` step gives, in one launch pair; the
    Torch reference agrees."""
    gen = torch.Generator().manual_seed(3)
    spec = _step_layer(gen, shape)
    conv, rec = states(spec, gen, layers=7)
    slots = [4, 0, 6, 2, 3]
    proj = projection(spec, len(slots), gen)
    alone = (conv.clone(), rec.clone())
    want = torch.cat(
        [TRITON.gdn_chain(proj[p : p + 1], spec, alone[0][s], alone[1][s]) for p, s in enumerate(slots)]
    )
    ids = torch.tensor(slots, device=DEVICE)
    batched = (conv.clone(), rec.clone())
    got = TRITON.gdn_steps(proj, spec, *batched, ids)
    # bit for bit under the interpreter; compiled for a GPU, the batched launch's tiles (several
    # tokens a program) may round the head-dim reductions in another order than a single token's
    same = torch.equal if DEVICE.type == "cpu" else partial(torch.allclose, rtol=1e-6, atol=1e-6)
    assert same(got, want)
    assert same(batched[0], alone[0]) and same(batched[1], alone[1])
    assert torch.equal(batched[0][[1, 5]], conv[[1, 5]]) and torch.equal(batched[1][[1, 5]], rec[[1, 5]])
    oracle = (conv.clone(), rec.clone())
    torch.testing.assert_close(got, TORCH.gdn_steps(proj, spec, *oracle, ids), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(batched[1], oracle[1], atol=2e-5, rtol=2e-5)
    assert torch.equal(batched[0], oracle[0])


@pytest.mark.parametrize("n", [17, 65])  # one 32-node block; two and the lone tail
def test_a_forest_equals_each_trees_own_pass_and_staging(n: int) -> None:
    """`gdn_forest` over four trees of one size (chain, star, bushy, random) in slots out of order
    gives every tree exactly the output and the staging (k, x, d, G) of its own `gdn_tree`, in one
    launch set; the other slots' and layers' staging and every state are left alone; the Torch
    oracle agrees."""
    gen = torch.Generator().manual_seed(5)
    spec = layer(gen)
    conv, rec = states(spec, gen, layers=7)  # one layer's states of seven cache slots
    slots = [4, 0, 6, 2]
    plans, tree_plans = [], []
    for shape in ("chain", "star", "bushy", "random"):
        parents = make_parents(shape, n, gen)
        par, depth = torch.tensor(parents, device=DEVICE), torch.tensor(depths_of(parents), device=DEVICE)
        plans.append(TRITON.gdn_plan(par, depth, spec.kernel))
        tree_plans.append(TORCH.gdn_plan(par, depth, spec.kernel))
    proj = projection(spec, len(slots) * n, gen)
    ids = torch.tensor(slots, device=DEVICE)
    layers, at = 3, 1  # the staging of three DeltaNet layers, the forest in the second
    forest, alone = (TRITON.gdn_staging(layers, n, spec, torch.float32, slots=7) for _ in range(2))
    for buf in (forest.k, forest.x, forest.d, forest.gsum):
        buf.fill_(7.0)
    before = (conv.clone(), rec.clone())
    got = TRITON.gdn_forest(proj, spec, conv, rec, ids, TRITON.gdn_forest_plan(plans), forest, at)
    want = torch.cat(
        [
            TRITON.gdn_tree(proj[p * n : (p + 1) * n], spec, conv[s], rec[s], plans[p], alone[s], at)
            for p, s in enumerate(slots)
        ]
    )
    # bit for bit under the interpreter; compiled for a GPU, tight (see the batched step's test)
    same = torch.equal if DEVICE.type == "cpu" else partial(torch.allclose, rtol=1e-6, atol=1e-6)
    assert same(got, want)
    for field in ("k", "x", "d", "gsum"):
        staged, own = getattr(forest, field), getattr(alone, field)
        assert same(staged[slots, at], own[slots, at]), field
        assert (staged[[1, 3, 5]] == 7.0).all() and (staged[:, [0, 2]] == 7.0).all(), field
    assert torch.equal(conv, before[0]) and torch.equal(rec, before[1])  # a verify advances nothing
    oracle = TORCH.gdn_staging(layers, n, spec, torch.float32, slots=7)
    torch.testing.assert_close(
        got, TORCH.gdn_forest(proj, spec, conv, rec, ids, tree_plans, oracle, at), atol=3e-5, rtol=3e-5
    )
    for s in slots:
        torch.testing.assert_close(forest.d[s, at], oracle[s][at].d, atol=3e-5, rtol=3e-5)


def test_a_batched_hybrid_pass_on_the_kernels_gives_every_slot_its_own_pass(tmp_path) -> None:
    """`forward_parts` on the kernels over seven slots, listed out of slot order: three `ar` steps
    (one `gdn_steps` call per layer), two 5-node trees and a dflash chain of 5 nodes (one
    `gdn_forest` call per layer) and a chain of 3 on its own beside them; against each part's own
    pass: the logits, every slot's states after the pass, and after each verified slot's commit
    along its deepest path, its states and KV rows."""
    torch.manual_seed(0)
    model = Qwen3_5(Qwen3_5Config.from_dict(_hybrid_config(40, 64, 4), tmp_path / "config.json")).to(DEVICE)
    model.fuse()
    model.setup_caches(32, slots=7)
    gen = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        for slot in range(7):
            prompt = torch.randint(0, 40, (2 + slot,), generator=gen).to(DEVICE)
            model.forward_parts([Part(slot, prompt, torch.arange(2 + slot, device=DEVICE), 0)], TORCH)
    trees = [[-1, 0, 0, 1, 1], [-1, 0, 1, 0, 3]]
    # slot: a step (None), a chain of that many nodes, or a tree's parents
    shapes = {3: None, 1: 3, 5: trees[0], 0: None, 4: 5, 6: trees[1], 2: None}

    def part(slot: int, shape: int | list[int] | None) -> Part:
        ctx = 2 + slot
        if shape is None:
            return Part(
                slot, torch.tensor([slot + 7], device=DEVICE), torch.tensor([ctx], device=DEVICE), ctx
            )
        parents = list(range(-1, shape - 1)) if isinstance(shape, int) else shape
        depth = torch.tensor(depths_of(parents), device=DEVICE)
        tree = model.plan(torch.tensor(parents, device=DEVICE), depth, TRITON, chain=isinstance(shape, int))
        return Part(slot, torch.arange(len(parents), device=DEVICE) + slot, ctx + depth, ctx, tree)

    def commit(p: Part, shape: int | list[int]) -> None:
        parents = list(range(-1, shape - 1)) if isinstance(shape, int) else shape
        depths = depths_of(parents)
        path = [depths.index(max(depths))]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        padded = torch.tensor(path + [-1] * (len(parents) - len(path)), device=DEVICE)
        assert p.tree is not None
        model.commit(p.context_len, p.tree, padded, torch.tensor(len(path), device=DEVICE), TRITON, p.slot)

    saved = (model.conv_states.clone(), model.rec_states.clone())
    results, verified = [], [1, 5, 4, 6]
    with torch.inference_mode():
        for together in (True, False):
            model.conv_states.copy_(saved[0])
            model.rec_states.copy_(saved[1])
            parts = [part(slot, shape) for slot, shape in shapes.items()]
            if together:
                logits, _ = model.forward_parts(parts, TRITON, capture=False)
            else:
                logits = torch.cat([model.forward_parts([p], TRITON, capture=False)[0] for p in parts])
            passed = (model.conv_states.clone(), model.rec_states.clone())
            assert torch.equal(passed[1][verified], saved[1][verified])  # a verify pass advances nothing
            for p in parts:
                shape = shapes[p.slot]
                if shape is not None:
                    commit(p, shape)
            committed = (model.conv_states.clone(), model.rec_states.clone(), model.k_caches.clone())
            results.append((logits, *passed, *committed))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    stepped = [3, 0, 2]
    assert not torch.equal(results[0][2][stepped], saved[1][stepped])  # the steps advanced their slots
    assert not torch.equal(results[0][4][verified], saved[1][verified])  # the commits did too
