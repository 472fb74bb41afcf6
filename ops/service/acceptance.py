"""The acceptance gate: after a (re)started server answers, prove that speculation works.

Why: in the story a drafter accepted 1.1% of its drafts and nothing noticed; a server that
answers can still be no faster than plain decoding. The gate sends a short greedy probe (held-out
prompts: a shipped prompt set or a JSONL file, ``remote/accept.py``), reads tau per mode from the
server's own ``/metrics`` counters before and after it (vLLM's names, which our server exports,
or SGLang's; ``ops/bench/spec_counters.py``), and fails below the threshold: the inventory's
``min_tau`` (a number, or one per mode), else the drafter spec's ``min_tau``. The failure names
the config fields most likely wrong for that system and mode; the service step then rolls back
as for a server that does not answer. A pass is recorded in ``<base>/run/<service>.acceptance.json``,
which ``fab status`` compares the live tau with. The same probe checks a vLLM or SGLang server of
the bench matrix (an entry's ``min_tau``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from drafter_config.spec import load_spec, shipped_specs
from ops.api.changes import Run, StepFailed
from ops.api.context import StepContext
from ops.bench.prompts import load_prompts
from ops.bench.spec_counters import NAMES, parse_spec_counters, spec_delta
from ops.errors import SpecopsError
from ops.service.facts import parse_json_line, run_script

if TYPE_CHECKING:
    from ops.connection import Connection

API_KEYS = ("VLLM_API_KEY", "SPECOPS_SERVE_API_KEY")  # env-file keys that vLLM and our server read
PROMPT_CHARS = 2000  # a probe prompt is cut here: the whole probe travels as one argument
FIELDS = {  # the config fields most likely wrong when a mode accepts too little
    "dflash": (
        "the drafter's config.json: dflash_config.mask_token_id, dflash_config.target_layer_ids, "
        "layer_types/sliding_window (fab lint-drafter with the host's drafter_spec names them), "
        "block_size against serve.num_speculative_tokens"
    ),
    "mtp": (
        "the target's MTP head (mtp.* tensors; exports that drop it accept nothing) and "
        "serve.num_speculative_tokens"
    ),
    "eagle": "serve.mode (eagle or eagle3, as the drafter was trained), the drafter's target and "
    "serve.num_speculative_tokens",
    "ngram": "the prompts (n-gram drafts need repetition: set a lower min_tau for ngram) and "
    "serve.num_speculative_tokens",
}
SYSTEM_FIELDS = {
    ("vllm", "dflash"): "; --attention-backend (the drafter needs non-causal attention) and, for a "
    "sliding-window drafter, VLLM_USE_V2_MODEL_RUNNER=1 in serve_env",
    ("ddtree", "ddtree"): "; serve.budget; with SPECOPS_SERVE_BUDGET_POLICY=load, the cost table (under "
    "which a tree may not pay even for one request: the policy then verifies none)",
}


def likely_fields(system: str, mode: str) -> str:
    family = {"ddtree": "dflash", "eagle3": "eagle"}.get(mode, mode)
    return FIELDS.get(family, "serve.mode and the drafter") + SYSTEM_FIELDS.get((system, mode), "")


def threshold(settings: dict[str, Any], mode: str, ctx: StepContext) -> tuple[float | None, str]:
    """(min tau, where it came from) for ``mode``: the inventory's min_tau, else the spec's."""
    for value, source in (
        (settings["min_tau"], "inventory min_tau"),
        (_spec_min_tau(settings["spec"], ctx), f"drafter spec {settings['spec']}"),
    ):
        number = value.get(mode) if isinstance(value, dict) else value
        if number is not None:
            return number, source
    return None, "no min_tau set"


def _spec_min_tau(name: str | None, ctx: StepContext) -> Any:
    """The drafter spec's ``min_tau`` (a shipped spec by name, else a file beside the playbook)."""
    if not name:
        return None
    try:
        return load_spec(name if name in shipped_specs() else str(ctx.find_source(name))).min_tau
    except SpecopsError as exc:
        raise StepFailed(f"acceptance gate: drafter spec {name}: {exc}") from None


