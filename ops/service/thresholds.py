"""The acceptance gate's settings as the service step takes them (``acceptance``; the gate itself
is ``ops/service/acceptance.py``), type-checked with the step's arguments: a wrong ``min_tau``
fails the step with one line naming it, before anything on the host changes."""

from __future__ import annotations

from typing import Any

DEFAULTS = {"enabled": True, "prompts": "math", "requests": 4, "max_tokens": 64, "timeout": 600.0}


def acceptance_arg(value: Any) -> dict[str, Any]:
    """The gate's settings: {min_tau, spec, prompts, requests, max_tokens, timeout, enabled};
    an empty mapping switches the gate off (the bench's internal restarts)."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping like {{min_tau: 2.0, prompts: math}}, got {value!r}")
    unknown = sorted(set(value) - {*DEFAULTS, "min_tau", "spec"})
    if unknown:
        raise ValueError(
            f"unknown acceptance key '{unknown[0]}' (known: min_tau, spec, {', '.join(DEFAULTS)})"
        )
    if not value:
        return {}
    clean = {**DEFAULTS, "min_tau": None, "spec": None, **{k: v for k, v in value.items() if v is not None}}
    clean["min_tau"] = min_tau_arg(clean["min_tau"])
    for key in ("requests", "max_tokens"):
        if isinstance(clean[key], bool) or not str(clean[key]).isdigit() or int(clean[key]) < 1:
            raise ValueError(f"acceptance.{key}: expected a whole number >= 1, got {clean[key]!r}")
        clean[key] = int(clean[key])
    if not isinstance(clean["prompts"], str) or not clean["prompts"].strip():
        raise ValueError(f"acceptance.prompts: a shipped set name or a JSONL file, got {clean['prompts']!r}")
    clean["timeout"] = float(clean["timeout"])
    clean["enabled"] = clean["enabled"] is True or str(clean["enabled"]).lower() in ("true", "yes")
    return clean


def min_tau_arg(value: Any) -> float | dict[str, float] | None:
    """``min_tau``: a number for every mode, or {mode: number}; tau is at least 1."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {str(mode): _tau(raw, f"min_tau.{mode}") for mode, raw in value.items()}
    return _tau(value, "min_tau")


def _tau(raw: Any, where: str) -> float:
    try:
        number = -1.0 if isinstance(raw, bool) else float(raw)
    except (TypeError, ValueError):
        number = -1.0
    if number < 1:
        raise ValueError(f"{where}: expected a number >= 1 (tau counts the bonus token), got {raw!r}")
    return number
