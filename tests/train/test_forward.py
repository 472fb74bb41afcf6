"""The training forwards compute what the runtime computes: the batched causal target pass matches
`Qwen3.forward`, and many blocks in one drafter pass match `DFlashDrafter.forward` one block at a time."""

from __future__ import annotations

import torch

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.loader import load_drafter, load_target
from ddtree_runtime.tiny import TinyPair
from ddtree_runtime.train.forward import drafter_blocks, target_forward


def test_target_forward_matches_runtime(raw_pair: TinyPair) -> None:
    target = load_target(raw_pair.target, torch.device("cpu"), torch.float32)
    tokens = torch.randint(5, 69, (2, 23), generator=torch.Generator().manual_seed(0))
    layers = (1, 3)
    logits, hidden = target_forward(target, tokens, layers)
    target.setup_caches(32, layers)
    for row in range(2):
        want_logits, want_hidden = target(tokens[row], torch.arange(23), 0, None, TorchBackend())
        torch.testing.assert_close(logits[row], want_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(hidden[row], want_hidden, rtol=1e-4, atol=1e-4)


def _check_blocks(pair: TinyPair) -> None:
    target = load_target(pair.target, torch.device("cpu"), torch.float32)
    drafter = load_drafter(pair.drafter, torch.device("cpu"), torch.float32)
    block = drafter.config.block_size
    tokens = torch.randint(5, 69, (30,), generator=torch.Generator().manual_seed(1))
    _, feats = target_forward(target, tokens[None], drafter.config.target_layer_ids)
    feats = feats[0]
    anchors = torch.tensor([3, 11, 12, 27, 29])  # the last ones run past the sequence's end
    got = drafter_blocks(drafter, feats, tokens, anchors, target.embed_tokens.weight)
    drafter.setup_caches(64)
    mask = torch.full((block - 1,), drafter.config.mask_token_id)
    for i, a in enumerate(anchors.tolist()):
        noise = target.embed_tokens(torch.cat([tokens[a : a + 1], mask]))
        want = drafter(feats[:a], 0, noise)
        torch.testing.assert_close(got[i], want, rtol=1e-4, atol=1e-4)


def test_drafter_blocks_match_runtime(raw_pair: TinyPair) -> None:
    _check_blocks(raw_pair)


def test_drafter_blocks_match_runtime_with_sliding_layers(mixed_raw_pair: TinyPair) -> None:
    _check_blocks(mixed_raw_pair)


def test_greedy_batch_matches_the_engine(raw_pair: TinyPair) -> None:
    import random

    from ddtree_runtime.engine import Engine
    from ddtree_runtime.train.forward import greedy_batch

    target = load_target(raw_pair.target, torch.device("cpu"), torch.float32)
    rng = random.Random(0)
    prompts = [[rng.randrange(5, 69) for _ in range(rng.randint(2, 9))] for _ in range(5)]
    engine = Engine(target, None, 64)
    want = [engine.generate(p, mode="ar", max_new_tokens=16, eos_ids=()).output_ids for p in prompts]
    assert greedy_batch(target, prompts, 16, set()) == want
    eos = want[1][3]
    assert greedy_batch(target, prompts[1:2], 16, {eos}) == [want[1][: want[1].index(eos) + 1]]
