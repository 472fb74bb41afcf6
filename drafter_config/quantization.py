"""A target's `quantization_config`: the two FP8 formats the DDTree runtime serves, or why not.

Why here, with no torch: the runtime's loader refuses what it cannot run (a ConfigError naming the
field) and the lint reports the same thing as a finding (`fab lint-drafter` on a controller without
torch), so both read the config through this one parser.

The two formats, as published checkpoints write them:

- Qwen's block-wise FP8 (DeepSeek-V3's scheme): `{quant_method: fp8, fmt: e4m3, activation_scheme:
  dynamic, weight_block_size: [128, 128]}`, optionally `modules_to_not_convert`. Each quantized
  linear stores `weight` (float8_e4m3fn [N, K]) and `weight_scale_inv` ([N/128, K/128], one scale per
  block: weight = fp8 x scale); activations are quantized per token and per 128 input columns.
- compressed-tensors FP8 (llm-compressor's FP8_DYNAMIC): `{quant_method: compressed-tensors, format:
  float-quantized, config_groups: {group_0: {weights: {num_bits: 8, type: float, strategy: channel,
  symmetric: true, dynamic: false}, input_activations: {num_bits: 8, type: float, strategy: token,
  dynamic: true}}}, ignore: [lm_head, ...]}`. Each quantized linear stores `weight` (float8_e4m3fn)
  and `weight_scale` ([N, 1], one per output channel); activations are quantized per token.

Which modules are quantized is read from the weights themselves (a float8 `weight` with its scale);
the lists of unconverted modules are the exporter's bookkeeping of the same fact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FP8_BLOCK = "fp8"
COMPRESSED_TENSORS = "compressed-tensors"


@dataclass(frozen=True)
class Fp8Scheme:
    """How one checkpoint's FP8 linears are stored: the scale tensor's name and its block shape.

    `block` is (rows, columns) of weight per scale and the activation group is `block[1]` columns;
    None means per-channel weights with per-token activations (one scale per row, one group per row).
    """

    method: str
    scale_name: str  # the tensor beside each quantized `weight`
    block: tuple[int, int] | None


class QuantConfigError(ValueError):
    """A quantization_config the runtime cannot serve: the JSON path of the field, and the fix."""

    def __init__(self, path: tuple[str | int, ...], message: str, hint: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message
        self.hint = hint

    @property
    def field(self) -> str:
        return ".".join(str(p) for p in self.path)


def read_fp8_scheme(config: dict[str, Any]) -> Fp8Scheme | None:
    """The FP8 scheme of a target's config.json (top level or `text_config`); None when unquantized.

    Raises QuantConfigError for any other quantization: another method, e5m2, static activation
    scales, a per-tensor or asymmetric weight scale, an FP8 KV cache.
    """
    for prefix in ((), ("text_config",)):
        section = config
        for key in prefix:
            section = section.get(key) if isinstance(section, dict) else None
        if isinstance(section, dict) and section.get("quantization_config") is not None:
            return _scheme((*prefix, "quantization_config"), section["quantization_config"])
    return None


def _scheme(path: tuple[str, ...], q: Any) -> Fp8Scheme:
    if not isinstance(q, dict):
        raise QuantConfigError(path, "is not a mapping", "remove it or restore the exporter's mapping")
    method = q.get("quant_method")
    if method == FP8_BLOCK:
        return _block(path, q)
    if method == COMPRESSED_TENSORS:
        return _compressed(path, q)
    raise QuantConfigError(
        (*path, "quant_method"),
        f"quant_method {method!r} is not served by the DDTree runtime",
        "use the bf16 checkpoint, Qwen's block-wise FP8 (quant_method 'fp8') or a compressed-tensors "
        "FP8_DYNAMIC export, or serve it with vLLM/SGLang",
    )


def _require(path: tuple[str | int, ...], value: Any, want: Any, hint: str) -> None:
    if value != want:
        raise QuantConfigError(path, f"{path[-1]} is {value!r}, the runtime needs {want!r}", hint)


def _block(path: tuple[str, ...], q: dict[str, Any]) -> Fp8Scheme:
    _require((*path, "fmt"), q.get("fmt", "e4m3"), "e4m3", "only e4m3 weights are served (e5m2 is not)")
    _require(
        (*path, "activation_scheme"),
        q.get("activation_scheme", "dynamic"),
        "dynamic",
        "static activation scales are not served; use a checkpoint with dynamic activations",
    )
    size = q.get("weight_block_size")
    ok = isinstance(size, list) and len(size) == 2 and all(isinstance(s, int) and s > 0 for s in size)
    if not ok or size[1] not in (32, 64, 128, 256):
        raise QuantConfigError(
            (*path, "weight_block_size"),
            f"weight_block_size is {size!r}, the runtime needs [rows, columns] with columns 32, 64, "
            "128 or 256 (per-tensor FP8 has no block size)",
            "use a block-wise FP8 checkpoint such as Qwen's ([128, 128])",
        )
    return Fp8Scheme(FP8_BLOCK, "weight_scale_inv", (size[0], size[1]))


WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
ACTIVATIONS = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}


def _compressed(path: tuple[str, ...], q: dict[str, Any]) -> Fp8Scheme:
    hint = "export with llm-compressor's FP8_DYNAMIC scheme, or serve this one with vLLM"
    _require((*path, "format"), q.get("format"), "float-quantized", hint)
    status = q.get("quantization_status", "compressed")
    _require((*path, "quantization_status"), status, "compressed", "save the model compressed")
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if q.get(key):
            raise QuantConfigError(
                (*path, key), f"{key} is set; the runtime serves plain FP8 linears only", hint
            )
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise QuantConfigError((*path, "config_groups"), "config_groups is missing or empty", hint)
    for name, group in groups.items():
        where = (*path, "config_groups", name)
        if not isinstance(group, dict):
            raise QuantConfigError(where, f"config group {name!r} is not a mapping", hint)
        for key, want in (("weights", WEIGHTS), ("input_activations", ACTIVATIONS)):
            args = group.get(key)
            if not isinstance(args, dict):
                raise QuantConfigError((*where, key), f"{key} is {args!r}, the runtime needs {want}", hint)
            for field, value in want.items():
                _require((*where, key, field), args.get(field), value, hint)
    return Fp8Scheme(COMPRESSED_TENSORS, "weight_scale", None)
