"""A corpus of realistic, scaled-down checkpoints for the drafter config linter.

The configs copy the key sets and conventions of the published ones (Qwen/Qwen3-8B and
Qwen/Qwen3.6-27B targets, z-lab DFlash drafters) with small dimensions; token ids keep their real
values because no embedding is ever materialized. Weights are tiny but real safetensors files
written with the ``safetensors`` library, with shapes consistent with their config.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

# Qwen3 tokenizer's added tokens (ids as published in Qwen/Qwen3-8B tokenizer_config.json).
QWEN3_ADDED = {
    151643: "<|endoftext|>",
    151644: "<|im_start|>",
    151645: "<|im_end|>",
    151646: "<|object_ref_start|>",
    151647: "<|object_ref_end|>",
    151648: "<|box_start|>",
    151649: "<|box_end|>",
    151650: "<|quad_start|>",
    151651: "<|quad_end|>",
    151652: "<|vision_start|>",
    151653: "<|vision_end|>",
    151654: "<|vision_pad|>",
    151655: "<|image_pad|>",
    151656: "<|video_pad|>",
    151657: "<tool_call>",
    151658: "</tool_call>",
    151659: "<|fim_prefix|>",
    151660: "<|fim_middle|>",
    151661: "<|fim_suffix|>",
    151662: "<|fim_pad|>",
    151663: "<|repo_name|>",
    151664: "<|file_sep|>",
    151665: "<tool_response>",
    151666: "</tool_response>",
    151667: "<think>",
    151668: "</think>",
}
QWEN3_MASK = 151669
QWEN35_MASK = 248070
QWEN35_EOS = 248044


def qwen3_target(layers: int = 8, hidden: int = 64) -> dict[str, Any]:
    """Qwen/Qwen3-8B's config.json, scaled down (36 -> 8 layers, 4096 -> 64 hidden)."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 40960,
        "max_window_layers": layers,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }


def qwen35_target(layers: int = 16, hidden: int = 64) -> dict[str, Any]:
    """Qwen3.6-27B's layout (model_type qwen3_5, settings under text_config), scaled down.

    No ``layer_types``: it is derived from ``full_attention_interval`` (3 linear + 1 full).
    """
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "image_token_id": 248056,
        "model_type": "qwen3_5",
        "text_config": {
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_output_gate": True,
            "dtype": "bfloat16",
            "eos_token_id": QWEN35_EOS,
            "full_attention_interval": 4,
            "head_dim": 16,
            "hidden_act": "silu",
            "hidden_size": hidden,
            "initializer_range": 0.02,
            "intermediate_size": 128,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_value_head_dim": 16,
            "max_position_embeddings": 262144,
            "model_type": "qwen3_5_text",
            "mtp_num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_hidden_layers": layers,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "use_cache": True,
            "vocab_size": 248320,
            "rope_parameters": {
                "mrope_interleaved": True,
                "mrope_section": [11, 11, 10],
                "rope_type": "default",
                "rope_theta": 10000000,
                "partial_rotary_factor": 0.25,
            },
        },
        "tie_word_embeddings": False,
        "transformers_version": "4.57.0.dev0",
        "video_token_id": 248057,
        "vision_config": {"depth": 2, "hidden_size": 32, "model_type": "qwen3_5"},
    }


def default_ids(target_layers: int, draft_layers: int) -> list[int]:
    span = target_layers - 4
    return [round(1 + i * span / (draft_layers - 1)) for i in range(draft_layers)]


def qwen3_drafter(target_layers: int = 8, draft_layers: int = 3, hidden: int = 64) -> dict[str, Any]:
    """z-lab/Qwen3-8B-DFlash-b16's config.json, scaled down (real block size and mask id)."""
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": 16,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "dflash_config": {
            "mask_token_id": QWEN3_MASK,
            "target_layer_ids": default_ids(target_layers, draft_layers),
        },
        "dtype": "float16",
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "layer_types": ["full_attention"] * draft_layers,
        "max_position_embeddings": 40960,
        "max_window_layers": draft_layers,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": draft_layers,
        "num_key_value_heads": 2,
        "num_target_layers": target_layers,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }


def qwen36_drafter(target_layers: int = 16, hidden: int = 64) -> dict[str, Any]:
    """A Qwen3.6 sliding-window DFlash drafter: [S, S, S, S, F], scaled window (2048 -> 64)."""
    config = qwen3_drafter(target_layers, 5, hidden)
    config.update(
        {
            "dflash_config": {
                "mask_token_id": QWEN35_MASK,
                "target_layer_ids": default_ids(target_layers, 5),
            },
            "eos_token_id": QWEN35_EOS,
            "pad_token_id": QWEN35_EOS,
            "bos_token_id": None,
            "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
            "max_position_embeddings": 262144,
            "rope_theta": 10000000,
            "sliding_window": 64,
            "use_sliding_window": True,
            "vocab_size": 248320,
        }
    )
    return config


