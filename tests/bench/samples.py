"""Benchmark data for the tests: foreign records written from the tools' documented field lists,
and synthetic specops results.

vLLM: ``vllm/benchmarks/serve.py`` (``main_async`` result_json + ``benchmark`` result dict);
SGLang: ``python/sglang/bench_serving.py`` (``benchmark`` result dict appended as one JSONL line).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ops.bench.cells import cell_id_for
from ops.bench.schema import BenchResult, Hardware, Latency, acceptance_from_counters
from ops.bench.store import write_result


def _latencies(prefix_names: tuple[str, ...], metrics: tuple[str, ...], base: float) -> dict[str, float]:
    out = {}
    for i, metric in enumerate(metrics):
        for j, stat in enumerate(prefix_names):
            out[f"{stat}_{metric}_ms"] = round(base * (i + 1) + j * 0.5, 3)
    return out


def vllm_record(**changes: Any) -> dict[str, Any]:
    """A `vllm bench serve --save-result` object of a DFlash run (spec-decode fields present)."""
    record: dict[str, Any] = {
        "date": "20261202-151500",
        "endpoint_type": "openai-chat",
        "backend": "openai-chat",
        "label": None,
        "model_id": "Qwen/Qwen3-8B",
        "tokenizer_id": "Qwen/Qwen3-8B",
        "num_prompts": 32,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 1,
        "duration": 64.0,
        "completed": 32,
        "failed": 0,
        "total_input_tokens": 1800,
        "total_output_tokens": 8192,
        "request_throughput": 0.5,
        "request_goodput": None,
        "output_throughput": 128.0,
        "total_token_throughput": 156.125,
        "max_output_tokens_per_s": 150.0,
        "max_concurrent_requests": 1,
        "rtfx": 0.0,
        **_latencies(("mean", "median", "std", "p99"), ("ttft", "tpot", "itl", "e2el"), 10.0),
        "spec_decode_acceptance_rate": 40.0,
        "spec_decode_acceptance_length": 7.0,
        "spec_decode_num_drafts": 1000,
        "spec_decode_draft_tokens": 15000,
        "spec_decode_accepted_tokens": 6000,
        "spec_decode_per_position_acceptance_rates": [
            0.9,
            0.8,
            0.7,
            0.6,
            0.5,
            0.45,
            0.4,
            0.35,
            0.3,
            0.25,
            0.2,
            0.15,
            0.2,
            0.05,
            0.0,
        ],
    }
    record.update(changes)
    return record


def sglang_record(**changes: Any) -> dict[str, Any]:
    """One `sglang.bench_serving --output-file` JSONL object of an EAGLE/MTP run."""
    record: dict[str, Any] = {
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": float("inf"),
        "max_concurrency": 1,
        "sharegpt_output_len": None,
        "random_input_len": 128,
        "random_output_len": 256,
        "random_range_ratio": 0.0,
        "duration": 50.0,
        "completed": 32,
        "total_input_tokens": 4096,
        "total_output_tokens": 8192,
        "total_output_tokens_retokenized": 8190,
        "request_throughput": 0.64,
        "input_throughput": 81.92,
        "output_throughput": 163.84,
        **_latencies(("mean", "median", "std", "p99"), ("ttft", "tpot", "itl"), 8.0),
        "p95_itl_ms": 9.5,
        "mean_e2e_latency_ms": 1500.0,
        "median_e2e_latency_ms": 1490.0,
        "std_e2e_latency_ms": 20.0,
        "p99_e2e_latency_ms": 1560.0,
        "concurrency": 0.98,
        "accept_length": 3.4,
    }
    record.update(changes)
    return record


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    """Write like the tools do: one json.dumps per line (Python's dumps writes inf as Infinity)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


HW = Hardware(
    gpu_name="NVIDIA H200", gpu_count=1, compute_cap="9.0", driver="570.124", cuda="12.8", torch="2.7.0"
)


def native(
    run_dir: Path,
    host: str,
    system: str,
    mode: str,
    tok_s: float,
    *,
    budget: int | None = None,
    k: int | None = None,
    counters: tuple[int, int, int] | None = None,
    histogram: dict[int, int] | None = None,
    prompt_set: str = "math",
    concurrency: int = 1,
) -> Path:
    """Write one result as our client would: counters -> tau, latency samples -> summaries. With
    ``concurrency`` clients each gets tok_s / concurrency, and waits longer for its first token."""
    drafts, proposed, accepted = counters or (None, None, None)
    tau, rate = acceptance_from_counters(drafts, proposed, accepted)
    result = BenchResult(
        system=system,
        mode=mode,
        source="native",
        host=host,
        budget=budget,
        num_speculative_tokens=k,
        target="/opt/specops/models/target",
        drafter=None if mode == "ar" else "/opt/specops/models/drafter",
        hardware=HW,
        prompt_set=prompt_set,
        temperature=0.0,
        concurrency=concurrency,
        output_len=256,
        num_requests=8,
        failed_requests=0,
        input_tokens=400,
        output_tokens=2048,
        duration_s=2048 / tok_s,
        request_throughput=8 / (2048 / tok_s),
        output_throughput=tok_s,
        ttft_ms=Latency.from_samples([concurrency * ms for ms in (20.0, 22.0, 25.0, 30.0)]),
        tpot_ms=Latency.from_samples([1000 / tok_s] * 4),
        e2el_ms=Latency.from_samples([1000 * 256 * concurrency / tok_s] * 8),
        tau=tau,
        acceptance_rate=rate,
        num_drafts=drafts,
        num_draft_tokens=proposed,
        num_accepted_tokens=accepted,
        accepted_length_histogram=histogram,
        started_at="2026-12-02T15:00:00+00:00",
        finished_at="2026-12-02T15:00:30+00:00",
        command=f"specops-client --mode {mode} --budget {budget}",
    )
    result.cell_id = cell_id_for(result)
    return write_result(run_dir, result)


def sweep_run(run_dir: Path, host: str = "gpu1", scale: float = 1.0) -> None:
    """A small matrix: ar, dflash, ddtree at three budgets (our system) plus vLLM ar and dflash."""
    native(run_dir, host, "ddtree", "ar", 40.0 * scale)
    native(
        run_dir,
        host,
        "ddtree",
        "dflash",
        160.0 * scale,
        counters=(100, 1500, 580),
        histogram={1: 10, 4: 20, 7: 40, 9: 30},
    )
    for budget, tok_s, accepted in ((16, 200.0, 450), (64, 260.0, 650), (256, 240.0, 750)):
        native(
            run_dir,
            host,
            "ddtree",
            "ddtree",
            tok_s * scale,
            budget=budget,
            counters=(100, 100 * budget, accepted),
            histogram={3: 20, 6: 30, 8: 50},
        )
    native(run_dir, host, "vllm", "ar", 50.0 * scale)
    native(run_dir, host, "vllm", "dflash", 150.0 * scale, k=15, counters=(100, 1500, 520))


def concurrency_run(run_dir: Path, host: str = "gpu1") -> None:
    """A concurrency sweep (1, 4, 16 clients): our ar and ddtree B=16, and vLLM's dflash."""
    for c, scale in ((1, 1.0), (4, 3.0), (16, 8.0)):
        native(run_dir, host, "ddtree", "ar", 40.0 * scale, concurrency=c)
        native(run_dir, host, "ddtree", "ddtree", 200.0 * scale, budget=16, concurrency=c)
        native(run_dir, host, "vllm", "dflash", 150.0 * scale, k=15, concurrency=c)
