"""/metrics: vLLM's names, and counters that agree with the engine's own per-round counts."""

from __future__ import annotations

from typing import Any

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
    for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens"):  # fmt: skip
        assert f"# TYPE {name} counter" in text
        assert f'\n{name}_total{{model_name="{MODEL}",engine="0"}} ' in text
    assert "_created" not in text  # vLLM's bench would add those lines into its sums
    assert "# TYPE vllm:num_requests_waiting gauge" in text
