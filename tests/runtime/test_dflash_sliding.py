"""The context K/V that a hybrid's sliding drafter layers need stays across rounds.

Rounds feed the drafter a few accepted rows at a time (as `ddtree` does after each verify); the
sliding layers still see the last `window` context rows, which lie in earlier rounds. Drafting
round by round must equal one pass over the whole context with fresh caches.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ddtree_runtime.config import DFlashConfig
from ddtree_runtime.models.dflash import DFlashDrafter
from tests.runtime.helpers import assert_close

HIDDEN, VOCAB, BLOCK, WINDOW = 64, 50, 4, 6


def drafter(tmp_path: Path) -> DFlashDrafter:
    raw = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_target_layers": 8,
        "block_size": BLOCK,
        "dflash_config": {"mask_token_id": 49, "target_layer_ids": [1, 5]},
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "use_sliding_window": True,
        "sliding_window": WINDOW,
    }
    torch.manual_seed(0)
    model = DFlashDrafter(DFlashConfig.from_dict(raw, tmp_path / "config.json"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.1) if "norm" in name else p.normal_(0.0, p.shape[-1] ** -0.5)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return model.eval()


def test_round_by_round_equals_one_pass_over_the_whole_context(tmp_path: Path) -> None:
    model = drafter(tmp_path)
    assert model.config.windows == (WINDOW, WINDOW, None)
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(23, 2 * HIDDEN, generator=gen)
    noise = F.embedding(torch.tensor([7, 49, 49, 49]), torch.randn(VOCAB, HIDDEN, generator=gen))
    model.setup_caches(64)
    start = 0
    with torch.inference_mode():
        for rows in (9, 1, 3, 2, 1, 4, 3):  # the prompt, then accepted rows per round
            got = model(features[start : start + rows], start, noise)
            start += rows
        model.setup_caches(64)
        want = model(features[:start], 0, noise)
    assert start == 23 > 3 * WINDOW
    assert_close(got, want, torch.float32, atol=1e-5, rtol=1e-5)
