"""Qwen3_5Config from the real Qwen3.6-27B config.json: kinds from full_attention_interval, partial
RoPE, settings under text_config; refusals name the file and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_runtime.config import ConfigError, Qwen3_5Config
from tests.lint import qwen36

PATH = Path("target/config.json")


def test_the_real_qwen36_27b_config() -> None:
    cfg = Qwen3_5Config.from_dict(qwen36.target(), PATH)
    assert cfg.num_hidden_layers == 64 and cfg.hidden_size == 5120 and cfg.vocab_size == 248320
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",) + cfg.layer_types[4:]
    assert len(cfg.full_layers) == 16 and len(cfg.linear_layers) == 48 and cfg.full_layers[-1] == 63
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (24, 4, 256)
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (16, 48)
    assert cfg.rotary_dim == 64 and cfg.rope_theta == 10000000
    assert cfg.eos_token_ids == (qwen36.EOS,) and cfg.max_position_embeddings == 262144


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": ["linear_attention"] * 3}, "layer_types must list 64 entries"),
        ({"model_type": "qwen3_next"}, "not a Qwen3.5 hybrid"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"linear_num_value_heads": 40}, "linear_num_value_heads/linear_num_key_heads"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e7, "factor": 4.0}}, "rope type 'yarn'"),
    ],
)
def test_refusals_name_the_field(change: dict, message: str) -> None:
    raw = qwen36.target()
    raw["text_config"].update(change)
    with pytest.raises(ConfigError, match=message) as err:
        Qwen3_5Config.from_dict(raw, PATH)
    assert str(PATH) in str(err.value)
