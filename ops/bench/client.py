"""Our load generator: streamed ``/v1/completions`` against any OpenAI-compatible server.

Why our own: the same client must measure our DDTree server, vLLM and SGLang identically (over
httpx, pooled keep-alive connections, as vLLM's own benchmark uses aiohttp), and read speculation
where it is counted: the server's ``/metrics``
(vLLM's ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
``..._per_pos``, with or without Prometheus' ``_total``; SGLang's verify-call and generation-token
counters), scraped before and after the measured phase. The deltas give tau = 1 + accepted /
drafts (SGLang: tokens per verify call) and the acceptance rate; warm-up requests run before the
first scrape and count nowhere.

Per request: TTFT (send to first streamed text), ITL (gaps between text chunks; a chunk may carry
several accepted tokens), end-to-end latency, and output tokens from the server's own ``usage``
(``stream_options.include_usage``), so token counts are the server's, never re-tokenized guesses.

On the host (the deployed wheel contains ``ops``)::

    python -m ops.bench.client --url http://127.0.0.1:8000 --prompts math --num-prompts 8 \\
        --concurrency 1 --output-len 128 --system ddtree --mode ddtree --budget 64

prints one result object (``ops/bench/schema.py``) as JSON; ``--out FILE`` also writes it atomically.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

import httpx

from ops.bench.prompts import load_prompts
from ops.bench.schema import SYSTEMS, BenchResult, Latency, acceptance_from_counters
from ops.bench.spec_counters import SpecDelta, parse_spec_counters, spec_delta
from ops.errors import SpecopsError
from ops.service.remote.apikey import auth_headers

REQUEST_TIMEOUT_S = 600.0


class BenchError(RuntimeError):
    """The server refused or broke a request; the message names the URL and what came back."""


# ---------------------------------------------------------------- HTTP through httpx
@dataclass(frozen=True)
class Endpoint:
    base: str  # http://HOST:PORT[/prefix]
    headers: dict[str, str] = field(default_factory=dict)  # the API key, when the server wants one

    @classmethod
    def parse(cls, url: str, key_file: str | None = None) -> Endpoint:
        """``key_file``: the server's env file, whose SPECOPS_SERVE_API_KEY every request sends."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise BenchError(f"--url {url!r}: expected http://HOST:PORT (the server on this host)")
        return cls(url.rstrip("/"), auth_headers(key_file))

    def client(self, connections: int = 4) -> httpx.AsyncClient:
        """One pooled client for a whole measurement (keep-alive, as vLLM's benchmark uses aiohttp)."""
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.AsyncClient(
            base_url=self.base, timeout=REQUEST_TIMEOUT_S, limits=limits, headers=self.headers
        )


