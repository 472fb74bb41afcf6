"""A new DFlash drafter for a target, and its export in z-lab's checkpoint format.

The draft layers have the target's layer shape, so they start as copies of the target's last
layers (a warm start that trains faster than random init); `fc` starts random. The config is the
target's with z-lab's DFlash keys, so `specops config lint` and the runtime's loader accept it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ddtree_runtime.config import ConfigError, DFlashConfig, default_target_layer_ids, read_json
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.qwen3 import Qwen3

MASK_NAMES = ("<|mask|>", "<mask>", "[MASK]")


def find_mask_token(target_dir: Path) -> int:
    """The tokenizer's mask token id, by name."""
    path = target_dir / "tokenizer.json"
    if path.exists():
        vocab = {t["content"]: t["id"] for t in json.loads(path.read_text()).get("added_tokens", [])}
        for name in MASK_NAMES:
            if name in vocab:
                return vocab[name]
    raise ConfigError(
        f"{path}: no mask token ({', '.join(MASK_NAMES)}) (fix: pass --mask-token-id with a reserved id)"
    )


def drafter_config(
    target_dir: Path, layers: int, block_size: int, mask_token_id: int, layer_ids: list[int] | None = None
) -> dict[str, object]:
    """z-lab DFlash config.json for `target_dir`'s model."""
    raw = read_json(target_dir / "config.json")
    n_target = int(raw["num_hidden_layers"])
    ids = layer_ids or default_target_layer_ids(n_target, layers)
    cfg = {
        k: v for k, v in raw.items() if k not in ("architectures", "auto_map", "eos_token_id", "bos_token_id")
    }
    cfg.update(
        {
            "architectures": ["DFlashDraftModel"],
            "num_hidden_layers": layers,
            "num_target_layers": n_target,
            "block_size": block_size,
            "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": ids},
            "layer_types": ["full_attention"] * layers,
            "tie_word_embeddings": False,
        }
    )
    return cfg


def new_drafter(target: Qwen3, raw: dict[str, object], path: Path, seed: int = 0) -> DFlashDrafter:
    """A drafter on the target's device, fp32, its layers copied from the target's last ones."""
    cfg = DFlashConfig.from_dict(raw, path / "config.json")
    torch.manual_seed(seed)
    device = target.embed_tokens.weight.device
    drafter = DFlashDrafter(cfg).to(device=device, dtype=torch.float32)
    n = cfg.layers.num_hidden_layers
    with torch.no_grad():
        for mine, theirs in zip(drafter.layers, target.layers[-n:], strict=False):
            mine.load_state_dict({k: v.float() for k, v in theirs.hf_state_dict().items()})
        drafter.norm.weight.copy_(target.norm.weight.float())
        torch.nn.init.normal_(drafter.fc.weight, std=drafter.fc.weight.shape[1] ** -0.5)
    return drafter


def save_drafter(drafter: DFlashDrafter, raw: dict[str, object], out: Path, dtype: torch.dtype) -> None:
    """`config.json` + `model.safetensors` (z-lab names) in `dtype`; written whole, then renamed."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = {**raw, "torch_dtype": str(dtype).removeprefix("torch.")}
    state = {k: v.detach().to(dtype).contiguous() for k, v in drafter.state_dict().items()}
    tmp = out / ".model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
