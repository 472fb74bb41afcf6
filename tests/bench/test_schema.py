"""The result schema: round trip, validation errors that name the field, helpers our client uses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ops.bench.cells import cell_id_for, set_field
from ops.bench.schema import (
    SCHEMA_ID,
    BenchResult,
    Latency,
    SchemaError,
    acceptance_from_counters,
)
from tests.bench.samples import HW


def full_result() -> BenchResult:
    tau, rate = acceptance_from_counters(200, 3200, 1300)
    return BenchResult(
        system="ddtree",
        mode="ddtree",
        source="native",
        run_id="r1",
        host="gpu1",
        budget=16,
        block_size=16,
        target="t",
        drafter="d",
        hardware=HW,
        command="client --budget 16",
        prompt_set="code",
        temperature=0.6,
        concurrency=1,
        output_len=128,
        num_requests=4,
        failed_requests=0,
        input_tokens=90,
        output_tokens=512,
        duration_s=2.5,
        request_throughput=1.6,
        output_throughput=204.8,
        total_token_throughput=240.8,
        ttft_ms=Latency(1.0, 2.0, 3.0, 4.0),
        tpot_ms=Latency.from_samples([5.0, 6.0]),
        itl_ms=Latency(mean=7.5),
        e2el_ms=Latency(),
        tau=tau,
        acceptance_rate=rate,
        num_drafts=200,
        num_draft_tokens=3200,
        num_accepted_tokens=1300,
        per_position_acceptance=[0.9, 0.5],
        accepted_length_histogram={1: 3, 8: 10},
        started_at="2026-12-02T15:00:00+00:00",
        finished_at="2026-12-02T15:00:02.500000+00:00",
        extra={"anything": [1, {"nested": None}]},
        cell_id="cell-1",
    )


def test_round_trip_through_json_is_lossless():
    result = full_result()
    data = json.loads(json.dumps(result.to_dict()))
    assert data["schema"] == SCHEMA_ID and data["schema_version"] == 1
    assert data["accepted_length_histogram"] == {"1": 3, "8": 10}
    assert data["ttft_ms"] == {"mean": 1.0, "median": 2.0, "p90": 3.0, "p99": 4.0}
    assert BenchResult.from_dict(data) == result


def test_tau_and_rate_come_from_counter_deltas():
    assert acceptance_from_counters(200, 3200, 1300) == (7.5, 1300 / 3200)
    assert acceptance_from_counters(0, 0, 0) == (None, None)
    assert acceptance_from_counters(None, None, None) == (None, None)


def test_latency_percentiles_match_numpy():
    samples = [float(x) for x in np.random.default_rng(0).gamma(2.0, 10.0, size=101)]
    lat = Latency.from_samples(samples)
    assert lat.mean == pytest.approx(np.mean(samples))
    for stat, q in (("median", 50), ("p90", 90), ("p99", 99)):
        assert getattr(lat, stat) == pytest.approx(np.percentile(samples, q))
    assert Latency.from_samples([]) == Latency()


def test_cell_id_names_what_distinguishes_a_cell():
    assert cell_id_for(full_result()) == "ddtree-ddtree-b16-bs16-code-t0.6-c1-o128"
    assert cell_id_for(BenchResult(system="vllm", mode="ar")) == "vllm-ar"


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"system": "trtllm"}, "system", "use one of ddtree, vllm, sglang"),
        ({"mode": "DFlash"}, "mode", "lowercase slug"),
        ({"tau": 0.5}, "tau", ">= 1"),
        ({"acceptance_rate": 40.0}, "acceptance_rate", "<= 1"),
        ({"budget": 0}, "budget", ">= 1"),
        ({"output_throughput": "fast"}, "output_throughput", "expected a number"),
        ({"num_requests": 3.5}, "num_requests", "expected an integer"),
        ({"concurrency": True}, "concurrency", "expected an integer"),
        ({"ttft_ms": {"p95": 3.0}}, "ttft_ms.p95", "did you mean"),
        ({"tpot_ms": {"p99": -1}}, "tpot_ms.p99", ">= 0"),
        ({"hardware": {"gpu": "H200"}}, "hardware.gpu", "unknown field"),
        ({"tua": 2.0}, "tua", "did you mean 'tau'"),
        ({"started_at": "yesterday"}, "started_at", "ISO 8601"),
        ({"cell_id": "a/b"}, "cell_id", "file-name safe"),
        ({"per_position_acceptance": [0.5, 1.5]}, "per_position_acceptance[1]", "<= 1"),
        ({"accepted_length_histogram": {"0": 3}}, "accepted_length_histogram.0", ">= 1"),
        ({"accepted_length_histogram": {"two": 3}}, "accepted_length_histogram.two", "integer lengths"),
        ({"tau": 9.0}, "tau", "disagrees with the counters"),
        ({"num_accepted_tokens": 4000}, "num_accepted_tokens", "exceeds"),
        ({"extra": {"rate": float("inf")}}, "extra", "strict JSON"),
        ({"schema_version": 2}, "schema_version", "upgrade specops"),
        ({"schema": "other"}, "schema", "specops bench import"),
    ],
)
def test_invalid_fields_are_named_with_a_fix(change, field, words):
    data = {**full_result().to_dict(), **change}
    with pytest.raises(SchemaError) as err:
        BenchResult.from_dict(data)
    assert err.value.field == field
    assert words in f"{err.value.message} {err.value.hint}"


def test_missing_required_field():
    data = full_result().to_dict()
    del data["mode"]
    with pytest.raises(SchemaError, match="mode: missing required field"):
        BenchResult.from_dict(data)


def test_to_dict_refuses_to_serialize_an_invalid_result():
    with pytest.raises(SchemaError, match="acceptance_rate"):
        BenchResult(system="vllm", mode="dflash", acceptance_rate=62.0).to_dict()


def test_set_field_coerces_text_and_reaches_hardware():
    result = BenchResult(system="vllm", mode="spec")
    for name, text in (
        ("budget", "64"),
        ("temperature", "0"),
        ("mode", "dflash"),
        ("hardware.gpu_name", "H200"),
        ("hardware.gpu_count", "8"),
    ):
        set_field(result, name, text)
    assert (result.budget, result.temperature, result.mode) == (64, 0.0, "dflash")
    assert (result.hardware.gpu_name, result.hardware.gpu_count) == ("H200", 8)
    with pytest.raises(SchemaError, match="cannot read 'sixty' as int"):
        set_field(result, "budget", "sixty")
    with pytest.raises(SchemaError) as err:
        set_field(result, "bugdet", "1")
    assert err.value.hint == "did you mean 'budget'?"
