"""The range of every size a checkpoint's config may give, checked before anything is enumerated
or allocated.

Checkpoints come from the internet: a `num_hidden_layers` of 10^9 made the lint list billions of
tensor names, a drafter `block_size` of 10^8 passed it and then asked the runtime for 204 GB, and
zero or negative sizes reached a division or a tensor constructor. The ranges are generous (the
largest public models sit far inside them); a value outside one is unusable input: one line naming
the file, line and key, exit 2. The lint (`lint.load_inputs`) and the runtime (`ddtree_runtime/
config.py`) both check against this one table.
"""

from __future__ import annotations

from typing import Any

from drafter_config.source import LintInputError
from specops_files.jsonpos import JsonDocument

LAYERS = 1024
# key -> (lowest, highest) allowed; no lowest where a lint rule names a value too small (DFL050)
SIZES: dict[str, tuple[int | None, int]] = {
    "num_hidden_layers": (1, LAYERS),
    "num_target_layers": (1, LAYERS),
    "full_attention_interval": (1, LAYERS),
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 20),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "vocab_size": (1, 1 << 22),
    "max_position_embeddings": (1, 1 << 24),
    "sliding_window": (1, 1 << 24),
    "block_size": (None, 256),
    "linear_num_key_heads": (1, 1024),
    "linear_num_value_heads": (1, 1024),
    "linear_key_head_dim": (1, 4096),
    "linear_value_head_dim": (1, 4096),
    "linear_conv_kernel_dim": (1, 64),
}
SECTIONS = ((), ("text_config",), ("dflash_config",))  # where a config keeps its sizes


def out_of_range(key: str, value: Any) -> str | None:
    """Why ``value`` is no size for ``key`` (None when it is one, or ``key`` is no size)."""
    if key not in SIZES:
        return None
    low, high = SIZES[key]
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole:
        return f"{key} is {value!r}, not a whole number"
    if low is None:
        return f"{key} is {int(value)}, more than {high}" if value > high else None
    return None if low <= value <= high else f"{key} is {int(value)}, outside {low}..{high}"


def check_sizes(doc: JsonDocument, file: str) -> None:
    """Raise LintInputError for the first size out of range (top level, text_config, dflash_config)."""
    data = doc.data if isinstance(doc.data, dict) else {}
    for prefix in SECTIONS:
        section = data.get(prefix[0]) if prefix else data
        if not isinstance(section, dict):
            continue
        for key, value in section.items():
            if value is None or not isinstance(value, (int, float)):  # strings etc.: the rules' findings
                continue
            why = out_of_range(key, value)
            if why is not None:
                line, _ = doc.locate((*prefix, key))
                where = ".".join((*prefix, key))
                raise LintInputError(
                    f"{file}:{line}: {why.replace(key, where, 1)} (fix: correct {where}; this is not a "
                    "checkpoint that can be served)"
                )
