"""The story's pair at its real shapes: Qwen/Qwen3.6-27B and z-lab/Qwen3.6-27B-DFlash.

Configs carry the published values (see `drafter_config/specs/qwen3.6-27b-dflash.yaml` for the
sources); the drafter's ~3.5 GB of weights are a real safetensors header over a sparse hole, so
the lint reads real shapes without anything being written to disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.lint import corpus

MASK, EOS = 248070, 248044
IDS = [1, 16, 31, 46, 61]
TYPES = ["sliding_attention"] * 4 + ["full_attention"]


def target() -> dict[str, Any]:
    """Qwen/Qwen3.6-27B's config.json (no layer_types: derived from full_attention_interval)."""
    config = corpus.qwen35_target(layers=64, hidden=5120)
    config["text_config"].update(
        {
            "head_dim": 256,
            "intermediate_size": 17408,
            "num_attention_heads": 24,
            "num_key_value_heads": 4,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 48,
            "partial_rotary_factor": 0.25,
        }
    )
    return config


def drafter() -> dict[str, Any]:
    """z-lab/Qwen3.6-27B-DFlash's config.json."""
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": 16,
        "bos_token_id": None,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": list(IDS)},
        "dtype": "bfloat16",
        "eos_token_id": EOS,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 17408,
        "layer_types": list(TYPES),
        "max_position_embeddings": 262144,
        "max_window_layers": 5,
        "model_type": "qwen3",
        "num_attention_heads": 32,
        "num_hidden_layers": 5,
        "num_key_value_heads": 8,
        "num_target_layers": 64,
        "pad_token_id": EOS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000000,
        "sliding_window": 2048,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": True,
        "vocab_size": 248320,
    }


def shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    hidden, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    d, inter = config["head_dim"], config["intermediate_size"]
    out = {
        "fc.weight": (hidden, len(IDS) * hidden),
        "hidden_norm.weight": (hidden,),
        "norm.weight": (hidden,),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        out.update(
            {
                p + "self_attn.q_proj.weight": (heads * d, hidden),
                p + "self_attn.k_proj.weight": (kv * d, hidden),
                p + "self_attn.v_proj.weight": (kv * d, hidden),
                p + "self_attn.o_proj.weight": (hidden, heads * d),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
            }
        )
    return out


def write_sparse_safetensors(path: Path, tensors: dict[str, tuple[int, ...]], dtype: str = "BF16") -> None:
    """A valid safetensors file of the given bf16 shapes whose data is a hole (no disk used)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in sorted(tensors.items()):
        size = 2
        for n in shape:
            size *= n
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)
    os.truncate(path, 8 + len(raw) + offset)


def write_pair(root: Path, drafter_config: dict[str, Any]) -> tuple[str, str]:
    d = root / "drafter"
    corpus.write_json(d / "config.json", drafter_config)
    write_sparse_safetensors(d / "model.safetensors", shapes(drafter()))
    t = corpus.write_target(root / "target", target(), tokenizer=False)
    return str(d), str(t)
