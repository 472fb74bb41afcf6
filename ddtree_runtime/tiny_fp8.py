"""The tiny pairs (`tiny.py`, `tiny_hybrid.py`) with their targets quantized to FP8, in both formats.

Tests need FP8 targets without a download. The target's projections are quantized the way the two
published formats store them (`drafter_config.quantization`), and everything a real export leaves in
bf16 stays as it was: embeddings, LM head, norms, and the hybrid's DeltaNet `in_proj_a`/`in_proj_b`,
conv, decay and norm (their stand-in vision and MTP tensors too). Block scales are written in fp32
for the dense target and in bf16 for the hybrid, as Qwen3 and Qwen3.5/3.6 releases store them. The
drafter is copied unchanged: it stays in its own dtype and reads the target's bf16 embeddings and head.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ddtree_runtime.fp8 import quantize_weight
from ddtree_runtime.loader import weight_files
from ddtree_runtime.tiny import TinyPair

# the projections FP8 exports quantize (in either layout, under any prefix)
QUANTIZED = re.compile(
    r"(^|\.)layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|"
    r"linear_attn\.(in_proj_qkv|in_proj_z|out_proj))\.weight$"
)
LEFT_IN_BF16 = ("lm_head", "in_proj_a", "in_proj_b")


def quantization_config(fmt: str, block: tuple[int, int]) -> dict[str, object]:
    """The `quantization_config` a Qwen block-FP8 (`block`) or llm-compressor FP8_DYNAMIC
    (`channel`) export writes."""
    if fmt == "block":
        return {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(block),
            "modules_to_not_convert": list(LEFT_IN_BF16),
        }
    args = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "block_structure": None}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {**args, "strategy": "channel", "dynamic": False, "observer": "minmax"},
                "input_activations": {**args, "strategy": "token", "dynamic": True, "observer": None},
            }
        },
        "ignore": ["lm_head", "re:.*linear_attn\\.in_proj_[ab]$", "re:.*visual.*"],
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def write_fp8_pair(
    pair: TinyPair, directory: str | Path, fmt: str = "block", block: tuple[int, int] = (128, 128)
) -> TinyPair:
    """`pair` with its target quantized (`fmt` "block": Qwen's `weight_scale_inv` per `block`;
    "channel": compressed-tensors' per-channel `weight_scale`), under `directory`; reused when done."""
    root = Path(directory)
    out = TinyPair(root / "target", root / "drafter")
    if (root / "DONE").exists():
        return out
    if fmt not in ("block", "channel"):
        raise ValueError(f"fmt must be 'block' or 'channel', got {fmt!r}")
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(pair.drafter, out.drafter)
    shutil.copytree(pair.target, out.target, ignore=shutil.ignore_patterns("*.safetensors*"))
    config = json.loads((pair.target / "config.json").read_text())
    hybrid = "text_config" in config
    tensors = {}
    for file in weight_files(pair.target):
        tensors.update(load_file(str(file)))
    for name in sorted(n for n in tensors if QUANTIZED.search(n)):
        weight = tensors.pop(name)
        stem = name.removesuffix(".weight")
        if fmt == "block":
            tensors[name], scale = quantize_weight(weight, block)
            tensors[f"{stem}.weight_scale_inv"] = scale.to(torch.bfloat16 if hybrid else torch.float32)
        else:
            tensors[name], tensors[f"{stem}.weight_scale"] = quantize_weight(weight, (1, weight.shape[1]))
    save_file(tensors, str(out.target / "model.safetensors"), metadata={"format": "pt"})
    config["quantization_config"] = quantization_config(fmt, block)
    (out.target / "config.json").write_text(json.dumps(config, indent=2))
    (root / "DONE").write_text("ok\n")
    return out
