"""Continuous batching is lossless: at T = 0 every request gets exactly the tokens it gets alone
(`Engine.generate`), whatever else is in the batch (modes, lengths, joins and leaves mid-run), on
the dense and the hybrid pair; seeded sampling is reproducible; a short prompt behind a long one
gets its first token within one prefill chunk plus two rounds."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import torch

from ddtree_runtime.backend import TorchBackend, select_backend
from ddtree_runtime.batching import BatchEngine
from ddtree_runtime.engine import Engine, GenerationError
from ddtree_runtime.loader import load_pair
from ddtree_runtime.models.target import Forest, Part, Steps
from ddtree_runtime.tiny import SPECIALS, TinyPair
from ddtree_runtime.triton_backend import TritonBackend
from tests.runtime.helpers import assert_same_tokens, engine_for

MIX = [("ar", 0), ("dflash", 0), ("ddtree", 1), ("ddtree", 7), ("ddtree", 32)]


def requests(seed: int, count: int) -> list[dict[str, Any]]:
    """Mixed modes, prompt lengths and output lengths; eos off, so lengths differ by design."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        mode, budget = MIX[i % len(MIX)]
        prompt = [len(SPECIALS) + rng.randrange(64) for _ in range(rng.randint(1, 20))]
        out.append(
            {
                "prompt_ids": prompt,
                "mode": mode,
                "budget": max(budget, 1),
                "max_new_tokens": rng.randint(3, 24),
                "eos_ids": (),
            }
        )
    return out


def ddtree_requests(seed: int, count: int, budget: int) -> list[dict[str, Any]]:
    """`requests`, all greedy ddtree ones of one budget, long enough for several rounds together."""
    return [
        {**r, "mode": "ddtree", "budget": budget, "max_new_tokens": 8 + 2 * r["max_new_tokens"]}
        for r in requests(seed, count)
    ]


def assert_each_alone(
    alone: Engine, reqs: list[dict[str, Any]], results: list[Any], dtype: torch.dtype
) -> None:
    """Each request's tokens and acceptances are those it gets alone."""
    for req, result in zip(reqs, results, strict=True):
        want = alone.generate(**req)
        assert_same_tokens(alone, req["prompt_ids"], want.output_ids, result.output_ids, dtype)
        assert result.accepted_per_round == want.accepted_per_round


def batch_engine(
    pair: TinyPair, device: torch.device, dtype: torch.dtype, max_batch: int, chunk: int | None = None
) -> BatchEngine:
    target, drafter = load_pair(pair.target, pair.drafter, device, dtype)
    return BatchEngine(target, drafter, 256, max_batch, prefill_chunk=chunk)


@pytest.fixture(scope="module")
def alone(tiny_pair: TinyPair, device: torch.device, dtype: torch.dtype) -> Engine:
    return engine_for(tiny_pair, device, dtype, max_context=256)


@pytest.mark.parametrize(("max_batch", "chunk"), [(4, None), (3, 5)])
def test_every_request_gets_its_tokens_alone_whatever_the_batch(
    tiny_pair: TinyPair, alone: Engine, device: torch.device, dtype: torch.dtype, max_batch: int, chunk: int
) -> None:
    batched = batch_engine(tiny_pair, device, dtype, max_batch, chunk)
    reqs = requests(max_batch, 10)  # more requests than slots: joins and leaves mid-run
    got = batched.run(reqs)
    accepted = 0.0
    for req, result in zip(reqs, got, strict=True):
        want = alone.generate(**req)
        assert_same_tokens(alone, req["prompt_ids"], want.output_ids, result.output_ids, dtype)
        assert result.stop_reason == want.stop_reason
        if req["mode"] != "ar":
            assert result.accepted_per_round == want.accepted_per_round  # the same drafts too
            accepted = max(accepted, result.mean_accepted)
    assert accepted > 2.0  # drafts are accepted: multi-token commits happen inside the batch
    assert not batched.live and sorted(batched.free) == list(range(max_batch))


def test_the_hybrid_target_keeps_each_slots_states_apart(
    hybrid_pair: TinyPair, device: torch.device, dtype: torch.dtype
) -> None:
    alone = engine_for(hybrid_pair, device, dtype, max_context=256)
    batched = batch_engine(hybrid_pair, device, dtype, 3, chunk=4)
    reqs = requests(7, 7)
    for req, result in zip(reqs, batched.run(reqs), strict=True):
        want = alone.generate(**req)
        assert_same_tokens(alone, req["prompt_ids"], want.output_ids, result.output_ids, dtype)


