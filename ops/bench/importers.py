"""Foreign benchmark files -> result schema: vLLM ``bench serve`` JSON and SGLang ``bench_serving`` JSONL.

Why: users already benchmark with vLLM's and SGLang's own tools, on hosts we never provisioned;
their numbers belong in the same report as ours. Each record becomes one ``BenchResult`` in
``<run-dir>/<host>/<cell-id>.json``; every field with no slot in the schema is kept under ``extra``.

vLLM (``vllm bench serve --save-result``; ``--append-result`` puts one object per line):
``duration``, ``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``,
``request_throughput``, ``output_throughput``, ``total_token_throughput``, ``model_id`` (-> target),
``max_concurrency`` (-> concurrency), ``date`` (``%Y%m%d-%H%M%S``, the bench host's local time ->
finished_at; started_at = finished_at - duration), ``{mean,median,p90,p99}_{ttft,tpot,itl,e2el}_ms``
(``std_*`` and other percentiles stay in extra), and with speculation
``spec_decode_acceptance_rate`` (a PERCENT -> fraction), ``spec_decode_acceptance_length`` (tau),
``spec_decode_num_drafts``, ``spec_decode_draft_tokens``, ``spec_decode_accepted_tokens``,
``spec_decode_per_position_acceptance_rates``. vLLM copies ``--metadata KEY=VALUE`` pairs to the top
level, so ``--metadata mode=dflash num_speculative_tokens=15 prompt_set=math`` fills those fields.

SGLang (``python -m sglang.bench_serving --output-file F`` appends one object per line):
``duration``, ``completed``, ``total_input_tokens``, ``total_output_tokens``, ``request_throughput``,
``output_throughput``, ``total_throughput``, ``{mean,median,p99}_{ttft,tpot,itl}_ms``,
``{mean,median,p99}_e2e_latency_ms``, ``accept_length`` (tau), ``max_concurrency`` (-> concurrency),
``dataset_name`` (-> prompt_set), ``random_output_len`` / ``sharegpt_output_len`` (-> output_len).
SGLang's ``concurrency`` is the MEASURED mean number of requests in flight, not the limit: it stays
in extra.

Without a recorded mode, a record is ``ar`` when it has no speculation figures and ``spec``
otherwise; ``--set mode=dflash`` (any scalar field, ``hardware.X`` too) names it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ops.bench.cells import SETTABLE, cell_id_for, set_field, slug
from ops.bench.schema import (
    LATENCY_METRICS,
    LATENCY_STATS,
    BenchResult,
    Latency,
    SchemaError,
)
from ops.bench.store import write_result
from ops.errors import InputFileError

FORMATS = ("vllm", "sglang")
DEFAULT_HOST = "imported"


class _Record:
    """One source object being consumed: remembers which source key filled which schema field."""

    def __init__(self, data: dict[str, Any]):
        self.rest = dict(data)
        self.origin: dict[str, str] = {}

    def take(self, key: str, schema_field: str) -> Any:
        if key in self.rest:
            self.origin[schema_field] = key
        return self.rest.pop(key, None)


def read_records(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line, object) pairs from one JSON object, or from JSONL (one object per line)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(path, None, f"cannot read: {exc}") from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise InputFileError(path, exc.lineno, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append((number, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise InputFileError(
                        path,
                        number,
                        f"invalid JSON line: {err.msg} (column {err.colno})",
                        "each line must hold one complete JSON object",
                    ) from None
    else:
        records = [(1, whole)]
    if not records:
        raise InputFileError(path, None, "no benchmark records in the file")
    for number, record in records:
        if not isinstance(record, dict):
            raise InputFileError(path, number, f"expected a JSON object, got {type(record).__name__}")
    return records


def from_vllm(data: dict[str, Any]) -> tuple[BenchResult, dict[str, str]]:
    """One vLLM ``bench serve`` result object -> (result, schema field -> source key)."""
    rec = _Record(data)
    result = BenchResult(system="vllm", mode="ar", source="vllm")
    _take_common(rec, result, throughput_key="total_token_throughput", e2el_key="e2el")
    result.failed_requests = rec.take("failed", "failed_requests")
    result.target = rec.take("model_id", "target")
    result.finished_at, result.started_at = _vllm_times(rec.rest.get("date"), result.duration_s)
    if result.finished_at:
        rec.take("date", "finished_at")
    drafts = result.num_drafts = rec.take("spec_decode_num_drafts", "num_drafts")
    result.num_draft_tokens = rec.take("spec_decode_draft_tokens", "num_draft_tokens")
    result.num_accepted_tokens = rec.take("spec_decode_accepted_tokens", "num_accepted_tokens")
    tau = rec.take("spec_decode_acceptance_length", "tau")
    result.tau = None if drafts == 0 else tau
    rate = rec.take("spec_decode_acceptance_rate", "acceptance_rate")
    result.acceptance_rate = (
        rate / 100 if isinstance(rate, (int, float)) and not isinstance(rate, bool) else rate
    )
    result.per_position_acceptance = rec.take(
        "spec_decode_per_position_acceptance_rates", "per_position_acceptance"
    )
    if result.tau is not None or result.num_drafts:
        result.mode = "spec"
    for key in [k for k in rec.rest if k in SETTABLE]:
        set_field(result, key, rec.take(key, key))
    result.extra = _strict_json(rec.rest)
    return result, rec.origin


def from_sglang(data: dict[str, Any]) -> tuple[BenchResult, dict[str, str]]:
    """One SGLang ``bench_serving`` JSONL object -> (result, schema field -> source key)."""
    rec = _Record(data)
    result = BenchResult(system="sglang", mode="ar", source="sglang")
    _take_common(rec, result, throughput_key="total_throughput", e2el_key="e2e_latency")
    result.tau = rec.take("accept_length", "tau")
    if result.tau is not None:
        result.mode = "spec"
    dataset = rec.rest.get("dataset_name")
    result.prompt_set = rec.take("dataset_name", "prompt_set")
    length_key = (
        "random_output_len"
        if isinstance(dataset, str) and dataset.startswith("random")
        else "sharegpt_output_len"
    )
    if rec.rest.get(length_key) is not None:
        result.output_len = rec.take(length_key, "output_len")
    result.extra = _strict_json(rec.rest)
    return result, rec.origin


def _take_common(rec: _Record, result: BenchResult, *, throughput_key: str, e2el_key: str) -> None:
    result.duration_s = rec.take("duration", "duration_s")
    result.num_requests = rec.take("completed", "num_requests")
    result.input_tokens = rec.take("total_input_tokens", "input_tokens")
    result.output_tokens = rec.take("total_output_tokens", "output_tokens")
    result.request_throughput = rec.take("request_throughput", "request_throughput")
    result.output_throughput = rec.take("output_throughput", "output_throughput")
    result.total_token_throughput = rec.take(throughput_key, "total_token_throughput")
    result.concurrency = rec.take("max_concurrency", "concurrency")
    for metric in LATENCY_METRICS:
        source_name = e2el_key if metric == "e2el" else metric
        stats = {stat: rec.take(f"{stat}_{source_name}_ms", f"{metric}_ms.{stat}") for stat in LATENCY_STATS}
        setattr(result, f"{metric}_ms", Latency(**stats))


def _strict_json(value: Any) -> Any:
    """Python's json writes inf/nan (SGLang's request_rate is inf) as non-standard JSON; keep them
    as the strings "inf", "-inf", "nan" so result files stay strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict_json(v) for v in value]
    return value


