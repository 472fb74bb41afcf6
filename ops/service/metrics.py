"""The one Prometheus-text parser: ``/metrics`` of our server, vLLM or SGLang.

``fab status`` reads a few counters from it (:func:`status_metrics`) and the benchmark client
reads the speculative-decoding counters before and after a measured phase
(``ops.bench.spec_counters``). Both go through :func:`samples`, which drops the ``_total`` suffix that
Prometheus adds to counters, so either spelling of a name matches. Standard library only: the
client runs on the host.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from specops_contract import (
    GENERATION_TOKENS,
    REQUEST_SUCCESS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    SPEC_ACCEPTED,
    SPEC_DRAFT_TOKENS,
    SPEC_DRAFTS,
)

STATUS_NAMES = {
    "sglang:spec_verify_calls": "verify_calls",  # SGLang 0.5.23 (--enable-metrics)
    "sglang:generation_tokens": "generation_tokens",
    "sglang:num_requests": "requests",
    SPEC_DRAFTS: "drafts",
    SPEC_DRAFT_TOKENS: "draft_tokens",
    SPEC_ACCEPTED: "accepted_tokens",
    REQUEST_SUCCESS: "requests",
    GENERATION_TOKENS: "generation_tokens",
    REQUESTS_RUNNING: "running",
    REQUESTS_WAITING: "waiting",
}


class Sample(NamedTuple):
    name: str  # without a trailing ``_total``
    labels: str  # the text between the braces, unparsed (see :func:`label`)
    value: float


def samples(text: str) -> Iterator[Sample]:
    """Pure: every sample line (comments, blanks and unreadable values skipped)."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        try:
            number = float(value)
        except ValueError:
            continue
        yield Sample(name.strip().removesuffix("_total"), labels.rstrip().removesuffix("}"), number)


def label(labels: str, key: str) -> str | None:
    """One label's value from :attr:`Sample.labels`."""
    for part in labels.split(","):
        k, _, v = part.partition("=")
        if k.strip() == key:
            return v.strip().strip('"')
    return None


def status_metrics(text: str) -> dict[str, float]:
    """Pure: the counters ``fab status`` shows, summed over labels, plus the mean acceptance length
    (vLLM's and ours: 1 + accepted / drafts; SGLang's: generation tokens per verify call)."""
    found: dict[str, float] = {}
    for sample in samples(text):
        key = STATUS_NAMES.get(sample.name)
        if key is not None:
            found[key] = found.get(key, 0.0) + sample.value
    if found.get("drafts"):
        found["mean_acceptance_length"] = round(1 + found.get("accepted_tokens", 0.0) / found["drafts"], 3)
    elif found.get("verify_calls"):
        found["mean_acceptance_length"] = round(
            found.get("generation_tokens", 0.0) / found["verify_calls"], 3
        )
    return found
