"""`/metrics` through `prometheus_client`, under vLLM's metric names (`specops_contract`, where the
controller's `fab status` and benchmark client read them from too).

Load generators and dashboards written for vLLM read these unchanged: vLLM's `bench serve` scrapes
`vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`
and `..._num_accepted_tokens_per_pos_total{position="k"}` before and after a run, and derives the
acceptance rate (accepted / draft tokens) and length (1 + accepted / drafts, our τ). No `_created`
samples (the bench sums every line that starts with a counter's name). A draft is one speculative
verify round; its draft tokens are the nodes verified (ddtree: the request's budget; dflash:
block_size - 1); `ar` rounds are no drafts, and a server whose modes are all `ar` has no spec lines.
Inter-token latency is observed once per round: a speculative round delivers several tokens at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specops_contract import (
    DECODE_TIME,
    E2E_LATENCY,
    GENERATION_LENGTH,
    GENERATION_TOKENS,
    INTER_TOKEN_LATENCY,
    KV_CACHE_USAGE,
    PREFILL_TIME,
    PROMPT_LENGTH,
    PROMPT_TOKENS,
    QUEUE_TIME,
    REQUEST_SUCCESS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    SPEC_ACCEPTED,
    SPEC_ACCEPTED_PER_POS,
    SPEC_DRAFT_TOKENS,
    SPEC_DRAFTS,
    TIME_TO_FIRST_TOKEN,
)

# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 10.0)
LENGTH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
# fmt: on
FINISHED = ("stop", "length", "abort")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what vLLM serves

prometheus_client.disable_created_metrics()


class Metrics:
    """The server's metrics in a registry of its own; prometheus_client makes each call thread-safe."""

    # Over 60 lines on purpose: one declaration per metric, so every exposed name reads in one list.
    def __init__(self, model: str, spec: bool, positions: int) -> None:
        self.registry = CollectorRegistry()
        self.spec = spec
        labels = {"model_name": model, "engine": "0"}
        names = list(labels)

        def make(kind: type, name: str, doc: str, extra: Sequence[str] = (), **kw: object):  # type: ignore[no-untyped-def]
            metric = kind(name, doc, [*names, *extra], registry=self.registry, **kw)
            return metric if extra else metric.labels(**labels)

        self.running = make(Gauge, REQUESTS_RUNNING, "Requests being generated (batch 1).")
        self.waiting = make(Gauge, REQUESTS_WAITING, "Requests queued, not yet started.")
        self.kv_usage = make(Gauge, KV_CACHE_USAGE, "Share of the static KV cache in use (0-1).")
        self.prompt_tokens = make(Counter, PROMPT_TOKENS, "Prompt tokens of requests that were queued.")
        self.generation_tokens = make(Counter, GENERATION_TOKENS, "Generated tokens.")
        finished = make(
            Counter,
            REQUEST_SUCCESS,
            "Finished requests by reason (abort: client left).",
            ["finished_reason"],
        )
        self.finished = {r: finished.labels(**labels, finished_reason=r) for r in FINISHED}
        self.ttft = make(Histogram, TIME_TO_FIRST_TOKEN, "Arrival to first token.", buckets=TTFT_BUCKETS)
        self.e2e = make(Histogram, E2E_LATENCY, "Arrival to last token.", buckets=E2E_BUCKETS)
        self.queue_time = make(
            Histogram,
            QUEUE_TIME,
            "Time spent waiting in the queue.",
            buckets=E2E_BUCKETS,
        )
        self.itl = make(
            Histogram,
            INTER_TOKEN_LATENCY,
            "Time between rounds of tokens.",
            buckets=ITL_BUCKETS,
        )
        self.prefill_time = make(Histogram, PREFILL_TIME, "Prompt pass of a request.", buckets=E2E_BUCKETS)
        self.decode_time = make(
            Histogram,
            DECODE_TIME,
            "First token to last of a request.",
            buckets=E2E_BUCKETS,
        )
        self.prompt_len = make(Histogram, PROMPT_LENGTH, "Prompt length of requests.", buckets=LENGTH_BUCKETS)
        self.generation_len = make(
            Histogram,
            GENERATION_LENGTH,
            "Generated length of requests.",
            buckets=LENGTH_BUCKETS,
        )
        if spec:
            self.drafts = make(Counter, SPEC_DRAFTS, "Speculative verify rounds.")
            self.draft_tokens = make(Counter, SPEC_DRAFT_TOKENS, "Draft tokens verified.")
            self.accepted = make(Counter, SPEC_ACCEPTED, "Draft tokens accepted.")
            per_pos = make(
                Counter,
                SPEC_ACCEPTED_PER_POS,
                "Rounds that accepted a draft at this depth.",
                ["position"],
            )
            self.accepted_per_pos = [per_pos.labels(**labels, position=str(k)) for k in range(positions)]

    def record_rounds(self, draft_tokens: int, accepted_per_round: Sequence[int]) -> None:
        """One speculative generation's verify rounds (cancelled ones too: their rounds ran), which
        verified `draft_tokens` drafts in all."""
        if not self.spec:
            return
        self.drafts.inc(len(accepted_per_round))
        self.draft_tokens.inc(draft_tokens)
        self.accepted.inc(sum(accepted_per_round))
        for a in accepted_per_round:
            for k in range(a):
                self.accepted_per_pos[k].inc()

    def record_request(
        self,
        finished: str,
        prompt_tokens: int,
        generation_tokens: int,
        queue_s: float,
        ttft_s: float | None,
        e2e_s: float,
    ) -> None:
        """One request that reached the queue: `finished` is stop | length | abort."""
        self.finished[finished].inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        self.prompt_len.observe(prompt_tokens)
        self.generation_len.observe(generation_tokens)
        self.queue_time.observe(queue_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        self.e2e.observe(e2e_s)

    def render(self, waiting: int, running: int) -> bytes:
        """The exposition text; the queue gauges are read by the caller at scrape time."""
        self.waiting.set(waiting)
        self.running.set(running)
        return generate_latest(self.registry)