def probe_prompts(settings: dict[str, Any], ctx: StepContext) -> list[str]:
    """The first ``requests`` prompts of the set (a shipped name, or a file beside the playbook)."""
    name = settings["prompts"]
    try:
        source = name if "/" not in name and not name.endswith(".jsonl") else str(ctx.find_source(name))
        prompts = load_prompts(source).prompts
    except SpecopsError as exc:
        raise StepFailed(f"acceptance gate: prompts {name}: {exc}") from None
    return [p.text[:PROMPT_CHARS] for p in prompts[: settings["requests"]]]


@dataclass(frozen=True)
class Probe(Run):
    """The change that runs the probe on the host and judges it; applying returns
    ``{"acceptance": record}`` or raises :class:`AcceptanceFailed` naming the likely fields."""

    system: str = ""
    limits: dict[str, tuple[float | None, str]] = field(default_factory=dict)  # mode -> threshold
    record_path: str = ""

    def describe(self) -> str:
        return f"run: python3 -c <greedy probe of {', '.join(self.limits)}, tau from /metrics>  # {self.why}"

    def apply(self, conn: Connection) -> dict[str, Any]:
        answer = parse_json_line("the acceptance probe")(conn.run(self.command, timeout=self.timeout))
        record = judge(answer, self.system, self.limits)
        data = json.dumps(record, indent=1) + "\n"
        conn.write_bytes(self.record_path, data.encode(), 0o644)
        return {"acceptance": record}


class AcceptanceFailed(StepFailed):
    """The server answers, but speculation accepts less than the threshold (or cannot be read)."""


def judge(answer: dict[str, Any], system: str, limits: dict[str, tuple[float | None, str]]) -> dict[str, Any]:
    """Pure: tau per mode from the probe's scrapes, checked against ``limits``; the record."""
    if "error" in answer:
        raise AcceptanceFailed(f"acceptance probe: {answer['error']}")
    modes: dict[str, Any] = {}
    for mode, found in answer["modes"].items():
        minimum, source = limits[mode]
        if not found["requests"]:
            raise AcceptanceFailed(f"acceptance probe ({mode}): every request failed: {found['errors'][:1]}")
        if found["before"] is None or found["after"] is None:
            fix = (
                "start SGLang with --enable-metrics" if system == "sglang" else "check the server's /metrics"
            )
            raise AcceptanceFailed(
                f"acceptance gate ({mode}): {system} does not answer /metrics (fix: {fix})"
            )
        tau = spec_delta(parse_spec_counters(found["before"]), parse_spec_counters(found["after"])).tau
        if tau is None:
            raise AcceptanceFailed(
                f"acceptance gate ({mode}): {system} counted no speculation over {found['requests']} "
                f"requests ({found['tokens']} tokens): is mode {mode} really speculating? likely wrong: "
                f"{likely_fields(system, mode)}"
            )
        if minimum is not None and tau < minimum:
            raise AcceptanceFailed(
                f"acceptance gate: {system} {mode} tau {tau:.2f} < min_tau {minimum:g} ({source}) over "
                f"{found['requests']} greedy requests; likely wrong: {likely_fields(system, mode)}"
            )
        modes[mode] = {
            "tau": round(tau, 3),
            "min_tau": minimum,
            "source": source,
            "requests": found["requests"],
        }
    return {"system": system, "modes": modes, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def probe(
    url: str,
    model: str | None,
    system: str,
    modes: dict[str, dict[str, Any]],
    settings: dict[str, Any],
    ctx: StepContext,
    record_path: str,
    env_file: str = "",
) -> Probe:
    """The gate for ``modes`` ({mode: extra request fields}) of the server at ``url``; a key the
    server wants is read on the host from ``env_file``."""
    spec = {
        "env_file": env_file,
        "key_names": list(API_KEYS),
        "url": url,
        "model": model,
        "prompts": probe_prompts(settings, ctx),
        "max_tokens": settings["max_tokens"],
        "modes": [{"mode": m, "extra": extra} for m, extra in modes.items()],
        "keep": list(NAMES),
        "timeout": settings["timeout"],
    }
    limits = {m: threshold(settings, m, ctx) for m in modes}
    shown = ", ".join(f"{m} >= {lim[0]:g}" if lim[0] else f"{m} (no min_tau)" for m, lim in limits.items())
    return Probe(
        run_script("accept", spec),
        timeout=settings["timeout"] + 60,
        why=f"acceptance gate: {shown}",
        system=system,
        limits=limits,
        record_path=record_path,
    )
