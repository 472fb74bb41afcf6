"""/metrics: vLLM's names, and counters that agree with the engine's own per-round counts."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.server.client import Server
from tests.server.conftest import BUDGET, MODEL, ORACLE_TOKENS, PROMPT


def test_spec_decode_counters_match_the_engine_rounds(main_server: Server, oracle: dict[str, Any]) -> None:
    before = main_server.metrics()
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": ORACLE_TOKENS}
    status, out = main_server.post("/v1/chat/completions", body)
    assert status == 200 and out["choices"][0]["message"]["content"] == oracle["text"]
    after = main_server.metrics()

    def delta(key: str) -> float:
        return after[key] - before[key]

    rounds = oracle["accepted_per_round"]
    assert delta("vllm:spec_decode_num_drafts_total") == len(rounds) == oracle["rounds"]
    assert delta("vllm:spec_decode_num_draft_tokens_total") == len(rounds) * BUDGET
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == sum(rounds)
    for k in range(5):  # block_size 6: depths 0..4
        key = f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{k}"}}'
        assert delta(key) == sum(a > k for a in rounds)
    # vLLM's bench: acceptance length = 1 + accepted / drafts = the engine's tau
    tau = 1 + delta("vllm:spec_decode_num_accepted_tokens_total") / delta("vllm:spec_decode_num_drafts_total")
    assert abs(tau - oracle["mean_accepted"]) < 1e-9
    assert delta("vllm:generation_tokens_total") == ORACLE_TOKENS
    assert delta("vllm:prompt_tokens_total") == oracle["prompt_tokens"]
    assert delta('vllm:request_success_total{finished_reason="length"}') == 1
    for hist in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert delta(f"{hist}_count") == 1
        assert after[f'{hist}_bucket{{le="+Inf"}}'] == after[f"{hist}_count"]
        buckets = [v for k, v in after.items() if k.startswith(f"{hist}_bucket")]
        assert buckets == sorted(buckets)  # cumulative


def test_exposition_format(main_server: Server) -> None:
    status, headers, data = main_server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    text = data.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}  # Prometheus' own parser
    for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos",
                 "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success"):  # fmt: skip
        assert families[name].type == "counter", name
        samples = families[name].samples
        assert samples and {s.name for s in samples} == {f"{name}_total"}, name
        assert all(s.labels["model_name"] == MODEL and s.labels["engine"] == "0" for s in samples)
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert families[name].type == "gauge", name
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:request_prompt_tokens", "vllm:request_generation_tokens"):  # fmt: skip
        assert families[name].type == "histogram", name
    assert "_created" not in text  # vLLM's bench would add those lines into its sums


def test_new_histograms_count_each_request(main_server: Server) -> None:
    before = main_server.metrics()
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True}
    status, out = main_server.post("/v1/completions", body)
    assert status == 200
    after = main_server.metrics()
    for hist in ("vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:request_prompt_tokens", "vllm:request_generation_tokens"):  # fmt: skip
        assert after[f"{hist}_count"] - before[f"{hist}_count"] == 1, hist
    assert after["vllm:request_generation_tokens_sum"] - before["vllm:request_generation_tokens_sum"] == 12
    assert (
        after["vllm:request_prompt_tokens_sum"] - before["vllm:request_prompt_tokens_sum"]
        == out["usage"]["prompt_tokens"]
    )
    rounds = (
        after["vllm:inter_token_latency_seconds_count"] - before["vllm:inter_token_latency_seconds_count"]
    )
    assert 1 <= rounds < 12  # one gap per round after the first; a speculative round brings several tokens
    assert after["vllm:kv_cache_usage_perc"] == 0  # idle: nothing in the cache is in use
