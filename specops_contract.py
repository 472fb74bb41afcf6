"""The names the controller (``ops/``) and the runtime (``ddtree_runtime/``) share, defined once.

Standard library only, no torch: the controller imports it on a laptop, the runtime on the GPU
host, and neither imports the other. What lives here is what both sides must agree on: the
decoding modes, the server's options with their types and defaults (``SERVE_OPTIONS``: the
runtime's flags and settings and the inventory's ``serve`` keys derive from it), the ``/metrics``
names, how many cache rows one verify round needs per mode, and the base of every user-facing
error. See ``docs/architecture.md`` ("Contracts").
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------- decoding modes
MODES = ("ar", "dflash", "ddtree")  # our runtime's modes (vLLM/SGLang have their own, ops/bench/matrix.py)

# ---------------------------------------------------------------- the server's options
DTYPES = ("float32", "bfloat16", "float16")  # the torch dtypes weights may be loaded in, by name
DEVICES = ("cpu", "cuda")
DEFAULT_MAX_CONTEXT = 32768  # the cache's size cap when the target allows more (--max-context raises it)


@dataclass(frozen=True)
class ServeOption:
    """One setting of `python -m ddtree_runtime serve`: a flag (``--max-context`` for
    ``max_context``) and an env-file key (``SPECOPS_SERVE_MAX_CONTEXT``). ``default`` None means
    decided at start, as ``help`` says; ``inventory`` marks the keys the inventory's ``serve``
    mapping may set (``fab deploy`` passes them as flags; the rest go in ``serve_env``)."""

    kind: type
    help: str
    default: Any = None
    choices: tuple[str, ...] = ()
    inventory: bool = False

    def describe(self) -> str:
        """The help text with the default, for ``--help``."""
        if self.default is None:
            return self.help
        shown = format(self.default, "g") if isinstance(self.default, float) else self.default
        return f"{self.help} (default {shown})"


SERVE_OPTIONS: dict[str, ServeOption] = {
    "target": ServeOption(str, "target checkpoint directory (HF Qwen3, with tokenizer.json)"),
    "drafter": ServeOption(str, "DFlash drafter checkpoint directory (needed by dflash and ddtree)"),
    "mode": ServeOption(str, f"decoding mode: {' | '.join(MODES)}", "ddtree", choices=MODES, inventory=True),
    "budget": ServeOption(int, "ddtree: tree nodes verified per round", 64, inventory=True),
    "modes": ServeOption(
        str, "comma-separated modes requests may pick with the `mode` field (default: --mode)"
    ),
    "budgets": ServeOption(
        str, "comma-separated ddtree budgets requests may pick with `budget` (default: --budget)"
    ),
    "host": ServeOption(str, "address to bind", "127.0.0.1", inventory=True),
    "port": ServeOption(int, "port to bind; 0 picks a free one", 8000, inventory=True),
    "device": ServeOption(
        str, "cpu | cuda (default: cuda when torch sees one, else cpu)", choices=DEVICES, inventory=True
    ),
    "dtype": ServeOption(
        str,
        f"{' | '.join(DTYPES)} (default bfloat16 on cuda and on CPUs with native bf16, else float32)",
        choices=DTYPES,
        inventory=True,
    ),
    "max_context": ServeOption(
        int,
        "cache size in tokens: prompt + output + verify rows "
        f"(default: the model's, at most {DEFAULT_MAX_CONTEXT})",
        inventory=True,
    ),
    "temperature": ServeOption(
        float, "temperature for requests that send none (default: the model's generation_config.json, else 0)"
    ),
    "threads": ServeOption(int, "torch CPU threads (default: all cores but one, which the HTTP loop keeps)"),
    "queue_size": ServeOption(int, "requests that may wait for the engine; more get 503", 64),
    "max_batch": ServeOption(
        int,
        "sequences decoded together (continuous batching, eager rounds); 1: one at a time, with the "
        "CUDA-graphed rounds",
        1,
    ),
    "draft_head": ServeOption(
        str,
        "the LM head the drafts go through: auto (on GPUs with FP8 tensor cores an FP8 copy of a 16-bit "
        "head, read at half the bytes each round and taking half its size again in memory; else the "
        "target's own) | fp8 | target. The output is the same either way: the target verifies every draft",
        "auto",
        choices=("auto", "fp8", "target"),
    ),
    "prefill_chunk": ServeOption(
        int,
        "with --max-batch > 1: prompt tokens prefilled per step between rounds, in one pass over the "
        "waiting prompts, nearest their end first (default: every waiting prompt whole)",
    ),
    "budget_policy": ServeOption(
        str,
        "with --max-batch > 1: fixed (each ddtree request verifies its budget every round) | load (each "
        "round picks from --budgets, up to the request's budget, what maximises expected tokens per "
        "unit of round cost at the current load)",
        "fixed",
        choices=("fixed", "load"),
    ),
    "cost_table": ServeOption(
        str,
        'budget-policy load: JSON {"rows", "seconds", "draft_slots", "draft_seconds"} of batched round cost '
        "(`python -m ddtree_runtime cost-table`; `fab tune` measures it on the host)",
        inventory=True,
    ),
    # inside the usual 30 s TERM-to-KILL window of systemd and the supervisor
    "drain_timeout": ServeOption(float, "seconds SIGTERM waits for in-flight requests", 20.0),
    "served_model_name": ServeOption(str, "model id clients send (default: --target as given)"),
    "api_key": ServeOption(
        str,
        "bearer token clients must send on /v1/* (as vLLM's; put SPECOPS_SERVE_API_KEY in the env file "
        "instead: a flag is visible in the process list)",
    ),
    "api_key_routes": ServeOption(
        str,
        "v1: the API key guards /v1/* only, /health and /metrics stay open; all",
        "v1",
        choices=("v1", "all"),
    ),
    "header_timeout": ServeOption(float, "seconds a connection may take to send its request headers", 10.0),
    "max_connections": ServeOption(
        int,
        "open connections kept; past it the longest idle is closed (default: what the open-file limit allows)",
    ),
}
# What `fab deploy` assumes when the inventory's `serve` mapping leaves a key out.
SERVE_DEFAULTS: dict[str, Any] = {
    name: o.default for name, o in SERVE_OPTIONS.items() if o.inventory and o.default is not None
}
SERVICE = "specops-ddtree"  # the service (systemd unit) name and the stem of its files under <base>
# The environment file's keys the server reads as settings: SPECOPS_SERVE_<FLAG> (e.g. ..._MAX_BATCH).
SERVE_ENV_PREFIX = "SPECOPS_SERVE_"

# ---------------------------------------------------------------- /metrics names (vLLM's)
# Prometheus text; counters carry a `_total` suffix on the sample line, not on `# TYPE`.
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label `position`
REQUEST_SUCCESS = "vllm:request_success"  # label `finished_reason`
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
# histograms
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"
PROMPT_LENGTH = "vllm:request_prompt_tokens"
GENERATION_LENGTH = "vllm:request_generation_tokens"


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
