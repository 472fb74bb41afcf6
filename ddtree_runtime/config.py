"""Model configs as dataclasses with derived fields, read from Hugging Face `config.json` files.

The target is a Qwen3 dense decoder; the drafter is z-lab's DFlash format, whose drafting settings
live under `dflash_config` with top-level keys as the fallback (as the reference reads them).
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drafter_config.bounds import LAYERS, out_of_range
from drafter_config.source import MAX_JSON_BYTES


class ConfigError(ValueError):
    """A checkpoint config the runtime cannot serve; the message names the file, field and fix."""


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object file, naming the file and line on failure. Checkpoint files come from
    the internet: only a regular file of at most MAX_JSON_BYTES is read (not a link to /dev/zero)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_JSON_BYTES:
            raise ConfigError(
                f"{path}: not a regular file of at most {MAX_JSON_BYTES} bytes (fix: point at the real file)"
            )
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: missing (fix: point at a checkpoint directory with a config.json)"
        ) from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    except (UnicodeDecodeError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else "not UTF-8"
        raise ConfigError(f"{path}: invalid JSON: {why} (fix: re-download the file)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a JSON {type(data).__name__}, not an object (fix: re-download the file)")
    return data


def _rope_theta(raw: dict[str, Any], path: Path) -> float:
    """rope_theta from the top level or transformers 5's `rope_parameters`; only plain RoPE is served."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ConfigError(
            f"{path}: rope type {kind!r} is not supported (fix: use a checkpoint with plain RoPE)"
        )
    return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))


def _require(raw: dict[str, Any], key: str, path: Path) -> Any:
    if key not in raw:
        raise ConfigError(f"{path}: missing field {key!r} (fix: add it; it is part of the HF config)")
    return raw[key]


def _size(raw: dict[str, Any], key: str, path: Path, default: int | None = None) -> int:
    """A size from the config (else ``default``; none: the field is required), within the range
    every checkpoint must keep (``drafter_config/bounds.py``), checked before anything is built."""
    value = raw.get(key)
    if value is None:
        value = _require(raw, key, path) if default is None else default
    why = out_of_range(key, value)
    if why is not None:
        raise ConfigError(f"{path}: {why} (fix: correct {key}; this checkpoint cannot be served)")
    return int(value)


@dataclass(frozen=True)
class Qwen3Config:
    """The dense Qwen3 target (also the shape of each DFlash draft layer)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()

    @property
    def q_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path) -> Qwen3Config:
        model_type = raw.get("model_type", "qwen3")
        if model_type != "qwen3":
            raise ConfigError(
                f"{path}: model_type {model_type!r} is not served by this runtime (fix: use a dense "
                "Qwen3 target, model_type 'qwen3')"
            )
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{path}: hidden_act {act!r} is not supported (fix: Qwen3 uses 'silu')")
        heads = _size(raw, "num_attention_heads", path)
        hidden = _size(raw, "hidden_size", path)
        kv_heads = _size(raw, "num_key_value_heads", path, heads)
        if heads % kv_heads:
            raise ConfigError(
                f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        eos = raw.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
        return cls(
            vocab_size=_size(raw, "vocab_size", path),
            hidden_size=hidden,
            intermediate_size=_size(raw, "intermediate_size", path),
            num_hidden_layers=_size(raw, "num_hidden_layers", path),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=_size(raw, "head_dim", path, max(1, hidden // heads)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(raw, path),
            max_position_embeddings=_size(raw, "max_position_embeddings", path, 32768),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_dir(cls, directory: str | Path) -> Qwen3Config:
        path = Path(directory) / "config.json"
        return cls.from_dict(read_json(path), path)


LAYER_KINDS = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class Qwen3_5Config:
    """The hybrid Qwen3.5/3.6 text model: Gated DeltaNet layers between gated full-attention ones.

    Read from a `Qwen3_5ForConditionalGeneration` config (settings under `text_config`) or a bare
    text config. Layer kinds come from `layer_types`, else every `full_attention_interval`-th layer
    is full attention (transformers' rule); only `partial_rotary_factor` of each head is rotated.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    partial_rotary_factor: float = 0.25
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path) -> Qwen3_5Config:
        text = raw.get("text_config") or raw
        model_type = text.get("model_type", raw.get("model_type"))
        if model_type not in ("qwen3_5", "qwen3_5_text"):
            raise ConfigError(f"{path}: model_type {model_type!r} is not a Qwen3.5 hybrid (fix: 'qwen3_5')")
        act = text.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{path}: hidden_act {act!r} is not supported (fix: Qwen3.5 uses 'silu')")
        # mrope sections only matter for images: a text position is the same on all three axes.
        params = text.get("rope_parameters") or {}
        layers = _size(text, "num_hidden_layers", path)
        types = text.get("layer_types")
        if types is None:
            interval = _size(text, "full_attention_interval", path, 4)
            types = [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
            ]
        if len(types) != layers or set(types) - set(LAYER_KINDS):
            raise ConfigError(
                f"{path}: layer_types must list {layers} entries of {' or '.join(LAYER_KINDS)} "
                f"(fix: one kind per layer), got {types}"
            )
        heads = _size(text, "num_attention_heads", path)
        kv_heads = _size(text, "num_key_value_heads", path, heads)
        lin_k = _size(text, "linear_num_key_heads", path, 16)
        lin_v = _size(text, "linear_num_value_heads", path, 32)
        for a, b, what in (
            (heads, kv_heads, "num_attention_heads/num_key_value_heads"),
            (lin_v, lin_k, "linear_num_value_heads/linear_num_key_heads"),
        ):
            if a % b:
                raise ConfigError(f"{path}: {what} = {a}/{b} is not a whole number (fix: check the config)")
        eos = text.get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
        return cls(
            vocab_size=_size(text, "vocab_size", path),
            hidden_size=_size(text, "hidden_size", path),
            intermediate_size=_size(text, "intermediate_size", path),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=_size(text, "head_dim", path, 256),
            layer_types=tuple(types),
            linear_num_key_heads=lin_k,
            linear_num_value_heads=lin_v,
            linear_key_head_dim=_size(text, "linear_key_head_dim", path, 128),
            linear_value_head_dim=_size(text, "linear_value_head_dim", path, 128),
            linear_conv_kernel_dim=_size(text, "linear_conv_kernel_dim", path, 4),
            partial_rotary_factor=float(
                params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
            ),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(text, path),
            max_position_embeddings=_size(text, "max_position_embeddings", path, 32768),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            attention_bias=bool(text.get("attention_bias", False)),
            eos_token_ids=eos_ids,
        )


