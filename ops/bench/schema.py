"""The ONE benchmark result schema: what every measured cell is, whoever measured it.

Why: our own load generator, vLLM's ``bench serve`` and SGLang's ``bench_serving`` each report in
their own shape and units. The report, ``fab tune`` and resumed runs must compare them side by
side, so every result is normalized into this record first (``ops/bench/importers.py`` for foreign
files) and written as one JSON file per cell (``ops/bench/store.py``:
``results/<run-id>/<host>/<cell-id>.json``, written atomically).

A result file is one JSON object. Every key below is present when written by ``to_dict``; ``null``
means "not measured / not known". Reading rejects unknown top-level keys (a typo is an error, free
data goes under ``extra``) and files of a newer ``schema_version``.

Identity
    ``schema``            always ``"specops.bench.result"`` (tells result files from other JSON)
    ``schema_version``    ``1``
    ``run_id``            the run directory's name, e.g. ``20261202-150000-bench-1a2b``
    ``host``              inventory host name
    ``cell_id``           file-name-safe id of the matrix cell (``cell_id_for`` builds the default)
What ran
    ``system``            ``ddtree`` (our server) | ``vllm`` | ``sglang``
    ``mode``              ``ar`` | ``dflash`` | ``ddtree`` | ``mtp`` | ``eagle`` | ``eagle3`` | ``ngram``
                          | ``spec`` (speculative, method not recorded) ... (lowercase slug)
    ``source``            who measured it: ``native`` (our client) | ``vllm`` | ``sglang``
    ``budget``            DDTree tree budget B (nodes besides the root); ddtree mode only
    ``block_size``        DFlash block size (drafts per round + 1)
    ``num_speculative_tokens``  draft tokens per step as vLLM/SGLang count them (block_size - 1)
    ``target``, ``drafter``     model names or checkpoint paths
    ``hardware``          ``{gpu_name, gpu_count, compute_cap, driver, cuda, torch}`` from provisioning
                          facts (``nvidia-smi --query-gpu=name,compute_cap,driver_version``)
    ``command``           the exact command line that produced the numbers (secrets redacted)
Workload
    ``prompt_set``        shipped set name (``math``, ``code``, ``chat``), a file name or a dataset
    ``temperature``       sampling temperature (0 = greedy)
    ``concurrency``       the client's limit on in-flight requests (1 = single-request decoding)
    ``output_len``        max tokens asked per request
Totals and throughput
    ``num_requests``      requests completed; ``failed_requests`` requests that failed
    ``input_tokens``, ``output_tokens``   totals over completed requests
    ``duration_s``        wall time of the measured phase (warm-up excluded)
    ``request_throughput`` req/s; ``output_throughput`` output tok/s (THE headline figure);
    ``total_token_throughput`` (input + output) tok/s
Latencies, each ``{"mean", "median", "p90", "p99"}`` in milliseconds (``Latency.from_samples``)
    ``ttft_ms``           time to first token
    ``tpot_ms``           time per output token after the first: (e2el - ttft) / (tokens - 1) per request
    ``itl_ms``            gaps between streamed chunks (a chunk may carry several accepted tokens)
    ``e2el_ms``           request end-to-end latency
Speculation
    ``tau``               mean tokens emitted per target verification = 1 + accepted / drafts
    ``acceptance_rate``   accepted draft tokens / proposed draft tokens, a FRACTION in [0, 1]
                          (vLLM reports a percent; the importer divides by 100)
    ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``  the counter deltas behind tau
                          (vLLM's ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
                          ``..._num_accepted_tokens`` read from /metrics before and after the run;
                          ``acceptance_from_counters`` turns them into tau and the rate)
    ``per_position_acceptance``  fraction of rounds whose draft at position k (0-based) was accepted
    ``accepted_length_histogram``  ``{"k": rounds}``: rounds that emitted k tokens (k >= 1, so the
                          histogram's mean is tau)
When and everything else
    ``started_at``, ``finished_at``  ISO 8601 (UTC for our client; vLLM files carry local time)
    ``extra``             every field of an imported file that has no slot above, kept verbatim

Our client fills a ``BenchResult`` directly (latencies from raw samples, tau from counter deltas)
and hands it to ``store.write_result``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ops.errors import did_you_mean

SCHEMA_ID = "specops.bench.result"
SCHEMA_VERSION = 1
SYSTEMS = ("ddtree", "vllm", "sglang")
SOURCES = ("native", "vllm", "sglang")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
LATENCY_STATS = ("mean", "median", "p90", "p99")
HARDWARE_FIELDS = ("gpu_name", "gpu_count", "compute_cap", "driver", "cuda", "torch")

_SLUG = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_CELL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=+-]*")


class SchemaError(ValueError):
    """One invalid field: ``field`` is its dotted path, ``hint`` the fix. Callers add file and line."""

    def __init__(self, field_path: str, message: str, hint: str | None = None):
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.message = message
        self.hint = hint


@dataclass
class Latency:
    """Summary of one latency metric in milliseconds; None where the source did not report it."""

    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    p99: float | None = None

    @classmethod
    def from_samples(cls, samples_ms: Sequence[float]) -> Latency:
        """Summarize raw samples; percentiles interpolate linearly between ranks (numpy's default)."""
        if not samples_ms:
            return cls()
        ordered = sorted(float(v) for v in samples_ms)
        return cls(
            mean=math.fsum(ordered) / len(ordered),
            median=_percentile(ordered, 50),
            p90=_percentile(ordered, 90),
            p99=_percentile(ordered, 99),
        )


def _percentile(ordered: list[float], q: float) -> float:
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Hardware:
    """GPU host facts recorded beside the numbers, because speedups shift with hardware."""

    gpu_name: str | None = None
    gpu_count: int | None = None
    compute_cap: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None


@dataclass
class BenchResult:
    """One benchmark cell; the module docstring is the field reference."""

    system: str
    mode: str
    source: str = "native"
    run_id: str | None = None
    host: str | None = None
    cell_id: str | None = None
    budget: int | None = None
    block_size: int | None = None
    num_speculative_tokens: int | None = None
    target: str | None = None
    drafter: str | None = None
    hardware: Hardware = field(default_factory=Hardware)
    command: str | None = None
    prompt_set: str | None = None
    temperature: float | None = None
    concurrency: int | None = None
    output_len: int | None = None
    num_requests: int | None = None
    failed_requests: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    duration_s: float | None = None
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    ttft_ms: Latency = field(default_factory=Latency)
    tpot_ms: Latency = field(default_factory=Latency)
    itl_ms: Latency = field(default_factory=Latency)
    e2el_ms: Latency = field(default_factory=Latency)
    tau: float | None = None
    acceptance_rate: float | None = None
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    per_position_acceptance: list[float] | None = None
    accepted_length_histogram: dict[int, int] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (validated first, so nothing invalid is ever written)."""
        validate(self)
        out: dict[str, Any] = {"schema": SCHEMA_ID, "schema_version": SCHEMA_VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (Latency, Hardware)):
                value = dataclasses.asdict(value)
            elif f.name == "accepted_length_histogram" and value is not None:
                value = {str(k): v for k, v in sorted(value.items())}
            elif f.name == "per_position_acceptance" and value is not None:
                value = list(value)
            elif f.name == "extra":
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchResult:
        """Parse and validate one result object; raises SchemaError naming the field."""
        if not isinstance(data, Mapping):
            raise SchemaError("$", f"expected a JSON object, got {type(data).__name__}")
        if data.get("schema") != SCHEMA_ID:
            raise SchemaError(
                "schema",
                f"expected {SCHEMA_ID!r}, got {data.get('schema')!r}",
                "this is not a specops result file; import foreign files with `specops bench import`",
            )
        version = data.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise SchemaError("schema_version", f"expected a positive integer, got {version!r}")
        if version > SCHEMA_VERSION:
            raise SchemaError(
                "schema_version",
                f"version {version} is newer than this specops understands ({SCHEMA_VERSION})",
                "upgrade specops",
            )
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("schema", "schema_version"):
                continue
            if key not in known:
                raise SchemaError(
                    key, "unknown field", did_you_mean(key, sorted(known), "put free-form data under 'extra'")
                )
            kwargs[key] = value
        for name in ("system", "mode"):
            if name not in kwargs:
                raise SchemaError(name, "missing required field")
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "hardware"):
            if name in kwargs:
                kwargs[name] = _nested(name, kwargs[name])
        hist = kwargs.get("accepted_length_histogram")
        if isinstance(hist, Mapping):
            kwargs["accepted_length_histogram"] = _histogram_keys(hist)
        result = cls(**kwargs)
        validate(result)
        return result


def _nested(name: str, value: Any) -> Latency | Hardware:
    kind, keys = (Hardware, HARDWARE_FIELDS) if name == "hardware" else (Latency, LATENCY_STATS)
    if value is None:
        return kind()
    if not isinstance(value, Mapping):
        raise SchemaError(name, f"expected an object with keys {', '.join(keys)}, got {value!r}")
    for key in value:
        if key not in keys:
            raise SchemaError(f"{name}.{key}", "unknown field", did_you_mean(key, sorted(keys)))
    return kind(**value)


def _histogram_keys(hist: Mapping[Any, Any]) -> dict[int, int]:
    out: dict[int, int] = {}
    for key, count in hist.items():
        try:
            length = int(key)
        except (TypeError, ValueError):
            raise SchemaError(
                f"accepted_length_histogram.{key}", "keys must be integer lengths (>= 1)"
            ) from None
        out[length] = count
    return out


# ----------------------------------------------------------------------------- validation
def _number(
    path: str, value: Any, *, integer: bool = False, minimum: float | None = 0, maximum: float | None = None
) -> None:
    if value is None:
        return
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise SchemaError(path, f"expected {'an integer' if integer else 'a number'} or null, got {value!r}")
    if not math.isfinite(value):
        raise SchemaError(path, f"expected a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise SchemaError(path, f"must be >= {minimum:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise SchemaError(path, f"must be <= {maximum:g}, got {value!r}")


def _text(path: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise SchemaError(path, f"expected a string or null, got {value!r}")


INT_FIELDS = (
    "concurrency",
    "output_len",
    "num_requests",
    "failed_requests",
    "input_tokens",
    "output_tokens",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
)
FLOAT_FIELDS = (
    "temperature",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
)
TEXT_FIELDS = ("run_id", "host", "target", "drafter", "command", "prompt_set", "started_at", "finished_at")


def validate(result: BenchResult) -> None:
    """Check every field's type, range and the tau/counter consistency; raise SchemaError."""
    for name, allowed in (("system", SYSTEMS), ("source", SOURCES)):
        if getattr(result, name) not in allowed:
            raise SchemaError(
                name, f"unknown {name} {getattr(result, name)!r}", f"use one of {', '.join(allowed)}"
            )
    if not isinstance(result.mode, str) or not _SLUG.fullmatch(result.mode):
        raise SchemaError("mode", f"expected a lowercase slug like 'ddtree' or 'dflash', got {result.mode!r}")
    if result.cell_id is not None and (
        not isinstance(result.cell_id, str) or not _CELL_ID.fullmatch(result.cell_id)
    ):
        raise SchemaError(
            "cell_id", f"{result.cell_id!r} is not file-name safe", "use letters, digits and . _ = + - only"
        )
    for name in TEXT_FIELDS:
        _text(name, getattr(result, name))
    for name in ("started_at", "finished_at"):
        stamp = getattr(result, name)
        if stamp is not None:
            try:
                datetime.fromisoformat(stamp)
            except ValueError:
                raise SchemaError(
                    name, f"not an ISO 8601 time: {stamp!r}", "write e.g. 2026-12-02T15:00:00+00:00"
                ) from None
    for name in ("budget", "block_size", "num_speculative_tokens"):
        _number(name, getattr(result, name), integer=True, minimum=1)
    for name in INT_FIELDS:
        _number(name, getattr(result, name), integer=True)
    for name in FLOAT_FIELDS:
        _number(name, getattr(result, name))
    _validate_nested(result)
    _number("tau", result.tau, minimum=1)
    _number("acceptance_rate", result.acceptance_rate, maximum=1)
    _validate_acceptance_lists(result)
    _validate_counters(result)
    if not isinstance(result.extra, dict):
        raise SchemaError("extra", f"expected an object, got {result.extra!r}")
    try:
        json.dumps(result.extra, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SchemaError("extra", f"not strict JSON: {exc}", "store NaN/Infinity as strings") from None


def _validate_nested(result: BenchResult) -> None:
    if not isinstance(result.hardware, Hardware):
        raise SchemaError("hardware", f"expected a Hardware object, got {result.hardware!r}")
    for name in HARDWARE_FIELDS:
        value = getattr(result.hardware, name)
        if name == "gpu_count":
            _number("hardware.gpu_count", value, integer=True, minimum=1)
        else:
            _text(f"hardware.{name}", value)
    for metric in LATENCY_METRICS:
        latency = getattr(result, f"{metric}_ms")
        if not isinstance(latency, Latency):
            raise SchemaError(f"{metric}_ms", f"expected a Latency object, got {latency!r}")
        for stat in LATENCY_STATS:
            _number(f"{metric}_ms.{stat}", getattr(latency, stat))


def _validate_acceptance_lists(result: BenchResult) -> None:
    rates = result.per_position_acceptance
    if rates is not None:
        if not isinstance(rates, (list, tuple)):
            raise SchemaError("per_position_acceptance", f"expected a list of fractions, got {rates!r}")
        for i, rate in enumerate(rates):
            _number(f"per_position_acceptance[{i}]", rate, maximum=1)
    hist = result.accepted_length_histogram
    if hist is not None:
        if not isinstance(hist, dict):
            raise SchemaError(
                "accepted_length_histogram", f"expected an object {{length: rounds}}, got {hist!r}"
            )
        for length, count in hist.items():
            _number(f"accepted_length_histogram.{length}", length, integer=True, minimum=1)
            _number(f"accepted_length_histogram.{length}", count, integer=True)


def _validate_counters(result: BenchResult) -> None:
    drafts, proposed, accepted = result.num_drafts, result.num_draft_tokens, result.num_accepted_tokens
    if accepted is not None and proposed is not None and accepted > proposed:
        raise SchemaError(
            "num_accepted_tokens", f"{accepted} accepted exceeds {proposed} proposed draft tokens"
        )
    tau, rate = acceptance_from_counters(drafts, proposed, accepted)
    for name, derived in (("tau", tau), ("acceptance_rate", rate)):
        stored = getattr(result, name)
        if stored is not None and derived is not None and not math.isclose(stored, derived, rel_tol=1e-3):
            raise SchemaError(
                name,
                f"{stored!r} disagrees with the counters, which give {derived:.6g}",
                "fill it with acceptance_from_counters() or leave it null",
            )


def acceptance_from_counters(
    num_drafts: int | None, num_draft_tokens: int | None, num_accepted_tokens: int | None
) -> tuple[float | None, float | None]:
    """(tau, acceptance_rate) from spec-decode counter deltas; None where a divisor is 0 or unknown."""
    tau = rate = None
    if num_accepted_tokens is not None:
        if num_drafts:
            tau = 1 + num_accepted_tokens / num_drafts
        if num_draft_tokens:
            rate = num_accepted_tokens / num_draft_tokens
    return tau, rate
