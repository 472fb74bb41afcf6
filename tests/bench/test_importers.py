"""`bench import` on files written from vLLM's and SGLang's documented result fields."""

from __future__ import annotations

import json

import pytest

from ops.bench.importers import import_files, read_records
from ops.bench.store import find_results, load_result
from ops.errors import InputFileError
from tests.bench.samples import sglang_record, vllm_record, write_jsonl


def test_vllm_result_is_normalized_and_unknown_fields_kept(tmp_path):
    src = tmp_path / "vllm-dflash.json"
    src.write_text(json.dumps(vllm_record(some_future_field={"x": 1})))
    run = tmp_path / "results" / "run1"
    [path] = import_files("vllm", [src], run, host="gpu1", settings={"mode": "dflash", "prompt_set": "math"})
    r = load_result(path)
    assert path.parent == run / "gpu1" and r.run_id == "run1" and r.host == "gpu1"
    assert (r.system, r.source, r.mode, r.prompt_set, r.concurrency) == ("vllm", "vllm", "dflash", "math", 1)
    assert (r.num_requests, r.failed_requests, r.input_tokens, r.output_tokens) == (32, 0, 1800, 8192)
    assert (r.duration_s, r.request_throughput, r.output_throughput, r.total_token_throughput) == (
        64.0,
        0.5,
        128.0,
        156.125,
    )
    assert r.target == "Qwen/Qwen3-8B"
    assert (r.ttft_ms.mean, r.ttft_ms.median, r.ttft_ms.p90, r.ttft_ms.p99) == (10.0, 10.5, None, 11.5)
    assert (r.e2el_ms.mean, r.e2el_ms.p99) == (40.0, 41.5)
    assert r.acceptance_rate == pytest.approx(0.40)  # percent -> fraction
    assert (r.tau, r.num_drafts, r.num_draft_tokens, r.num_accepted_tokens) == (7.0, 1000, 15000, 6000)
    assert r.per_position_acceptance[:2] == [0.9, 0.8]
    assert (r.finished_at, r.started_at) == ("2026-12-02T15:15:00", "2026-12-02T15:13:56")
    for kept in (
        "some_future_field",
        "std_ttft_ms",
        "backend",
        "num_prompts",
        "request_rate",
        "rtfx",
        "label",
    ):
        assert kept in r.extra
    assert r.extra["some_future_field"] == {"x": 1}
    for consumed in ("duration", "spec_decode_acceptance_rate", "p99_ttft_ms", "model_id", "date"):
        assert consumed not in r.extra


def test_vllm_metadata_names_fields_and_percentiles_are_picked_up(tmp_path):
    record = vllm_record(mode="ddtree", budget="64", temperature="0", p90_tpot_ms=3.25)
    for key in [k for k in record if k.startswith("spec_decode")]:
        del record[key]
    src = tmp_path / "ddtree-via-vllm-bench.json"
    src.write_text(json.dumps(record))
    [path] = import_files("vllm", [src], tmp_path / "run", settings={"system": "ddtree"})
    r = load_result(path)
    assert (r.system, r.source, r.mode, r.budget, r.temperature) == ("ddtree", "vllm", "ddtree", 64, 0.0)
    assert r.tpot_ms.p90 == 3.25 and r.tau is None and r.host == "imported"
    assert path.name == "ddtree-ddtree-b64-t0-c1-ddtree-via-vllm-bench.json"


def test_vllm_mode_defaults_to_ar_or_spec(tmp_path):
    plain = {k: v for k, v in vllm_record().items() if not k.startswith("spec_decode")}
    write_jsonl(tmp_path / "appended.json", [plain, vllm_record()])  # --append-result: one object per line
    paths = import_files("vllm", [tmp_path / "appended.json"], tmp_path / "run")
    assert [load_result(p).mode for p in paths] == ["ar", "spec"]
    assert [p.stem.rsplit("-", 1)[1] for p in paths] == ["L1", "L2"]


def test_sglang_jsonl_lines_become_cells(tmp_path):
    src = write_jsonl(
        tmp_path / "sglang.jsonl",
        [sglang_record(max_concurrency=1), sglang_record(max_concurrency=4, accept_length=None)],
    )
    paths = import_files("sglang", [src], tmp_path / "run", host="gpu2", settings={"mode": "mtp"})
    first, second = (load_result(p) for p in paths)
    assert (first.system, first.source, first.mode, first.tau) == ("sglang", "sglang", "mtp", 3.4)
    assert (first.concurrency, second.concurrency, second.tau) == (1, 4, None)
    assert (first.prompt_set, first.output_len) == ("random", 256)
    assert (first.e2el_ms.mean, first.e2el_ms.median, first.e2el_ms.p99) == (1500.0, 1490.0, 1560.0)
    assert (first.itl_ms.mean, first.itl_ms.p99) == (24.0, 25.5)
    assert first.acceptance_rate is None and first.output_throughput == 163.84
    assert first.extra["concurrency"] == 0.98  # measured, not the limit
    assert first.extra["request_rate"] == "inf"  # Infinity kept as strict JSON
    assert first.extra["p95_itl_ms"] == 9.5 and "random_output_len" not in first.extra


def test_reimport_replaces_cells_instead_of_duplicating(tmp_path):
    src = write_jsonl(tmp_path / "sglang.jsonl", [sglang_record()])
    run = tmp_path / "run"
    assert import_files("sglang", [src], run) == import_files("sglang", [src], run)
    assert len(find_results([run])) == 1


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('{"duration": 1.0,\n "completed": }\n', 2, "invalid JSON"),
        (json.dumps(sglang_record()) + "\n" + "{not json\n", 2, "invalid JSON line"),
        ("[1, 2]\n", 1, "expected a JSON object, got list"),
        (
            "\n\n" + json.dumps(sglang_record(completed="all")) + "\n",
            1,
            "field 'completed': expected an integer",
        ),
        (
            json.dumps(sglang_record()) + "\n" + json.dumps(sglang_record(accept_length=0.2)) + "\n",
            2,
            "field 'accept_length': must be >= 1",
        ),
        (
            json.dumps(sglang_record(mean_ttft_ms=float("nan"))) + "\n",
            1,
            "field 'mean_ttft_ms': expected a finite",
        ),
    ],
)
def test_bad_files_fail_with_file_and_line_and_write_nothing(tmp_path, text, line, words):
    good = write_jsonl(tmp_path / "good.jsonl", [sglang_record()])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    run = tmp_path / "run"
    with pytest.raises(InputFileError) as err:
        import_files("sglang", [good, bad], run)
    message = str(err.value)
    assert message.startswith(f"{bad}:{line}: ") and words in message and "\n" not in message
    assert not run.exists()


def test_bad_settings_and_empty_files_are_reported(tmp_path):
    src = write_jsonl(tmp_path / "s.jsonl", [sglang_record()])
    with pytest.raises(
        InputFileError, match=r"s\.jsonl:1: sglang field '--set budget': cannot read 'big' as int"
    ):
        import_files("sglang", [src], tmp_path / "run", settings={"budget": "big"})
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(InputFileError, match="invalid JSON"):
        read_records(tmp_path / "empty.jsonl")
    with pytest.raises(InputFileError, match="cannot read"):
        read_records(tmp_path / "missing.json")
