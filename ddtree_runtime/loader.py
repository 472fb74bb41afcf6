"""Load Hugging Face checkpoint directories into our modules.

Weights are memory-mapped with `safetensors.safe_open` (one file, or the shards an
`model.safetensors.index.json` names) and cast to the requested dtype as they move to the device;
modules are built on the meta device first so that no random initialisation is ever paid for.
A file that lies (a header whose shapes or dtypes do not fit its bytes, a tensor of another shape
than the config says, an index that is not one) is a ConfigError naming the file: one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ddtree_runtime.config import (
    ConfigError,
    DFlashConfig,
    Qwen3_5Config,
    Qwen3Config,
    check_pair,
    read_json,
    target_model_type,
)
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.qwen3 import Qwen3
from ddtree_runtime.models.qwen3_5 import Qwen3_5
from ddtree_runtime.models.target import Target
from ddtree_runtime.quant import fp8_scheme, install_fp8, stored_dtype


def default_device() -> str:
    """The device when none is asked for: CUDA when torch sees one, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_threads() -> int:
    """Torch CPU threads when none are asked for: every core this process may run on but one, which
    the HTTP loop keeps (the server's rule, which the CLI and the benchmarks follow)."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def default_dtype(device: str) -> str:
    """The dtype weights are loaded in when none is asked for: bfloat16 on CUDA, and on a CPU with
    native bf16 dot products (AVX512-BF16 or AMX), where a speculative round's wide matmuls (a verify
    pass of 9-65 rows) run about twice as fast as in float32; elsewhere float32, because emulated
    bf16 is several times slower than float32 (benchmarks/RESULTS.md, the demo's dtype rows)."""
    if device == "cuda":
        return "bfloat16"
    caps = torch.cpu.get_capabilities()
    return "bfloat16" if caps.get("avx512_bf16") or caps.get("amx_bf16") else "float32"


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the index's shards, else `*.safetensors`."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ConfigError(f"{index}: no weight_map of tensor names to files (fix: re-download it)")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (directory / s).exists()]
        if missing:
            raise ConfigError(f"{index}: shards {missing} are missing (fix: download the whole checkpoint)")
        return [directory / s for s in shards]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{directory}: no *.safetensors weights (fix: point at a checkpoint directory)")
    return files


def read_state_dict(
    directory: Path,
    rename: Callable[[str], str | None],
    device: torch.device,
    dtype: torch.dtype,
    keep: Callable[[str, torch.dtype], torch.dtype | None] = lambda name, stored: None,
) -> dict[str, torch.Tensor]:
    """Every tensor `rename` keeps (None drops it), memory-mapped, then cast on the device to `dtype`,
    or to what `keep(name, stored dtype)` says (FP8 weights and their scales: `quant.stored_dtype`)."""
    state = {}
    for file in weight_files(directory):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    name = rename(key)
                    if name is not None:
                        tensor = f.get_tensor(key)
                        state[name] = tensor.to(device=device, dtype=keep(name, tensor.dtype) or dtype)
        except SafetensorError as e:
            raise ConfigError(
                f"{file}: not a readable safetensors file ({' '.join(str(e).split())[:200]}) "
                "(fix: re-download or re-export the checkpoint)"
            ) from None
    return state


def _load_into(module: nn.Module, state: dict[str, torch.Tensor], directory: Path) -> None:
    try:
        missing, unexpected = module.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as e:  # a tensor of another shape than the config implies
        detail = next((line.strip() for line in str(e).splitlines() if "size mismatch" in line), str(e))
        raise ConfigError(
            f"{directory}: weights do not match the config: {detail[:300]} (fix: check config.json "
            "against the checkpoint)"
        ) from None
    if missing or unexpected:
        raise ConfigError(
            f"{directory}: weights do not match the config: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]} (fix: check config.json against the checkpoint)"
        )


def load_target(directory: str | Path, device: torch.device, dtype: torch.dtype) -> Target:
    """A Qwen3 or Qwen3.5 target; HF names lose their `model.` (or `model.language_model.`) prefix,
    vision and `mtp.*` tensors are skipped, a tied head shares the embedding, FP8 linears become
    `quant.Fp8Linear`, and the QKV and gate/up projections are fused for inference."""
    directory = Path(directory)
    path = directory / "config.json"
    scheme = fp8_scheme(read_json(path), path)
    if target_model_type(directory) == "qwen3_5":
        cfg: Qwen3Config | Qwen3_5Config = Qwen3_5Config.from_dict(read_json(path), path)
        with torch.device("meta"):
            model: Target = Qwen3_5(cfg)
    else:
        cfg = Qwen3Config.from_dir(directory)
        with torch.device("meta"):
            model = Qwen3(cfg)

    def rename(key: str) -> str | None:
        if key.startswith(("mtp.", "model.visual.", "visual.")):
            return None
        return key.removeprefix("model.").removeprefix("language_model.")

    state = read_state_dict(directory, rename, device, dtype, stored_dtype)
    install_fp8(model, state, scheme, directory)
    if (cfg.tie_word_embeddings or "lm_head.weight" not in state) and "embed_tokens.weight" in state:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    _load_into(model, state, directory)
    model.fuse()
    return model.eval()


def load_drafter(directory: str | Path, device: torch.device, dtype: torch.dtype) -> DFlashDrafter:
    """A DFlash drafter (z-lab names: `layers.*`, `fc`, `hidden_norm`, `norm`)."""
    directory = Path(directory)
    cfg = DFlashConfig.from_dir(directory)
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    state = read_state_dict(directory, lambda k: k.removeprefix("model."), device, dtype)
    _load_into(model, state, directory)
    model.fuse()
    return model.eval()


def load_pair(
    target_dir: str | Path, drafter_dir: str | Path | None, device: torch.device, dtype: torch.dtype
) -> tuple[Target, DFlashDrafter | None]:
    """Target and drafter, refusing a drafter that does not fit before any weight is read."""
    if drafter_dir is not None:
        check_pair(Path(target_dir), Path(drafter_dir))
    target = load_target(target_dir, device, dtype)
    drafter = None if drafter_dir is None else load_drafter(drafter_dir, device, dtype)
    return target, drafter
