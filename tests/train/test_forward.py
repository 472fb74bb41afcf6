"""Training runs the models' own forwards: many blocks in one drafter pass give the hidden states and
the gradients of `DFlashDrafter.forward` run one block at a time (dense, sliding and hybrid pairs),
and the target's features stay right after the engine has set the target up for something else."""

from __future__ import annotations

import pytest
import torch

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.config import DFlashConfig
from ddtree_runtime.engine import Engine
from ddtree_runtime.loader import load_target, read_state_dict
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.tiny import TinyPair
from ddtree_runtime.train.forward import TargetFeatures, draft_blocks


def _trainable(pair: TinyPair) -> DFlashDrafter:
    """The pair's drafter as training builds it: unfused, fp32, with gradients."""
    drafter = DFlashDrafter(DFlashConfig.from_dir(pair.drafter))
    drafter.load_state_dict(read_state_dict(pair.drafter, lambda k: k, torch.device("cpu"), torch.float32))
    return drafter


@pytest.mark.parametrize("which", ["raw_pair", "mixed_raw_pair", "hybrid_raw_pair"])
def test_blocks_in_one_pass_match_the_runtime_one_block_at_a_time(which: str, request) -> None:
    pair: TinyPair = request.getfixturevalue(which)
    target = load_target(pair.target, torch.device("cpu"), torch.float32)
    drafter = _trainable(pair)
    block, mask_id = drafter.config.block_size, drafter.config.mask_token_id
    tokens = torch.randint(5, 69, (30,), generator=torch.Generator().manual_seed(1))
    feats = TargetFeatures(target, drafter.config.target_layer_ids)(tokens)
    anchors = torch.tensor([3, 11, 12, 27, 28])  # the last ones run past the sequence's end
    embed, head = target.embed_tokens.weight, target.lm_head

    got = draft_blocks(drafter, feats, tokens, anchors, embed)
    drafter.logits(got, head).logsumexp(-1).sum().backward()
    got_grads = {n: p.grad.clone() for n, p in drafter.named_parameters()}
    drafter.zero_grad()

    mask = torch.full((block - 1,), mask_id)
    for i, a in enumerate(anchors.tolist()):
        drafter.setup_caches(64)
        want = drafter(feats[:a], 0, embed[torch.cat([tokens[a : a + 1], mask])])
        torch.testing.assert_close(got[i], want, rtol=1e-4, atol=1e-4)
        drafter.logits(want, head).logsumexp(-1).sum().backward()
    for name, p in drafter.named_parameters():
        torch.testing.assert_close(got_grads[name], p.grad, rtol=1e-3, atol=1e-4, msg=name)


def test_features_survive_the_engine_setting_the_target_up(hybrid_raw_pair: TinyPair) -> None:
    target = load_target(hybrid_raw_pair.target, torch.device("cpu"), torch.float32)
    tokens = torch.randint(5, 69, (40,), generator=torch.Generator().manual_seed(2))
    layers = (1, 3)  # a Gated DeltaNet layer and the last (full attention: the normed output)
    target.setup_caches(64, layers)
    _, want = target(tokens, torch.arange(40), 0, None, TorchBackend())
    features = TargetFeatures(target, layers)
    torch.testing.assert_close(features(tokens[:20]), want[:20])  # chain prefix: same rows
    Engine(target, None, max_context=24).generate([5, 6, 7], mode="ar", max_new_tokens=4, eos_ids=())
    got = features(tokens)
    assert got.shape == (40, 2 * target.config.hidden_size)
    torch.testing.assert_close(got, want)
