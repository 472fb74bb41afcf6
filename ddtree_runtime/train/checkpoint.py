"""The drafter a run trains: a new one laid out for the target, or an existing one (`--init-from`),
and its export in z-lab's checkpoint format.

A new drafter's config is built from the target's parsed config (`Qwen3Config` or `Qwen3_5Config`,
as the loader read it). Its layout defaults to what z-lab ships for the target's kind: for a hybrid
Qwen3.5/3.6 target the Qwen3.6-27B drafter's (5 layers, block 16, `[S, S, S, S, F]` with a 2048
window, 32/8 heads of 128); for a dense Qwen3 target a small one-layer drafter with the target's
own attention. The draft layers start from the target's last layers (read from its checkpoint
files, so a fused inference layout never matters): whole layers when the attention shapes agree,
else the MLP and norms only (a hybrid's layers are not dense attention layers); `fc` starts random.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ddtree_runtime.config import (
    ConfigError,
    DFlashConfig,
    Qwen3_5Config,
    Qwen3Config,
    default_target_layer_ids,
    read_json,
)
from ddtree_runtime.loader import read_state_dict
from ddtree_runtime.models.dflash import DFlashDrafter

MASK_NAMES = ("<|mask|>", "<mask>", "[MASK]")
TargetConfig = Qwen3Config | Qwen3_5Config


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


@dataclass(frozen=True)
class Layout:
    """A new drafter's shape; None takes the default for the target's kind."""

    layers: int | None = None
    block_size: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    sliding_window: int | None = None  # 0: every layer full attention
    target_layer_ids: list[int] | None = None

    def resolve(self, target: TargetConfig) -> Layout:
        """Every field set: z-lab's Qwen3.6 drafter layout for a hybrid target, a one-layer drafter
        with the target's attention for a dense one."""
        hybrid = isinstance(target, Qwen3_5Config)
        layers = self.layers or (5 if hybrid else 1)

        def pick(value: int | None, hybrid_default: int, dense_default: int) -> int:
            return value if value is not None else hybrid_default if hybrid else dense_default

        ids = self.target_layer_ids or default_target_layer_ids(target.num_hidden_layers, layers)
        if sorted(set(ids)) != list(ids) or not 0 <= ids[0] <= ids[-1] < target.num_hidden_layers:
            raise ConfigError(
                f"target layer ids {ids} are not distinct, increasing layers of the {target.num_hidden_layers}"
                f"-layer target (fix: --target-layer-ids with {layers} such layers, or fewer --draft-layers)"
            )
        return Layout(
            layers=layers,
            block_size=pick(self.block_size, 16, 8),
            heads=pick(self.heads, 32, target.num_attention_heads),
            kv_heads=pick(self.kv_heads, 8, target.num_key_value_heads),
            head_dim=pick(self.head_dim, 128, target.head_dim),
            sliding_window=pick(self.sliding_window, 2048, 0),
            target_layer_ids=list(ids),
        )


def drafter_config(target: TargetConfig, layout: Layout, mask_token_id: int) -> dict[str, Any]:
    """z-lab DFlash config.json for a drafter of `layout` (resolved) over `target`."""
    n = layout.layers
    assert n is not None and layout.target_layer_ids is not None
    window = layout.sliding_window or 0
    types = ["sliding_attention"] * (n - 1) + ["full_attention"] if window else ["full_attention"] * n
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "intermediate_size": target.intermediate_size,
        "num_hidden_layers": n,
        "num_attention_heads": layout.heads,
        "num_key_value_heads": layout.kv_heads,
        "head_dim": layout.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta,
        "max_position_embeddings": target.max_position_embeddings,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "num_target_layers": target.num_hidden_layers,
        "block_size": layout.block_size,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(layout.target_layer_ids)},
        "layer_types": types,
    }
    if window:
        cfg.update(use_sliding_window=True, sliding_window=window)
    return cfg


def new_drafter(
    target: TargetConfig, target_dir: Path, raw: dict[str, Any], device: torch.device, seed: int = 0
) -> DFlashDrafter:
    """A drafter for `raw` on `device` in fp32, warm-started from the target's last layers."""
    cfg = DFlashConfig.from_dict(raw, Path("<new drafter>"))
    torch.manual_seed(seed)
    with torch.device(device):  # a 27B-class drafter initialises in a blink on the GPU, not the CPU
        drafter = DFlashDrafter(cfg).float()
    state = _warm_start(target, target_dir, cfg, device)
    missing = set(drafter.load_state_dict(state, strict=False).missing_keys)
    assert not set(state) & missing
    with torch.no_grad():
        torch.nn.init.normal_(drafter.fc.weight, std=drafter.fc.weight.shape[1] ** -0.5)
    return drafter


def _warm_start(
    target: TargetConfig, target_dir: Path, cfg: DFlashConfig, device: torch.device
) -> dict[str, torch.Tensor]:
    """The drafter's weights that the target's last layers can give, under the drafter's names."""
    n, lc = cfg.layers.num_hidden_layers, cfg.layers
    first = target.num_hidden_layers - n
    hybrid = isinstance(target, Qwen3_5Config)
    same_attention = not hybrid and (lc.num_attention_heads, lc.num_key_value_heads, lc.head_dim) == (
        target.num_attention_heads,
        target.num_key_value_heads,
        target.head_dim,
    )
    keep = r"(self_attn\..*|mlp\..*|input_layernorm\.weight|post_attention_layernorm\.weight)"
    if not same_attention:
        keep = r"(mlp\..*|input_layernorm\.weight|post_attention_layernorm\.weight)"
    layer = re.compile(rf"layers\.(\d+)\.{keep}")

    def rename(key: str) -> str | None:
        key = key.removeprefix("model.").removeprefix("language_model.")
        if key == "norm.weight":
            return key
        m = layer.fullmatch(key)
        if m is None or int(m.group(1)) < first:
            return None
        return f"layers.{int(m.group(1)) - first}.{m.group(2)}"

    state = read_state_dict(target_dir, rename, device, torch.float32)
    if hybrid:  # Qwen3.5 norms store (weight - 1); the drafter's store the weight
        state = {k: v + 1 if k.endswith("norm.weight") else v for k, v in state.items()}
    return state


def init_from(directory: Path, device: torch.device) -> tuple[dict[str, Any], DFlashDrafter]:
    """An existing drafter to fine-tune: its config.json as it is, its weights in fp32, unfused."""
    raw = read_json(directory / "config.json")
    with torch.device("meta"):  # no initialisation that the weights overwrite
        drafter = DFlashDrafter(DFlashConfig.from_dict(raw, directory / "config.json"))
    state = read_state_dict(directory, lambda k: k.removeprefix("model."), device, torch.float32)
    missing, unexpected = drafter.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ConfigError(
            f"{directory}: weights do not match its config.json: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]} (fix: point --init-from at a whole DFlash checkpoint)"
        )
    return raw, drafter


def save_drafter(drafter: DFlashDrafter, raw: dict[str, Any], out: Path, dtype: torch.dtype) -> None:
    """`config.json` + `model.safetensors` (z-lab names) in `dtype`; written whole, then renamed."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = {**raw, "torch_dtype": str(dtype).removeprefix("torch.")}
    state = {k: v.detach().to(dtype).contiguous() for k, v in drafter.state_dict().items()}
    tmp = out / ".model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
