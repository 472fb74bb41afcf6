"""The names the controller (``ops/``) and the runtime (``ddtree_runtime/``) share, defined once.

Standard library only, no torch: the controller imports it on a laptop, the runtime on the GPU
host, and neither imports the other. What lives here is what both sides must agree on: the
decoding modes, the server's default settings, the ``/metrics`` names, how many cache rows one
verify round needs per mode, and the base of every user-facing error. See
``docs/architecture.md`` ("Contracts").
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

# ---------------------------------------------------------------- decoding modes
MODES = ("ar", "dflash", "ddtree")  # our runtime's modes (vLLM/SGLang have their own, ops/bench/matrix.py)

# ---------------------------------------------------------------- the server's defaults
# `python -m ddtree_runtime serve` defaults, which `fab deploy` also assumes when the inventory's
# `serve` mapping leaves a key out.
SERVE_DEFAULTS: dict[str, Any] = {"host": "127.0.0.1", "port": 8000, "mode": "ddtree", "budget": 64}
SERVICE = "specops-ddtree"  # the service (systemd unit) name and the stem of its files under <base>

# ---------------------------------------------------------------- /metrics names (vLLM's)
# Prometheus text; counters carry a `_total` suffix on the sample line, not on `# TYPE`.
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label `position`
REQUEST_SUCCESS = "vllm:request_success"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"


# ---------------------------------------------------------------- cache rows per mode
def verify_rows(mode: str, block_size: int, budget: int) -> int:
    """Cache rows one round writes past the committed context (prompt + output so far): the root,
    plus a chain of ``block_size - 1`` drafts (dflash) or ``budget`` tree nodes (ddtree); a ddtree
    round also needs the drafter's whole block, which its draft writes at the same rows. The one
    rule the engine, the server's limits and the benchmarks use."""
    return {"ar": 1, "dflash": block_size, "ddtree": max(budget + 1, block_size)}[mode]


# ---------------------------------------------------------------- user-facing errors
class SpecopsError(Exception):
    """Base for user-facing failures; str() is one line that names where and how to fix it."""


def did_you_mean(word: object, choices: Iterable[str], otherwise: str | None = None) -> str | None:
    """The hint for a misspelt name: "did you mean 'x'?" when a choice is close, else `otherwise`."""
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f"did you mean '{close[0]}'?" if close else otherwise
