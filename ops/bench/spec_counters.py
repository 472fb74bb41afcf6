"""Speculation as the server counts it: the spec-decode counters of ``/metrics`` and their deltas.

The counters are vLLM's ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens`` and ``..._per_pos`` (our server exports the same names), with or
without Prometheus' ``_total``. SGLang (0.5.23, with ``--enable-metrics``) counts differently:
``sglang:spec_verify_calls_total`` and ``sglang:generation_tokens_total``, whose ratio is its own
acceptance length (completion tokens per verify call, bonus included). The client and the
acceptance gate scrape them before and after a measured phase; the deltas give tau, and for vLLM's
names the acceptance rate, per-position acceptance and the accepted-length histogram.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ops.service.metrics import samples
from specops_contract import SPEC_ACCEPTED, SPEC_ACCEPTED_PER_POS, SPEC_DRAFT_TOKENS, SPEC_DRAFTS

SGLANG_VERIFY_CALLS = "sglang:spec_verify_calls"
SGLANG_GENERATION_TOKENS = "sglang:generation_tokens"
COUNTERS = {
    SPEC_DRAFTS: "drafts",
    SPEC_DRAFT_TOKENS: "draft_tokens",
    SPEC_ACCEPTED: "accepted",
    SGLANG_VERIFY_CALLS: "verify_calls",
    SGLANG_GENERATION_TOKENS: "generation_tokens",
}
NAMES = (*COUNTERS, SPEC_ACCEPTED_PER_POS)  # what a scrape must keep


def parse_spec_counters(text: str) -> dict[str, Any]:
    """Pure: the spec-decode counters summed over labels, ``per_pos`` by position; absent ones missing."""
    found: dict[str, Any] = {}
    per_pos: dict[int, float] = {}
    for sample in samples(text):
        if sample.name == SPEC_ACCEPTED_PER_POS:
            position = sample.labels.get("position")
            if position is not None and position.isdigit():
                per_pos[int(position)] = per_pos.get(int(position), 0.0) + sample.value
        elif sample.name in COUNTERS:
            found[COUNTERS[sample.name]] = found.get(COUNTERS[sample.name], 0.0) + sample.value
    if per_pos:
        found["per_pos"] = per_pos
    return found


@dataclass
class SpecDelta:
    """Counter deltas over the measured phase, and what they imply."""

    drafts: int | None = None
    draft_tokens: int | None = None
    accepted: int | None = None
    per_position: list[float] | None = None
    histogram: dict[int, int] | None = None
    verify_calls: int | None = None
    generation_tokens: int | None = None

    @property
    def tau(self) -> float | None:
        """Mean tokens per verify round: 1 + accepted / drafts (vLLM's names, ours), else SGLang's
        generation tokens / verify calls; None when the server counted no speculation."""
        if self.drafts:
            return 1 + (self.accepted or 0) / self.drafts
        if self.verify_calls:
            return (self.generation_tokens or 0) / self.verify_calls
        return None


def spec_delta(before: dict[str, Any], after: dict[str, Any]) -> SpecDelta:
    """Pure: deltas of every counter present on both sides (a server without speculation has none).

    The accepted-length histogram follows from the per-position counts because acceptance is a
    prefix: a round that accepted k drafts accepted positions 0..k-1, so rounds emitting exactly
    k+1 tokens = per_pos[k-1] - per_pos[k]. It is filled only when the counts add up to the total.
    """
    delta = SpecDelta()
    for key in ("drafts", "draft_tokens", "accepted", "verify_calls", "generation_tokens"):
        if key in before or key in after:
            setattr(delta, key, round(after.get(key, 0.0) - before.get(key, 0.0)))
    pos_after, pos_before = after.get("per_pos", {}), before.get("per_pos", {})
    counts = [round(pos_after.get(k, 0.0) - pos_before.get(k, 0.0)) for k in range(len(pos_after))]
    if delta.drafts and counts:
        delta.per_position = [min(1.0, max(0.0, c / delta.drafts)) for c in counts]
        if sum(counts) == delta.accepted:
            at_least = [delta.drafts, *counts, 0]
            delta.histogram = {
                k + 1: at_least[k] - at_least[k + 1]
                for k in range(len(at_least) - 1)
                if at_least[k] - at_least[k + 1] > 0
            }
    return delta