def test_hybrid_ddtree_slots_of_one_budget_verify_as_a_forest_and_keep_their_tokens(
    hybrid_pair: TinyPair, device: torch.device, dtype: torch.dtype
) -> None:
    """Three ddtree requests at one budget beside an `ar` one: once they decode together, each
    DeltaNet layer verifies their trees in one `gdn_forest` call (joins and leaves change the
    forest), and every request gets exactly its tokens alone."""
    backend = select_backend(device)
    forests: list[int] = []  # the rows of each forest call

    class Forests(type(backend)):  # the backend itself, its forest calls counted
        def gdn_forest(self, proj: torch.Tensor, *args: Any) -> torch.Tensor:
            forests.append(proj.shape[0])
            return super().gdn_forest(proj, *args)

    alone = engine_for(hybrid_pair, device, dtype, max_context=256)
    target, drafter = load_pair(hybrid_pair.target, hybrid_pair.drafter, device, dtype)
    batched = BatchEngine(target, drafter, 256, 4, backend=Forests())
    rng = random.Random(5)
    reqs = [
        {
            "prompt_ids": [len(SPECIALS) + rng.randrange(64) for _ in range(rng.randint(2, 9))],
            "mode": mode,
            "budget": 4,
            "max_new_tokens": n,
            "eos_ids": (),
        }
        for mode, n in (("ddtree", 12), ("ar", 6), ("ddtree", 16), ("ddtree", 9))
    ]
    for req, result in zip(reqs, batched.run(reqs), strict=True):
        want = alone.generate(**req)
        assert_same_tokens(alone, req["prompt_ids"], want.output_ids, result.output_ids, dtype)
    layers = len(target.config.linear_layers)
    assert forests.count(3 * 5) >= layers and forests.count(2 * 5) >= layers  # trees of B + 1 nodes


def test_a_hybrid_pass_over_several_slots_gives_each_slot_its_own_logits(
    hybrid_pair: TinyPair, device: torch.device, dtype: torch.dtype
) -> None:
    """One pass over three slots' rows (gated attention in one call over every slot, DeltaNet per
    slot) against each slot's own pass on a second copy of the target: contexts of 5, 9 and 2
    tokens; a 3-token chain, a 4-node tree and a 1-token step."""
    backend = select_backend(device)
    batched, alone = (load_pair(hybrid_pair.target, hybrid_pair.drafter, device, dtype)[0] for _ in range(2))
    rng = random.Random(3)
    prompts = [[len(SPECIALS) + rng.randrange(64) for _ in range(n)] for n in (5, 9, 2)]
    for target in (batched, alone):
        target.setup_caches(64, slots=3)
        for slot, prompt in enumerate(prompts):
            rows = torch.tensor(prompt, device=device)
            target.forward_parts([Part(slot, rows, torch.arange(len(prompt), device=device), 0)], backend)

    def parts(target: Any) -> list[Part]:
        parents, depth = torch.tensor([-1, 0, 0, 1], device=device), torch.tensor([0, 1, 1, 2], device=device)
        tree = target.plan(parents, depth, backend, chain=False)
        new = [torch.tensor([len(SPECIALS) + i for i in range(n)], device=device) for n in (3, 4, 1)]
        steps = [torch.arange(3, device=device), depth, torch.arange(1, device=device)]
        return [
            Part(slot, tokens, len(prompt) + step, len(prompt), tree if slot == 1 else None)
            for slot, (prompt, tokens, step) in enumerate(zip(prompts, new, steps, strict=True))
        ]

    got, _ = batched.forward_parts(parts(batched), backend)
    want = torch.cat([alone.forward_parts([p], backend)[0] for p in parts(alone)])
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_seeded_sampling_is_reproducible_in_a_batch(
    tiny_pair: TinyPair, alone: Engine, device: torch.device, dtype: torch.dtype
) -> None:
    batched = batch_engine(tiny_pair, device, dtype, 3)
    reqs = requests(3, 6)
    for i, req in enumerate(reqs):
        req.update(temperature=0.8, top_p=0.9, seed=100 + i, max_new_tokens=16)
    reqs[1].update(temperature=0.0)  # a greedy one beside the sampled ones
    first = [r.output_ids for r in batched.run(reqs)]
    second = [r.output_ids for r in batched.run(reqs)]
    assert first == second
    if dtype == torch.float32:  # each slot draws from its own generator, as the request alone does
        assert first == [alone.generate(**req).output_ids for req in reqs]