def _vllm_times(date: Any, duration: Any) -> tuple[str | None, str | None]:
    """(finished_at, started_at) from vLLM's ``date``; (None, None) when it is absent or unreadable
    (it then stays in extra)."""
    try:
        finished = datetime.strptime(date, "%Y%m%d-%H%M%S")
    except (TypeError, ValueError):
        return None, None
    started = None
    if isinstance(duration, (int, float)) and not isinstance(duration, bool):
        started = (finished - timedelta(seconds=duration)).isoformat(timespec="seconds")
    return finished.isoformat(timespec="seconds"), started


CONVERTERS = {"vllm": from_vllm, "sglang": from_sglang}


def import_files(
    fmt: str,
    files: Sequence[str | Path],
    run_dir: str | Path,
    *,
    host: str = DEFAULT_HOST,
    settings: Mapping[str, str] | None = None,
) -> list[Path]:
    """Convert every record of every file, then write them all; nothing is written if any is bad.

    ``settings`` are ``--set FIELD=VALUE`` overrides applied last. Cell ids default to
    ``cell_id_for(result)`` plus the source file's stem (plus ``-L<line>`` for multi-record files), so
    importing the same file again replaces its cells instead of duplicating them.
    """
    if fmt not in CONVERTERS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    converted: list[BenchResult] = []
    owners: dict[str, str] = {}
    for file in files:
        records = read_records(file)
        for line, data in records:
            origin: dict[str, str] = {}
            try:
                result, origin = CONVERTERS[fmt](data)
                for name, value in (settings or {}).items():
                    origin[name] = f"--set {name}"
                    set_field(result, name, value)
                result.host = host
                result.run_id = Path(run_dir).resolve().name
                result.cell_id = result.cell_id or f"{cell_id_for(result)}-{slug(Path(file).stem)}"
                if len(records) > 1:
                    result.cell_id += f"-L{line}"
                result.to_dict()
            except SchemaError as exc:
                key = origin.get(exc.field, exc.field)
                raise InputFileError(file, line, f"{fmt} field '{key}': {exc.message}", exc.hint) from None
            where = f"{file}:{line}"
            if result.cell_id in owners:
                raise InputFileError(
                    file,
                    line,
                    f"record maps to cell '{result.cell_id}', as {owners[result.cell_id]} does",
                    "import the files separately or give different --set cell_id values",
                )
            owners[result.cell_id] = where
            converted.append(result)
    return [write_result(run_dir, result) for result in converted]
