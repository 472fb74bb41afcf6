"""Reading ``/metrics`` of our server, vLLM or SGLang: Prometheus text through prometheus_client's parser.

``fab status`` reads a few counters from it (:func:`status_metrics`) and the benchmark client
reads the speculative-decoding counters before and after a measured phase
(``ops.bench.spec_counters``). Both go through :func:`samples`, which drops the ``_total`` suffix that
Prometheus adds to counters, so either spelling of a name matches. The parser is prometheus_client's
(label values with spaces, commas or escaped quotes, and sample timestamps, are its job), which
every server measured here depends on, so the benchmark client finds it on the host too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

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
    labels: dict[str, str]
    value: float


def samples(text: str) -> Iterator[Sample]:
    """Pure: every sample of the exposition; a body that is not Prometheus text (an HTML error
    page, a cut-off response) has none, as a server without metrics has none."""
    try:
        found = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except ValueError:
        return
    for sample in found:
        yield Sample(sample.name.removesuffix("_total"), sample.labels, float(sample.value))


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
