"""Our DFlash drafter against z-lab's reference model (the `dflash` package) on the same weights.

The package is installed with --no-deps as a test-only oracle; its `dflash.model` module imports
only torch and transformers, which the dev environment has, so it is imported as is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ddtree_runtime.loader import load_drafter
from tests.runtime.helpers import assert_close

reference = pytest.importorskip("dflash.model")
transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN, BLOCK, WINDOW = 97, 64, 4, 5
LAYER_TYPES = {
    "full": ["full_attention"] * 3,
    "sliding": ["sliding_attention"] * 3,
    "mixed": ["sliding_attention", "sliding_attention", "full_attention"],
}


def drafter_config(layer_types: list[str], is_causal: bool | None) -> dict[str, object]:
    cfg: dict[str, object] = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 96,
        "num_hidden_layers": len(layer_types),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 512,
        "num_target_layers": 6,
        "block_size": BLOCK,
        "dflash_config": {"mask_token_id": 96, "target_layer_ids": [1, 3]},
        "layer_types": layer_types,
        "use_sliding_window": "sliding_attention" in layer_types,
        "sliding_window": WINDOW,
    }
    if is_causal is not None:
        cfg["is_causal"] = is_causal
    return cfg


@pytest.mark.parametrize(
    ("kind", "is_causal"), [("full", None), ("sliding", None), ("mixed", None), ("full", True)]
)
def test_draft_logits_match_the_reference_over_two_rounds(
    kind: str, is_causal: bool | None, tmp_path: Path, device: torch.device, dtype: torch.dtype
) -> None:
    raw = drafter_config(LAYER_TYPES[kind], is_causal)
    torch.manual_seed(0)
    ref = reference.DFlashDraftModel(transformers.Qwen3Config(**raw))
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.normal_(1.0, 0.1) if "norm" in name else p.normal_(0.0, p.shape[-1] ** -0.5)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    ref = ref.to(device=device, dtype=dtype).eval()
    ours = load_drafter(tmp_path, device, dtype)
    ours.setup_caches(64)

    embed = torch.randn(VOCAB, HIDDEN, device=device, dtype=dtype)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).to(device=device, dtype=dtype)
    cache = reference._make_cache(ref.config)
    mask_id = raw["dflash_config"]["mask_token_id"]
    start = 0
    # round 1: a 9-token prompt as context; round 2: three accepted tokens as new context
    for ctx_len, root in [(9, 17), (3, 42)]:
        features = torch.randn(ctx_len, 2 * HIDDEN, device=device, dtype=dtype)
        block = torch.tensor([root] + [mask_id] * (BLOCK - 1), device=device)
        noise = F.embedding(block, embed)
        ctx_start, start = start, start + ctx_len
        with torch.inference_mode():
            positions = torch.arange(ctx_start, start + BLOCK, device=device)[None]
            want_hidden = ref(
                target_hidden=features[None],
                noise_embedding=noise[None],
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )[0]
            reference._crop_to(cache, start)
            want = ref.compute_logits(want_hidden[1:], head).float()
            got = ours.logits(ours(features, ctx_start, noise)[1:], head)
        assert_close(got, want, dtype)
