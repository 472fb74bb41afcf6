"""`/metrics` in Prometheus text format, under vLLM's metric names.

Load generators and dashboards written for vLLM read these unchanged: vLLM's `bench serve` scrapes
`vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`
and `..._num_accepted_tokens_per_pos_total{position="k"}` before and after a run, and derives the
acceptance rate (accepted / draft tokens) and length (1 + accepted / drafts, our τ). Counters carry
the `_total` suffix Prometheus adds, and no `_created` samples (the bench sums every line that starts
with a counter's name). A draft is one verify round; its draft tokens are the nodes verified
(ddtree: the budget; dflash: block_size - 1); ar serves no drafts and exposes no spec lines.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0)
# fmt: on
FINISHED = ("stop", "length", "abort")


class Histogram:
    """Cumulative-bucket histogram (observations <= le)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.count, self.sum = 0, 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, le in enumerate(self.buckets):
            if value <= le:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [
            f'{name}_bucket{{{labels},le="{le}"}} {n}'
            for le, n in zip(self.buckets, self.counts, strict=True)
        ]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """The server's counters; every method is safe from any thread."""

    def __init__(self, model: str, mode: str, draft_tokens_per_round: int, positions: int) -> None:
        self.labels = f'model_name="{_label(model)}",engine="0"'
        self.spec = mode != "ar"
        self.draft_tokens_per_round = draft_tokens_per_round
        self.lock = threading.Lock()
        self.drafts = self.draft_tokens = self.accepted = 0
        self.accepted_per_pos = [0] * positions
        self.prompt_tokens = self.generation_tokens = 0
        self.finished = dict.fromkeys(FINISHED, 0)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue_time = Histogram(E2E_BUCKETS)

    def record_rounds(self, accepted_per_round: Sequence[int]) -> None:
        """One generation's verify rounds (cancelled ones too: their rounds ran)."""
        if not self.spec:
            return
        with self.lock:
            self.drafts += len(accepted_per_round)
            self.draft_tokens += len(accepted_per_round) * self.draft_tokens_per_round
            for a in accepted_per_round:
                self.accepted += a
                for k in range(a):
                    self.accepted_per_pos[k] += 1

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
        with self.lock:
            self.finished[finished] += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens
            self.queue_time.observe(queue_s)
            if ttft_s is not None:
                self.ttft.observe(ttft_s)
            self.e2e.observe(e2e_s)

    def render(self, waiting: int, running: int) -> str:
        """The exposition text; the queue gauges are read by the caller at scrape time."""
        lab = self.labels
        out: list[str] = []

        def metric(name: str, kind: str, doc: str, samples: list[str]) -> None:
            out.extend([f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *samples])

        metric(
            "vllm:num_requests_running",
            "gauge",
            "Requests being generated (batch 1).",
            [f"vllm:num_requests_running{{{lab}}} {running}"],
        )
        metric(
            "vllm:num_requests_waiting",
            "gauge",
            "Requests queued, not yet started.",
            [f"vllm:num_requests_waiting{{{lab}}} {waiting}"],
        )
        with self.lock:
            metric(
                "vllm:prompt_tokens",
                "counter",
                "Prompt tokens of requests that were queued.",
                [f"vllm:prompt_tokens_total{{{lab}}} {self.prompt_tokens}"],
            )
            metric(
                "vllm:generation_tokens",
                "counter",
                "Generated tokens.",
                [f"vllm:generation_tokens_total{{{lab}}} {self.generation_tokens}"],
            )
            metric(
                "vllm:request_success",
                "counter",
                "Finished requests by reason (abort: client left).",
                [
                    f'vllm:request_success_total{{{lab},finished_reason="{r}"}} {n}'
                    for r, n in self.finished.items()
                ],
            )
            metric(
                "vllm:time_to_first_token_seconds",
                "histogram",
                "Arrival to first token.",
                self.ttft.lines("vllm:time_to_first_token_seconds", lab),
            )
            metric(
                "vllm:e2e_request_latency_seconds",
                "histogram",
                "Arrival to last token.",
                self.e2e.lines("vllm:e2e_request_latency_seconds", lab),
            )
            metric(
                "vllm:request_queue_time_seconds",
                "histogram",
                "Time spent waiting in the queue.",
                self.queue_time.lines("vllm:request_queue_time_seconds", lab),
            )
            if self.spec:
                metric(
                    "vllm:spec_decode_num_drafts",
                    "counter",
                    "Verify rounds.",
                    [f"vllm:spec_decode_num_drafts_total{{{lab}}} {self.drafts}"],
                )
                metric(
                    "vllm:spec_decode_num_draft_tokens",
                    "counter",
                    "Draft tokens verified.",
                    [f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {self.draft_tokens}"],
                )
                metric(
                    "vllm:spec_decode_num_accepted_tokens",
                    "counter",
                    "Draft tokens accepted.",
                    [f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {self.accepted}"],
                )
                metric(
                    "vllm:spec_decode_num_accepted_tokens_per_pos",
                    "counter",
                    "Rounds that accepted a draft at this depth.",
                    [
                        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{k}"}} {n}'
                        for k, n in enumerate(self.accepted_per_pos)
                    ],
                )
        return "\n".join(out) + "\n"
