"""Config parsing: derived fields, z-lab fallbacks, and refusals that name the file, field and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_runtime.config import ConfigError, DFlashConfig, Qwen3Config, default_target_layer_ids

TARGET = {
    "model_type": "qwen3",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "eos_token_id": 7,
}
PATH = Path("ckpt/config.json")


def test_target_derived_fields_and_rope_parameters() -> None:
    cfg = Qwen3Config.from_dict(
        {**TARGET, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, PATH
    )
    assert (cfg.head_dim, cfg.q_per_kv, cfg.rope_theta, cfg.eos_token_ids) == (16, 2, 5e5, (7,))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "llama"}, "model_type 'llama'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "rope type 'yarn'"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ],
)
def test_target_refusals(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        Qwen3Config.from_dict({**TARGET, **change}, PATH)
    assert str(PATH) in str(err.value)


def test_drafter_reads_dflash_config_with_top_level_fallback() -> None:
    raw = {
        **TARGET,
        "num_hidden_layers": 3,
        "num_target_layers": 8,
        "block_size": 8,
        "mask_token_id": 99,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "use_sliding_window": True,
        "sliding_window": 16,
    }
    cfg = DFlashConfig.from_dict(raw, PATH)
    assert cfg.target_layer_ids == tuple(default_target_layer_ids(8, 3)) == (1, 3, 5)
    assert (cfg.mask_token_id, cfg.block_size) == (99, 8)
    assert cfg.causal == (True, True, False) and cfg.windows == (16, 16, None)
    nested = DFlashConfig.from_dict(
        {**raw, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [2, 4, 6]}}, PATH
    )
    assert (nested.mask_token_id, nested.target_layer_ids) == (5, (2, 4, 6))
    forced = DFlashConfig.from_dict({**raw, "is_causal": True, "use_sliding_window": False}, PATH)
    assert forced.causal == (True, True, True) and forced.windows == (None, None, None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mask_token_id": None}, "mask_token_id is missing"),
        ({"layer_types": ["full_attention"]}, "layer_types has 1 entries for 3 layers"),
        ({"block_size": 1}, "block_size 1 leaves no draft positions"),
        ({"block_size": 10**8}, "block_size is 100000000, more than 256"),
    ],
)
def test_drafter_refusals(change: dict, message: str) -> None:
    raw = {**TARGET, "num_hidden_layers": 3, "num_target_layers": 8, "mask_token_id": 99, **change}
    with pytest.raises(ConfigError, match=message):
        DFlashConfig.from_dict(raw, PATH)