def test_a_short_prompt_behind_a_long_one_starts_within_a_chunk_and_two_rounds(
    tiny_pair: TinyPair, device: torch.device, dtype: torch.dtype
) -> None:
    chunk = 8
    engine = batch_engine(tiny_pair, device, dtype, 4, chunk)
    running = engine.add([5, 6, 7], mode="ddtree", budget=8, max_new_tokens=200, eos_ids=())
    engine.step()  # a running sequence, streaming
    long = engine.add([len(SPECIALS) + i % 60 for i in range(6 * chunk)], mode="ddtree", budget=8, eos_ids=())
    engine.step()  # the long prompt's first chunk is in
    seen: dict[str, tuple[int, int]] = {}
    before = (engine.chunks, engine.rounds)

    def first(tokens: list[int]) -> None:
        seen.setdefault("short", (engine.chunks - before[0], engine.rounds - before[1]))

    engine.add([9, 10], mode="ddtree", budget=8, max_new_tokens=4, eos_ids=(), on_tokens=first)
    streamed = len(running.out.ids)
    while "short" not in seen:
        engine.step()
    chunks, rounds = seen["short"]
    assert chunks <= 1 + 1 and rounds <= 2  # its own one-chunk prefill, after at most one other
    assert len(running.out.ids) > streamed  # the running sequence kept streaming
    assert not long.decoding  # the long prompt is still being prefilled


def test_waiting_prompts_prefill_together_up_to_the_chunk(
    tiny_pair: TinyPair, device: torch.device, dtype: torch.dtype
) -> None:
    """One pass takes the prompts nearest their end until `prefill_chunk` tokens: two short ones
    whole and the start of the third, which ends in the next pass; each then decodes its tokens
    alone (the other tests compare them)."""
    engine = batch_engine(tiny_pair, device, dtype, 4, 8)
    a, b = (
        engine.add([5 + i, 6, 7], mode="ddtree", budget=8, max_new_tokens=6, eos_ids=()) for i in range(2)
    )
    c = engine.add([9, 10, 11, 12, 13], mode="ar", max_new_tokens=6, eos_ids=())
    engine.step()
    assert engine.chunks == 1 and a.decoding and b.decoding and not c.decoding and c.prefilled == 2
    engine.step()
    assert engine.chunks == 2 and c.decoding


def test_cancel_frees_the_slot_at_the_next_step(
    tiny_pair: TinyPair, device: torch.device, dtype: torch.dtype
) -> None:
    engine = batch_engine(tiny_pair, device, dtype, 2)
    cancel = threading.Event()
    a = engine.add([5, 6], mode="ddtree", budget=4, max_new_tokens=100, eos_ids=(), cancel=cancel)
    b = engine.add([7, 8], mode="ar", max_new_tokens=100, eos_ids=())
    engine.step()
    engine.step()
    cancel.set()
    assert engine.step() == [a]
    assert a.result is not None and a.result.stop_reason == "cancelled"
    assert engine.live == [b] and len(engine.free) == 1
    with pytest.raises(GenerationError, match="max_context"):
        engine.add([5] * 250, mode="ar", max_new_tokens=100)
    engine.add([5], mode="ar")
    with pytest.raises(GenerationError, match="slots are in use"):
        engine.add([5], mode="ar")


