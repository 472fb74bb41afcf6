"""What a cost table was measured for: the settings of our server its round costs depend on.

``fab tune``'s ``cost_table`` step (``ops/steps/cost_table.py``) records its command line with the
table; ``tuned_settings`` (``ops/steps/bench.py``) hands the table to the server only while the
models, device, max batch, dtype and draft head there are still the ones the server runs, so a
``fab deploy`` after the inventory changed them never feeds the load policy another model's costs.
"""

from __future__ import annotations

import json
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from ops.api.changes import StepFailed
from ops.service.command import serve_device
from specops_contract import SERVE_ENV_PREFIX, SERVE_OPTIONS

if TYPE_CHECKING:
    from ops.api.context import StepContext

# what the costs depend on
FLAGS = ("--target", "--drafter", "--device", "--max-batch", "--dtype", "--draft-head")


def env_setting(serve_env: dict[str, Any], name: str) -> str | None:
    """One of our server's settings as the environment file gives it (``SPECOPS_SERVE_<NAME>``)."""
    value = serve_env.get(SERVE_ENV_PREFIX + name.upper())
    return None if value is None else str(value).strip()


def max_batch(serve_env: dict[str, Any]) -> int:
    raw = env_setting(serve_env, "max_batch") or str(SERVE_OPTIONS["max_batch"].default)
    if not raw.isdigit() or int(raw) < 1:
        raise StepFailed(f"serve_env {SERVE_ENV_PREFIX}MAX_BATCH: expected a whole number >= 1, got {raw!r}")
    return int(raw)


def parse_table(text: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None  # a damaged table is measured again
    return doc if isinstance(doc, dict) else None


def table_settings(args: dict[str, Any], ctx: StepContext) -> dict[str, str]:
    """The cost-table flags for what the server runs: its models, device, max batch, dtype and
    draft head (the inventory's ``serve`` wins over ``serve_env``, as on the server's command line)."""
    serve, env = args["serve"], args["serve_env"]
    settings = {
        "--target": args["target"],
        "--drafter": args["drafter"],
        "--device": serve_device(serve, ctx),
        "--max-batch": str(max_batch(env)),
    }
    dtype = serve.get("dtype") or env_setting(env, "dtype")
    head = env_setting(env, "draft_head")
    optional = {"--dtype": dtype, "--draft-head": head}
    return settings | {flag: value for flag, value in optional.items() if value}


def stale_settings(measured_for: dict[str, Any], settings: dict[str, str]) -> list[str]:
    """How a table's recorded command line differs from ``settings``, one ``'NAME OLD (now NEW)'``
    each; [] when it was measured for them."""
    argv = measured_for.get("argv") or []
    measured = {flag: value for flag, value in pairwise(argv) if flag in FLAGS}
    return [
        f"{flag[2:]} {measured.get(flag, 'unset')} (now {settings.get(flag, 'unset')})"
        for flag in FLAGS
        if measured.get(flag) != settings.get(flag)
    ]