def target_model_type(directory: str | Path) -> str:
    """`qwen3_5` for a hybrid target (top level or text_config), else the config's model_type."""
    path = Path(directory) / "config.json"
    raw = read_json(path)
    kinds = {raw.get("model_type"), (raw.get("text_config") or {}).get("model_type")}
    return "qwen3_5" if kinds & {"qwen3_5", "qwen3_5_text"} else str(raw.get("model_type", "qwen3"))


@dataclass(frozen=True)
class DFlashConfig:
    """A DFlash drafter: Qwen3-shaped draft layers fed by the target's hidden states."""

    layers: Qwen3Config
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    layer_types: tuple[str, ...]
    sliding_window: int | None
    is_causal: bool | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    @property
    def causal(self) -> tuple[bool, ...]:
        """Per layer: sliding layers are causal and full ones are not, unless `is_causal` is set."""
        if self.is_causal is not None:
            return (self.is_causal,) * len(self.layer_types)
        return tuple(t == "sliding_attention" for t in self.layer_types)

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Per layer: the sliding window, or None for full attention."""
        return tuple(self.sliding_window if t == "sliding_attention" else None for t in self.layer_types)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path) -> DFlashConfig:
        nested = raw.get("dflash_config") or {}

        def value(name: str, default: Any = None) -> Any:
            return nested.get(name, raw.get(name, default))

        layers = Qwen3Config.from_dict({**raw, "model_type": "qwen3"}, path)
        n_layers = layers.num_hidden_layers

        def size(name: str, default: int | None = None) -> int:
            return _size({name: value(name)}, name, path, default)

        num_target = 0 if value("num_target_layers") is None else size("num_target_layers")
        ids = value("target_layer_ids")
        if ids is None:
            if not num_target:
                raise ConfigError(
                    f"{path}: neither dflash_config.target_layer_ids nor num_target_layers is set "
                    "(fix: add dflash_config.target_layer_ids)"
                )
            ids = default_target_layer_ids(num_target, n_layers)
        mask = value("mask_token_id")
        if mask is None:
            raise ConfigError(
                f"{path}: dflash_config.mask_token_id is missing (fix: add the target's mask id)"
            )
        types = tuple(raw.get("layer_types") or ("full_attention",) * n_layers)
        if len(types) != n_layers:
            raise ConfigError(
                f"{path}: layer_types has {len(types)} entries for {n_layers} layers (fix: one per layer)"
            )
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ConfigError(
                f"{path}: unknown layer_types {unknown} (fix: full_attention or sliding_attention)"
            )
        # transformers (and so the reference drafter) drops the window unless use_sliding_window is
        # set; sliding layers without one are then plain causal layers.
        sliding = raw.get("use_sliding_window") and raw.get("sliding_window") is not None
        window = _size(raw, "sliding_window", path) if sliding else None
        block = size("block_size", 16)
        if block < 2:
            raise ConfigError(f"{path}: block_size {block} leaves no draft positions (fix: block_size >= 2)")
        causal = raw.get("is_causal")
        softcap = value("final_logit_softcapping")
        return cls(
            layers=layers,
            block_size=block,
            mask_token_id=_token_id(mask, layers.vocab_size, path),
            target_layer_ids=tuple(_token_id(i, num_target or LAYERS, path, "target_layer_ids") for i in ids),
            num_target_layers=num_target,
            layer_types=types,
            sliding_window=window,
            is_causal=None if causal is None else bool(causal),
            input_embedding_scale=float(value("input_embedding_scale", 1.0)),
            output_multiplier=float(value("output_multiplier", 1.0)),
            final_logit_softcapping=float(softcap) if softcap else None,
        )

    @classmethod
    def from_dir(cls, directory: str | Path) -> DFlashConfig:
        path = Path(directory) / "config.json"
        return cls.from_dict(read_json(path), path)


def _token_id(value: Any, limit: int, path: Path, key: str = "dflash_config.mask_token_id") -> int:
    """An index below ``limit`` (a token id, a layer id)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise ConfigError(
            f"{path}: {key} holds {value!r}, not a whole number in 0..{limit - 1} (fix: correct it)"
        )
    return value


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default spread of captured layers: from layer 1 to L - 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def check_pair(target_dir: Path, drafter_dir: Path) -> None:
    """Refuse a drafter that does not fit its target, with the `specops config lint` findings.

    The lint (drafter_config) is the one set of rules; running it here means a bad pair fails at
    load time with a DFL code and a fix, never deep inside a matmul.
    """
    from drafter_config.findings import format_findings
    from drafter_config.lint import lint_pair
    from drafter_config.source import LintInputError

    try:
        report = lint_pair(str(drafter_dir), str(target_dir))
    except LintInputError as e:
        raise ConfigError(str(e)) from None
    if report.errors:
        raise ConfigError(
            f"drafter {drafter_dir} does not fit target {target_dir}:\n{format_findings(report)}"
        )