@pytest.mark.parametrize("pair_name", ["tiny_pair", "hybrid_pair"])
@pytest.mark.parametrize("backend", [TorchBackend(), TritonBackend()], ids=["torch", "triton"])
def test_a_step_from_device_buffers_is_the_step_of_its_parts(
    request: pytest.FixtureRequest, pair_name: str, backend: Any, device: torch.device, dtype: torch.dtype
) -> None:
    """`Steps` (what the graphed `ar` round captures: tokens, slots and lengths in device buffers)
    gives every sequence the logits, K/V rows and DeltaNet states of the same step as parts, on
    both backends (the kernels under the interpreter on the CPU)."""
    pair = request.getfixturevalue(pair_name)
    target, _ = load_pair(pair.target, pair.drafter, device, dtype)
    target.setup_caches(64, slots=4)
    prompts = {3: [5, 6, 7], 1: [8, 9, 10, 11, 12], 0: [13]}  # slots out of order, one left free
    for slot, prompt in prompts.items():  # (prefilled on PyTorch: a hybrid's uses fla, GPU only)
        tokens = torch.tensor(prompt, device=device)
        part = Part(slot, tokens, torch.arange(len(prompt), device=device), 0)
        target.forward_parts([part], TorchBackend())
    slots, ctxs, roots = list(prompts), [len(p) for p in prompts.values()], [20, 21, 22]
    restore = target.snapshot(slots)

    def state() -> list[torch.Tensor]:
        names = ("k_caches", "v_caches", "conv_states", "rec_states")
        return [getattr(target, n).clone() for n in names if hasattr(target, n)]

    parts = [
        Part(s, torch.tensor([r], device=device), torch.tensor([c], device=device), c)
        for s, r, c in zip(slots, roots, ctxs, strict=True)
    ]
    want, _ = target.forward_parts(parts, backend, capture=False)
    want_state = state()
    restore()
    steps = Steps.empty(len(slots), max(ctxs) + 1, device)
    steps.fill(roots, slots, ctxs)
    got, _ = target.forward_parts(steps.forest(), backend, capture=False)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(state(), want_state, strict=True))