async def fetch(client: httpx.AsyncClient, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    """One whole request; returns (status, body text)."""
    resp = await (client.get(path) if body is None else client.post(path, json=body))
    return resp.status_code, resp.text


# ---------------------------------------------------------------- one streamed request
@dataclass
class Sample:
    """One measured request."""

    ttft_s: float | None = None
    e2el_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    chunks: int = 0
    error: str | None = None


async def stream_completion(client: httpx.AsyncClient, payload: dict[str, Any]) -> Sample:
    """POST a streamed completion; time every text chunk; read ``usage`` from the last event."""
    sample = Sample()
    start = time.perf_counter()
    last = None
    async with client.stream("POST", "/v1/completions", json=payload) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode("utf-8", "replace")
            sample.error = f"status {resp.status_code}: {text[:300]}"
            return sample
        pieces = resp.aiter_bytes()
        buffer = b""
        async for piece in pieces:
            buffer += piece
            *lines, buffer = buffer.split(b"\n")
            now = time.perf_counter()
            for raw in lines:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                event = json.loads(data)
                if "error" in event:
                    sample.error = str(event["error"].get("message", event["error"]))
                usage = event.get("usage")
                if usage:
                    sample.prompt_tokens = usage.get("prompt_tokens")
                    sample.output_tokens = usage.get("completion_tokens")
                choices = event.get("choices") or []
                if choices and choices[0].get("text"):
                    sample.chunks += 1
                    if sample.ttft_s is None:
                        sample.ttft_s = now - start
                    else:
                        sample.itl_s.append(now - last)
                    last = now
    sample.e2el_s = time.perf_counter() - start
    if sample.output_tokens is None and sample.error is None:
        sample.output_tokens = sample.chunks  # a server without include_usage: one token per chunk
    return sample


# ---------------------------------------------------------------- the measured phase
@dataclass
class Workload:
    prompts: list[str]
    num_prompts: int
    concurrency: int = 1
    output_len: int = 128
    temperature: float = 0.0
    warmup: int = 1
    ignore_eos: bool = True
    seed: int = 0


@dataclass
class Measured:
    samples: list[Sample]
    duration_s: float
    model: str
    spec: SpecDelta
    started_at: str
    finished_at: str


async def model_id(client: httpx.AsyncClient) -> str:
    status, text = await fetch(client, "/v1/models")
    try:
        return json.loads(text)["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"/v1/models answered {status} without a model id: {text[:200]}") from None


async def scrape(client: httpx.AsyncClient) -> dict[str, Any]:
    status, text = await fetch(client, "/metrics")
    return parse_spec_counters(text) if status == 200 else {}


async def measure(ep: Endpoint, work: Workload) -> Measured:
    """Warm up, scrape, run ``num_prompts`` requests ``concurrency`` at a time, scrape again."""
    if work.num_prompts < 1 or work.concurrency < 1 or work.output_len < 1 or work.warmup < 0:
        raise BenchError("num_prompts, concurrency and output_len must be >= 1, warmup >= 0")
    async with ep.client(work.concurrency + 2) as client:
        return await _measure(client, work)


async def _measure(client: httpx.AsyncClient, work: Workload) -> Measured:
    model = await model_id(client)

    def payload(i: int) -> dict[str, Any]:
        return {
            "model": model,
            "prompt": work.prompts[i % len(work.prompts)],
            "max_tokens": work.output_len,
            "temperature": work.temperature,
            "seed": work.seed + i,
            "stream": True,
            "stream_options": {"include_usage": True},
            **({"ignore_eos": True} if work.ignore_eos else {}),
        }

    for i in range(work.warmup):
        warm = await stream_completion(client, payload(i))
        if warm.error:
            raise BenchError(f"warm-up request failed: {warm.error}")
    before = await scrape(client)
    gate = asyncio.Semaphore(work.concurrency)

    async def one(i: int) -> Sample:
        async with gate:
            try:
                return await asyncio.wait_for(stream_completion(client, payload(i)), REQUEST_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError, httpx.HTTPError, ValueError) as exc:
                return Sample(error=f"{type(exc).__name__}: {exc}")

    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    samples = await asyncio.gather(*(one(i) for i in range(work.num_prompts)))
    duration = time.perf_counter() - t0
    finished = datetime.now(timezone.utc)
    after = await scrape(client)
    return Measured(
        list(samples),
        duration,
        model,
        spec_delta(before, after),
        started.isoformat(timespec="milliseconds"),
        finished.isoformat(timespec="milliseconds"),
    )


def to_result(
    measured: Measured,
    *,
    system: str,
    mode: str,
    work: Workload,
    prompt_set: str,
    command: str | None = None,
    **fields: Any,
) -> BenchResult:
    """Fill a BenchResult from raw samples and counter deltas (``fields``: budget, target, ...)."""
    ok = [s for s in measured.samples if s.error is None]
    out_tokens = sum(s.output_tokens or 0 for s in ok)
    in_tokens = (
        sum(s.prompt_tokens or 0 for s in ok) if all(s.prompt_tokens is not None for s in ok) else None
    )
    dur = measured.duration_s
    spec = measured.spec
    tau, rate = acceptance_from_counters(spec.drafts, spec.draft_tokens, spec.accepted)
    tau = spec.tau if tau is None else tau  # SGLang counts verify calls, not drafts
    errors = [s.error for s in measured.samples if s.error is not None]
    return BenchResult(
        system=system,
        mode=mode,
        source="native",
        prompt_set=prompt_set,
        temperature=work.temperature,
        concurrency=work.concurrency,
        output_len=work.output_len,
        num_requests=len(ok),
        failed_requests=len(errors),
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        duration_s=dur,
        request_throughput=len(ok) / dur if dur > 0 else None,
        output_throughput=out_tokens / dur if dur > 0 else None,
        total_token_throughput=(out_tokens + in_tokens) / dur if dur > 0 and in_tokens is not None else None,
        ttft_ms=Latency.from_samples([1e3 * s.ttft_s for s in ok if s.ttft_s is not None]),
        tpot_ms=Latency.from_samples(
            [
                1e3 * (s.e2el_s - s.ttft_s) / (s.output_tokens - 1)
                for s in ok
                if s.ttft_s is not None and (s.output_tokens or 0) > 1
            ]
        ),
        itl_ms=Latency.from_samples([1e3 * gap for s in ok for gap in s.itl_s]),
        e2el_ms=Latency.from_samples([1e3 * s.e2el_s for s in ok]),
        tau=tau,
        acceptance_rate=rate,
        num_drafts=spec.drafts,
        num_draft_tokens=spec.draft_tokens,
        num_accepted_tokens=spec.accepted,
        per_position_acceptance=spec.per_position,
        accepted_length_histogram=spec.histogram,
        started_at=measured.started_at,
        finished_at=measured.finished_at,
        command=command,
        extra={"served_model": measured.model, **({"errors": errors[:5]} if errors else {})},
        **fields,
    )


# ---------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ops.bench.client", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server, seen from here")
    p.add_argument("--prompts", default="math", help="shipped set (math, code, chat) or a JSONL file")
    p.add_argument("--num-prompts", type=int, default=8, help="measured requests (prompts are cycled)")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    p.add_argument("--output-len", type=int, default=128, help="max_tokens per request")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    p.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let requests stop at EOS (default: always generate --output-len tokens)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system", choices=SYSTEMS, default="ddtree")
    p.add_argument("--mode", default="ddtree", help="ar | dflash | ddtree | mtp | eagle ...")
    for name in ("budget", "block-size", "num-speculative-tokens"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--target")
    p.add_argument("--drafter")
    p.add_argument("--cell-id")
    p.add_argument("--out", help="also write the result JSON here (atomically)")
    p.add_argument(
        "--api-key-env-file", help="the server's env file: its SPECOPS_SERVE_API_KEY goes with every request"
    )
    return p


def run(argv: Sequence[str]) -> dict[str, Any]:
    """Parse ``argv``, measure, return the result's JSON form."""
    args = build_parser().parse_args(argv)
    prompt_set = load_prompts(args.prompts)
    work = Workload(
        [p.text for p in prompt_set.prompts],
        args.num_prompts,
        args.concurrency,
        args.output_len,
        args.temperature,
        args.warmup,
        args.ignore_eos,
        args.seed,
    )
    measured = asyncio.run(measure(Endpoint.parse(args.url, args.api_key_env_file), work))
    command = shlex.join(["python", "-m", "ops.bench.client", *argv])
    result = to_result(
        measured,
        system=args.system,
        mode=args.mode,
        work=work,
        prompt_set=prompt_set.name,
        command=command,
        budget=args.budget,
        block_size=args.block_size,
        num_speculative_tokens=args.num_speculative_tokens,
        target=args.target,
        drafter=args.drafter,
        cell_id=args.cell_id,
    )
    return result.to_dict()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        data = run(list(sys.argv[1:] if argv is None else argv))
    except (BenchError, SpecopsError, OSError, ValueError) as exc:
        print(f"ops.bench.client: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(data, indent=2) + "\n"
    if data.get("num_requests") == 0:
        print(f"ops.bench.client: every request failed: {data['extra'].get('errors')}", file=sys.stderr)
    out = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv)).out
    if out:
        directory = os.path.dirname(os.path.abspath(out))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".client-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, out)
    sys.stdout.write(text)
    return 0 if data.get("num_requests") else 1


if __name__ == "__main__":
    raise SystemExit(main())