def drafter_tensors(config: dict[str, Any], ids_count: int | None = None) -> dict[str, np.ndarray]:
    """Tensors with the shapes the DFlash architecture builds for ``config`` (float16)."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv, head_dim, inter = config["num_key_value_heads"], config["head_dim"], config["intermediate_size"]
    count = ids_count if ids_count is not None else len(config["dflash_config"]["target_layer_ids"])
    rng = np.random.default_rng(0)

    def t(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float16)

    tensors = {
        "fc.weight": t(hidden, count * hidden),
        "hidden_norm.weight": t(hidden),
        "norm.weight": t(hidden),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        tensors.update(
            {
                p + "self_attn.q_proj.weight": t(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": t(kv * head_dim, hidden),
                p + "self_attn.v_proj.weight": t(kv * head_dim, hidden),
                p + "self_attn.o_proj.weight": t(hidden, heads * head_dim),
                p + "self_attn.q_norm.weight": t(head_dim),
                p + "self_attn.k_norm.weight": t(head_dim),
                p + "mlp.gate_proj.weight": t(inter, hidden),
                p + "mlp.up_proj.weight": t(inter, hidden),
                p + "mlp.down_proj.weight": t(hidden, inter),
                p + "input_layernorm.weight": t(hidden),
                p + "post_attention_layernorm.weight": t(hidden),
            }
        )
    return tensors


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def write_drafter(
    directory: Path, config: dict[str, Any], tensors: dict[str, np.ndarray] | None = None, shards: int = 1
) -> Path:
    """A drafter checkpoint directory: config.json plus one or more safetensors files."""
    write_json(directory / "config.json", config)
    tensors = drafter_tensors(config) if tensors is None else tensors
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory
    names = sorted(tensors)
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[shard::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    write_json(
        directory / "model.safetensors.index.json", {"metadata": {"total_size": 0}, "weight_map": weight_map}
    )
    return directory


def write_qwen3_tokenizer(directory: Path, vocab_size: int = 100) -> None:
    """tokenizer_config.json, special_tokens_map.json and a small tokenizer.json, Qwen3 style."""
    special = {i: not c.startswith(("<tool", "</tool", "<think", "</think")) for i, c in QWEN3_ADDED.items()}
    decoder = {
        str(i): {
            "content": c,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special[i],
        }
        for i, c in QWEN3_ADDED.items()
    }
    write_json(
        directory / "tokenizer_config.json",
        {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": decoder,
            "bos_token": None,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": 131072,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        },
    )
    write_json(
        directory / "special_tokens_map.json",
        {
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "eos_token": {
                "content": "<|im_end|>",
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
            },
            "pad_token": {
                "content": "<|endoftext|>",
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
            },
        },
    )
    vocab = {f"tok{i}": i for i in range(vocab_size)}
    write_json(
        directory / "tokenizer.json",
        {
            "version": "1.0",
            "added_tokens": [{"id": i, "content": c, "special": special[i]} for i, c in QWEN3_ADDED.items()],
            "model": {"type": "BPE", "vocab": vocab, "merges": []},
        },
    )


def write_target(directory: Path, config: dict[str, Any], tokenizer: bool = True) -> Path:
    write_json(directory / "config.json", config)
    if tokenizer:
        write_qwen3_tokenizer(directory)
    return directory


def write_spec(path: Path, name: str, values: dict[str, Any]) -> Path:
    lines = [f"# test spec modelled on a model card\nname: {name}\nvalues:"]
    lines += [f"  {k}: {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def qwen3_spec_values(config: dict[str, Any]) -> dict[str, Any]:
    """The 'published' values of the tiny Qwen3 drafter (what its model card would list)."""
    return {
        "block_size": 16,
        "mask_token_id": config["dflash_config"]["mask_token_id"],
        "target_layer_ids": list(config["dflash_config"]["target_layer_ids"]),
        "num_target_layers": config["num_target_layers"],
        "layer_types": list(config["layer_types"]),
        "sliding_window": config["sliding_window"],
    }


def mutated(config: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy with dotted-path changes applied; a value of DELETE removes the key."""
    out = copy.deepcopy(config)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = out
        for p in parents:
            node = node[p]
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return out


DELETE = object()
