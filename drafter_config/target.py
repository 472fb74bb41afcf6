"""The target model's config, normalized across Qwen3 (flat) and Qwen3.5/3.6 (nested) layouts.

Why: rules compare the drafter with "the target's layer count / hidden size / rope", and those sit
in different places: ``qwen3`` keeps them at the top level, ``qwen3_5`` under ``text_config`` with
``layer_types`` derived from ``full_attention_interval`` when absent (as transformers does). Rules
see one TargetConfig and can still cite the exact file:line a value came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specops_files.jsonpos import JsonDocument, JsonPath

# keys of a rope_scaling / rope_parameters mapping that do not change the drafter's rotary maths
_ROPE_IGNORED = {"rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved"}


def rope_settings(config: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """(rope_theta, scaling) from either the classic keys or transformers 5's rope_parameters."""
    params = config.get("rope_parameters")
    params = params if isinstance(params, dict) else {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    scaling = config.get("rope_scaling")
    if not isinstance(scaling, dict):
        scaling = params
    scaling = {k: v for k, v in scaling.items() if k not in _ROPE_IGNORED}
    kind = scaling.pop("rope_type", scaling.pop("type", None))
    if kind in (None, "default") and not scaling:
        return theta, None
    return theta, {"rope_type": kind, **scaling}


def _token_ids(value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


@dataclass
class TargetConfig:
    """What the drafter must agree with, plus where each value was read."""

    file: str
    doc: JsonDocument
    prefix: JsonPath  # () for qwen3, ("text_config",) for qwen3_5
    model_type: str | None
    num_layers: int | None
    hidden_size: int | None
    vocab_size: int | None
    rms_norm_eps: float | None
    max_position_embeddings: int | None
    rope_theta: float | None
    rope_scaling: dict[str, Any] | None
    layer_types: list[str] | None
    layer_types_derived: bool
    special_ids: dict[int, str]  # token id -> role from the config (bos/eos/pad)

    def where(self, key: str) -> str:
        """``file:line`` of a text-config key, for messages that cite the target."""
        path = (*self.prefix, key)
        line, _ = self.doc.locate(path if path in self.doc.spans else self.prefix)
        return f"{self.file}:{line}"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def load_target(file: str, doc: JsonDocument) -> TargetConfig:
    """Normalize a parsed target config; missing values stay None and the rules skip them."""
    top = doc.data if isinstance(doc.data, dict) else {}
    text = top.get("text_config")
    prefix: JsonPath = ("text_config",) if isinstance(text, dict) else ()
    conf = text if isinstance(text, dict) else top
    num_layers = _int(conf.get("num_hidden_layers"))
    layer_types = conf.get("layer_types")
    derived = False
    if not isinstance(layer_types, list) and prefix and num_layers is not None:
        interval = _int(conf.get("full_attention_interval")) or 4
        layer_types = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)
        ]
        derived = True
    theta, scaling = rope_settings(conf)
    special: dict[int, str] = {}
    for source in (top, conf):
        for role in ("bos_token_id", "eos_token_id", "pad_token_id"):
            for token in _token_ids(source.get(role)):
                special.setdefault(token, role.removesuffix("_id"))
    return TargetConfig(
        file=file,
        doc=doc,
        prefix=prefix,
        model_type=conf.get("model_type", top.get("model_type")),
        num_layers=num_layers,
        hidden_size=_int(conf.get("hidden_size")),
        vocab_size=_int(conf.get("vocab_size", top.get("vocab_size"))),
        rms_norm_eps=_number(conf.get("rms_norm_eps")),
        max_position_embeddings=_int(conf.get("max_position_embeddings")),
        rope_theta=_number(theta),
        rope_scaling=scaling,
        layer_types=layer_types if isinstance(layer_types, list) else None,
        layer_types_derived=derived,
        special_ids=special,
    )