@pytest.mark.parametrize("pair_name", ["tiny_pair", "hybrid_pair"])
@pytest.mark.parametrize("backend", [TorchBackend(), TritonBackend()], ids=["torch", "triton"])
def test_a_forest_from_device_tensors_verifies_and_commits_as_its_parts(
    request: pytest.FixtureRequest, pair_name: str, backend: Any, device: torch.device, dtype: torch.dtype
) -> None:
    """A `Forest` (what a graphed ddtree round verifies and commits: every sequence's tree from
    device tensors alone) gives every sequence the logits and features of the same trees as parts,
    and after its one commit call (`commit_forest`, every slot's accepted path at once) each slot
    the K/V rows and DeltaNet states of its own commit after the parts' pass, bit for bit, on both
    backends. Each sequence has its own tree (conv windows) and path, the root alone among them;
    padding sequences commit into the scratch slot and nowhere else (slot 1 stays free)."""
    pair = request.getfixturevalue(pair_name)
    target, _ = load_pair(pair.target, pair.drafter, device, dtype)
    target.setup_caches(64, capture_layers=(0, 1), slots=5)
    prompts = {2: [5, 6, 7], 0: [8, 9, 10, 11, 12], 3: [13]}  # slots out of order, one left free
    scratch, padding = 4, 2
    for slot, prompt in prompts.items():
        tokens = torch.tensor(prompt, device=device)
        target.forward_parts(
            [Part(slot, tokens, torch.arange(len(prompt), device=device), 0)], TorchBackend()
        )
    slots = [*prompts, *[scratch] * padding]
    ctxs = [len(p) for p in prompts.values()] + [0] * padding

    def ints(rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor(rows, device=device)

    # a bushy tree, a chain and a star of five nodes (then the padding's, the first again)
    parents = ints([[-1, 0, 0, 1, 2], [-1, 0, 1, 2, 3], [-1, 0, 0, 0, 0], *[[-1, 0, 0, 1, 2]] * padding])
    depth = ints([[0, 1, 1, 2, 2], [0, 1, 2, 3, 4], [0, 1, 1, 1, 1], *[[0, 1, 1, 2, 2]] * padding])
    tokens = ints([[20, 21, 22, 23, 24], [25, 21, 26, 27, 28], [29, 30, 31, 32, 33], *[[0] * 5] * padding])
    paths = ints([[0, 2, 4, -1, -1], [0, 1, 2, 3, -1], [0, -1, -1, -1, -1], *[[0, 2, 4, -1, -1]] * padding])
    path_lens = torch.tensor([3, 4, 1, *[3] * padding], device=device)
    plans = [target.plan(p, d, backend, False) for p, d in zip(parents, depth, strict=True)]
    keys = max(ctxs) + 5
    restore = target.snapshot(sorted(set(slots)))
    real = len(prompts)

    def state() -> list[torch.Tensor]:  # every slot's but the scratch one's
        names = ("k_caches", "v_caches", "conv_states", "rec_states")
        return [getattr(target, n)[:scratch].clone() for n in names if hasattr(target, n)]

    parts = [
        Part(s, t, c + d, c, plan, keys)
        for s, t, c, d, plan in zip(slots, tokens, ctxs, depth, plans, strict=True)
    ]
    logits, hidden = target.forward_parts(parts, backend)
    for i in range(real):
        target.commit(ctxs[i], plans[i], paths[i], path_lens[i], backend, slots[i])
    want = [logits[: real * 5], hidden[: real * 5], *state()]
    restore()
    values = ints([slots, ctxs])
    forest = Forest(tokens, depth, values[0], values[1], keys, plans)
    logits, hidden = target.forward_parts(forest, backend)
    target.commit_forest(forest, paths, path_lens, backend)
    got = [logits[: real * 5], hidden[: real * 5], *state()]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("pair_name", ["tiny_pair", "hybrid_pair"])
def test_ddtree_requests_of_one_budget_run_as_tree_rounds_and_keep_their_tokens(
    request: pytest.FixtureRequest, pair_name: str, device: torch.device, dtype: torch.dtype
) -> None:
    """Greedy ddtree requests of one budget decode in tree rounds (the round a CUDA graph
    captures: drafts, trees, verify and walks from device tensors alone; on CUDA replayed), as
    requests join and leave (several batch sizes), and each gets its tokens and acceptances alone."""
    pair = request.getfixturevalue(pair_name)
    alone = engine_for(pair, device, dtype, max_context=256)
    batched = batch_engine(pair, device, dtype, 3, chunk=4)
    reqs = ddtree_requests(17, 6, budget=6)
    assert_each_alone(alone, reqs, batched.run(reqs), dtype)
    assert {sequences for _, sequences, _, _ in batched.tree_rounds} >= {1, 2, 3}
    if batched.step_graphs is not None:
        assert set(batched.tree_rounds) <= set(batched.step_graphs.graphs)


@pytest.mark.parametrize("pair_name", ["tiny_pair", "hybrid_pair"])
def test_requests_for_logprobs_get_them_in_a_batch_as_alone(
    request: pytest.FixtureRequest, pair_name: str, device: torch.device, dtype: torch.dtype
) -> None:
    """Requests asking for logprobs (every mode, beside requests that do not) get each emitted
    token's logprob and top ones as `Engine.generate` gives them alone; the others get none."""
    pair = request.getfixturevalue(pair_name)
    alone = engine_for(pair, device, dtype, max_context=256)
    batched = batch_engine(pair, device, dtype, 3, chunk=4)
    reqs = [{**r, "logprobs": 3} if i % 2 == 0 else r for i, r in enumerate(requests(29, 7))]
    for req, result in zip(reqs, batched.run(reqs), strict=True):
        want = alone.generate(**req)
        assert result.output_ids == want.output_ids
        if "logprobs" not in req:
            assert result.logprobs is None
            continue
        assert result.logprobs is not None and want.logprobs is not None
        assert [e.token for e in result.logprobs] == result.output_ids
        for got, exp in zip(result.logprobs, want.logprobs, strict=True):
            assert got.logprob == pytest.approx(exp.logprob, abs=1e-4)
            assert [t for t, _ in got.top] == [t for t, _ in exp.top]


@pytest.mark.parametrize("pair_name", ["tiny_pair", "hybrid_pair"])
def test_padded_rounds_run_warmed_shapes_and_keep_each_requests_tokens(
    request: pytest.FixtureRequest, pair_name: str, device: torch.device, dtype: torch.dtype
) -> None:
    """Padded to batch buckets (as on CUDA, where each shape is a graph), 3 sequences run as 4, the
    fourth a scratch sequence in a slot no request owns; the warm-up makes every shape the rounds
    then take (on CUDA: captures them, so serving captures none), and each request gets its tokens
    and acceptances alone."""
    pair = request.getfixturevalue(pair_name)
    alone = engine_for(pair, device, dtype, max_context=256)
    target, drafter = load_pair(pair.target, pair.drafter, device, dtype)
    batched = BatchEngine(target, drafter, 256, 4, prefill_chunk=4, padded=True)
    assert batched.batch_buckets() == [1, 2, 4] and target.k_caches.shape[0] == 5  # + the scratch slot
    batched.warmup(modes=["ddtree"], budgets=[6])
    warmed = set(batched.tree_rounds)
    assert {(n, b) for _, n, b, _ in warmed} == {(1, 6), (2, 6), (4, 6)}
    reqs = ddtree_requests(23, 3, budget=6)  # three requests in four slots: a round of 4 is padded
    assert_each_alone(alone, reqs, batched.run(reqs), dtype)
    ran = set(batched.tree_rounds)
    assert {k[:3] for k in ran} == {k[:3] for k in warmed}  # no other sequence count or budget
    if batched.step_graphs is not None:  # CUDA: bounds are buckets too, and nothing was captured late
        assert ran == warmed
    else:  # the CPU builds the rounds at warm-up and runs them after: three sequences ran as four
        assert any(r.outcome is not None for key, r in batched.tree_rounds.items() if key[1] == 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("pair_name", ["tiny_pair", "hybrid_pair"])
def test_on_cuda_graphed_tree_rounds_in_bf16_give_each_request_its_tokens_alone(
    request: pytest.FixtureRequest, pair_name: str
) -> None:
    """The replayed tree rounds in bf16 (the fp32 case is the test above on a CUDA run). CUDA only."""
    pair, device = request.getfixturevalue(pair_name), torch.device("cuda")
    alone = engine_for(pair, device, torch.bfloat16, max_context=256)
    batched = batch_engine(pair, device, torch.bfloat16, 4, chunk=5)
    reqs = [{**r, "mode": "ddtree", "budget": 8} for r in requests(19, 9)]
    for req, result in zip(reqs, batched.run(reqs), strict=True):
        want = alone.generate(**req)
        assert_same_tokens(alone, req["prompt_ids"], want.output_ids, result.output_ids, torch.bfloat16)
    assert batched.step_graphs is not None and len(batched.tree_rounds) >= 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("pair_name", ["tiny_pair", "hybrid_pair"])
@pytest.mark.parametrize("cuda_dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_graphed_ar_rounds_give_each_request_its_tokens_alone(
    request: pytest.FixtureRequest, pair_name: str, cuda_dtype: torch.dtype
) -> None:
    """Rounds of `ar` sequences only replay a captured step per (sequences, key bound) as requests
    join and leave, and every request gets its alone tokens. CUDA only."""
    pair, device = request.getfixturevalue(pair_name), torch.device("cuda")
    alone = engine_for(pair, device, cuda_dtype, max_context=256)
    batched = batch_engine(pair, device, cuda_dtype, 4, chunk=5)
    assert batched.step_graphs is not None
    reqs = [{**r, "mode": "ar"} for r in requests(13, 9)]
    for req, result in zip(reqs, batched.run(reqs), strict=True):
        want = alone.generate(**req)
        assert_same_tokens(alone, req["prompt_ids"], want.output_ids, result.output_ids, cuda_dtype)
    assert len(batched.step_graphs.graphs) >= 2  # several batch sizes were captured, then replayed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton backend's batched launches need a GPU")
@pytest.mark.parametrize("pair_name", ["tiny_pair", "mixed_pair", "hybrid_pair"])
@pytest.mark.parametrize("cuda_dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_batched_launches_give_each_request_its_tokens_alone(
    request: pytest.FixtureRequest, pair_name: str, cuda_dtype: torch.dtype
) -> None:
    """TritonBackend's one attention launch per layer over every slot (`attention_parts`: trees,
    chains and `ar` roots in the verify pass, the hybrid's gated attention too; the drafter's
    blocks, sliding layers in `mixed_pair`), the hybrid's DeltaNet step of every `ar` slot
    (`gdn_steps`) and its trees of one size (`gdn_forest`), and one walk of every greedy tree
    (`tree_walk_parts`) keep each request's own tokens. CUDA
    only (CI has no GPU): `TRITON_INTERPRET=0 pytest tests/runtime/test_batching.py` on a GPU host."""
    pair, device = request.getfixturevalue(pair_name), torch.device("cuda")
    alone = engine_for(pair, device, cuda_dtype, max_context=256)
    batched = batch_engine(pair, device, cuda_dtype, 4, chunk=5)
    seams = ("attention_parts", "tree_walk_parts", "gdn_steps", "gdn_forest")
    assert all(hasattr(batched.backend, seam) for seam in seams)
    reqs = requests(11, 10)
    for req, result in zip(reqs, batched.run(reqs), strict=True):
        want = alone.generate(**req)
        assert_same_tokens(alone, req["prompt_ids"], want.output_ids, result.output_ids, cuda_dtype)
        assert result.stop_reason == want.stop_reason
