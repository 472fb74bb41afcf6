"""A tiny, real hybrid pair: a Qwen3.5-layout target (Gated DeltaNet + full attention) and a DFlash
drafter with sliding and full layers fitted to it on the CPU.

The target is written as Qwen's checkpoints are: a `Qwen3_5ForConditionalGeneration` config with the
text settings under `text_config`, the language model's weights under `model.language_model.`,
sharded through an index, with stand-in vision (`model.visual.*`) and `mtp.*` tensors that the text
runtime must skip. The drafter is z-lab's format with the dense target's layer shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ddtree_runtime.config import Qwen3_5Config
from ddtree_runtime.models.qwen3_5 import DeltaNetLayer, Qwen3_5
from ddtree_runtime.tiny import (
    SPECIALS,
    TinyPair,
    _finish_pair,
    _init_target,
    _start_pair,
    _target_config,
    _write_fitted_drafter,
)


def _hybrid_config(vocab: int, hidden: int, layers: int) -> dict[str, object]:
    text = {
        "model_type": "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": hidden // 4,
        "linear_value_head_dim": hidden // 4,
        "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "max_position_embeddings": 4096,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": SPECIALS.index("<|endoftext|>"),
        "eos_token_id": [SPECIALS.index("<|im_end|>"), SPECIALS.index("<|endoftext|>")],
    }
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 16},
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _write_target(model: Qwen3_5, directory: Path) -> None:
    """Two shards through an index, in the real names, with stand-in vision and MTP tensors."""
    lm = {f"model.language_model.{k}": v.contiguous() for k, v in model.state_dict().items()}
    lm["lm_head.weight"] = lm.pop("model.language_model.lm_head.weight")
    extra = {
        "model.visual.patch_embed.proj.weight": torch.zeros(16, 3, 2, 4, 4),
        "mtp.fc.weight": torch.zeros(model.config.hidden_size, 2 * model.config.hidden_size),
    }
    names = sorted(lm)
    shards = {
        "model-00001-of-00002.safetensors": {**{k: lm[k] for k in names[::2]}, **extra},
        "model-00002-of-00002.safetensors": {k: lm[k] for k in names[1::2]},
    }
    weight_map = {}
    for file, tensors in shards.items():
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_tiny_hybrid_pair(
    directory: str | Path,
    *,
    n_words: int = 64,
    hidden: int = 64,
    target_layers: int = 4,
    drafter_layers: int = 2,
    block_size: int = 6,
    fit_steps: int = 240,
    logit_scale: float = 4.0,
    state_gain: float = 1.5,
    seed: int = 0,
) -> TinyPair:
    """Write `target/` (Qwen3.5 layout) and `drafter/` (sliding + full layers) under `directory`."""
    pair, gen = _start_pair(directory, seed)
    if gen is None:
        return pair
    vocab = len(SPECIALS) + n_words

    target_raw = _hybrid_config(vocab, hidden, target_layers)
    target = Qwen3_5(Qwen3_5Config.from_dict(target_raw, pair.target / "config.json"))
    _init_target(target, gen, logit_scale)
    _slow_loud_deltanet(target, gen, state_gain)
    dense = _target_config(vocab, hidden, target_layers)  # the drafter's own layer shapes
    types = ["sliding_attention"] * (drafter_layers - 1) + ["full_attention"]
    _write_fitted_drafter(
        target, dense, pair.drafter, drafter_layers, types, block_size, fit_steps, seed, n_words
    )

    _write_target(target, pair.target)
    _finish_pair(pair, target_raw, target_raw["text_config"]["eos_token_id"], n_words)
    return pair


def _slow_loud_deltanet(target: Qwen3_5, gen: torch.Generator, state_gain: float) -> None:
    """Slow decays (exp(A_log) ~ 0.05..0.4) and a loud DeltaNet output: the greedy text must depend
    on the recurrent state, or state bugs would not change any token."""
    with torch.no_grad():
        for layer in target.layers:
            if isinstance(layer, DeltaNetLayer):
                gdn = layer.linear_attn
                gdn.A_log.uniform_(-3.0, -1.0, generator=gen)
                gdn.dt_bias.uniform_(-1.0, 0.0, generator=gen)
                gdn.out_proj.weight.mul_(state_gain)
