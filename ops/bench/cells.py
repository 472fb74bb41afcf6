"""A result's name and the fields a user fills in: cell ids, file-name slugs and ``--set NAME=VALUE``.

The cell id names the result file (``results/<run-id>/<host>/<cell-id>.json``) and is how a resumed
run knows a cell is done; `set_field` is how ``import --set`` and vLLM's ``--metadata`` fill what a
foreign file lacks.
"""

from __future__ import annotations

import re
from typing import Any

from ops.bench.schema import FLOAT_FIELDS, HARDWARE_FIELDS, INT_FIELDS, BenchResult, SchemaError
from ops.errors import did_you_mean


def cell_id_for(result: BenchResult) -> str:
    """Default cell id from what distinguishes a matrix cell, e.g. ``ddtree-ddtree-b64-math-t0-c1-o256``."""
    parts = [result.system, result.mode]
    for prefix, value in (
        ("b", result.budget),
        ("bs", result.block_size),
        ("k", result.num_speculative_tokens),
    ):
        if value is not None:
            parts.append(f"{prefix}{value}")
    if result.prompt_set:
        parts.append(result.prompt_set)
    for prefix, value in (("t", result.temperature), ("c", result.concurrency), ("o", result.output_len)):
        if value is not None:
            parts.append(f"{prefix}{value:g}")
    return slug("-".join(parts))


def slug(text: str) -> str:
    """File-name-safe form of ``text`` (runs of other characters become '-')."""
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text).strip("-.") or "x"


SETTABLE = {
    **{
        name: str
        for name in (
            "system",
            "mode",
            "target",
            "drafter",
            "command",
            "prompt_set",
            "started_at",
            "finished_at",
            "cell_id",
        )
    },
    **{name: int for name in ("budget", "block_size", "num_speculative_tokens", *INT_FIELDS)},
    **{name: float for name in (*FLOAT_FIELDS, "tau", "acceptance_rate")},
    **{f"hardware.{name}": (int if name == "gpu_count" else str) for name in HARDWARE_FIELDS},
}


def set_field(result: BenchResult, name: str, value: Any) -> None:
    """Set a scalar field (``hardware.X`` allowed) from text or a JSON value, with type coercion.

    Why: foreign files lack what only the user knows (mode, budget, prompt set); ``import --set``
    and vLLM's ``--metadata KEY=VALUE`` both arrive here as strings.
    """
    kind = SETTABLE.get(name)
    if kind is None:
        raise SchemaError(
            name,
            "not a settable field",
            did_you_mean(name, sorted(SETTABLE), f"one of {', '.join(sorted(SETTABLE))}"),
        )
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
        try:
            value = kind(value)
        except (TypeError, ValueError):
            raise SchemaError(name, f"cannot read {value!r} as {kind.__name__}") from None
    if name.startswith("hardware."):
        setattr(result.hardware, name.split(".", 1)[1], value)
    else:
        setattr(result, name, value)
