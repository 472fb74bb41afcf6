"""Served vs direct generation on the demo pair, /health under load, and how fast a drop frees the engine.

Three figures for issue 17, all on the tiny fitted pair (`ddtree_runtime.tiny`), T=0, EOS ignored:

1. tokens/s of `Engine.generate` in this process (what `python -m ddtree_runtime generate` reports)
   against one warmed, non-streamed `/v1/chat/completions` per request through a real server
   (`python -m ddtree_runtime serve --modes ar,dflash,ddtree`), per mode, measured alternately,
   median of `--runs`; the goal is served within 10% of direct;
2. `/health` latency (p50, p99, max) while `--clients` streaming clients keep the engine busy; the
   goal is p99 under 50 ms with 16 clients;
3. a non-streamed request dropped mid-generation: the time until `/metrics` shows the engine free,
   in rounds (the mean inter-round time from `vllm:inter_token_latency_seconds`); goal: one round.

Both sides use their defaults for CPU threads (the CLI: torch's; the server: every core but one).

    PYTHONPATH=. .venv/bin/python benchmarks/serve_bench.py [--pair DIR] [--runs 15] [--clients 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from ddtree_runtime.engine import MODES, Engine
from ddtree_runtime.loader import load_pair
from ddtree_runtime.tiny import write_tiny_pair
from ddtree_runtime.tokenizer import Tokenizer

PROMPT, TOKENS, BUDGET, MAX_CONTEXT = "the city", 64, 16, 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(target: Path, drafter: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "ddtree_runtime", "serve", "--target", str(target), "--drafter",
            str(drafter), "--device", "cpu", "--dtype", "float32", "--port", str(port), "--modes",
            ",".join(MODES), "--mode", "ddtree", "--budget", str(BUDGET), "--max-context", str(MAX_CONTEXT),
            "--served-model-name", "tiny"]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(client: httpx.Client, proc: subprocess.Popen[bytes], log: Path) -> None:
    end = time.monotonic() + 300
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited {proc.returncode}:\n{log.read_text()}")
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("server not ready after 300 s")


def served_tokens_per_s(client: httpx.Client, mode: str) -> float:
    body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS,
            "ignore_eos": True, "temperature": 0, "mode": mode}  # fmt: skip
    began = time.perf_counter()
    out = client.post("/v1/chat/completions", json=body)
    seconds = time.perf_counter() - began
    out.raise_for_status()
    return out.json()["usage"]["completion_tokens"] / seconds


def compare(engine: Engine, ids: list[int], client: httpx.Client, runs: int) -> None:
    print(f"{'mode':8} {'direct tok/s':>13} {'served tok/s':>13} {'served/direct':>14}")
    for mode in MODES:
        direct, served = [], []
        engine.generate(ids, mode=mode, budget=BUDGET, max_new_tokens=TOKENS, eos_ids=())  # warm
        served_tokens_per_s(client, mode)
        for _ in range(runs):  # alternate, so both sides see the same machine load
            r = engine.generate(ids, mode=mode, budget=BUDGET, max_new_tokens=TOKENS, eos_ids=())
            direct.append(r.tokens_per_s)
            served.append(served_tokens_per_s(client, mode))
        d, s = statistics.median(direct), statistics.median(served)
        print(f"{mode:8} {d:13.0f} {s:13.0f} {s / d:13.2f}x", flush=True)


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


async def health_under_load(base: str, clients: int, seconds: float) -> None:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": TOKENS, "ignore_eos": True, "stream": True}
    stop = time.monotonic() + seconds
    streamed = 0

    async def streamer(client: httpx.AsyncClient) -> None:
        nonlocal streamed
        while time.monotonic() < stop:
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                async for _ in resp.aiter_lines():
                    pass
            streamed += 1

    latencies: list[float] = []

    async def prober(client: httpx.AsyncClient) -> None:
        await asyncio.sleep(1.0)  # let the queue fill
        while time.monotonic() < stop:
            began = time.perf_counter()
            assert (await client.get("/health")).status_code == 200
            latencies.append(time.perf_counter() - began)
            await asyncio.sleep(0.02)

    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        await asyncio.gather(prober(client), *(streamer(client) for _ in range(clients)))
    q = statistics.quantiles(latencies, n=100)
    print(
        f"/health under {clients} streaming clients for {seconds:.0f} s ({streamed} streams done): "
        f"{len(latencies)} probes, p50 {q[49] * 1e3:.1f} ms, p99 {q[98] * 1e3:.1f} ms, "
        f"max {max(latencies) * 1e3:.1f} ms",
        flush=True,
    )


async def drop_frees(base: str) -> None:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True, "mode": "ar"}
    async with httpx.AsyncClient(base_url=base, timeout=120) as probe:
        dropper = httpx.AsyncClient(base_url=base, timeout=120)
        task = asyncio.create_task(dropper.post("/v1/completions", json=body))
        while metric((await probe.get("/metrics")).text, "vllm:num_requests_running") != 1:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)  # tokens are flowing
        task.cancel()
        await dropper.aclose()  # the connection closes: the server sees the client gone
        dropped = time.perf_counter()
        while metric((await probe.get("/metrics")).text, "vllm:num_requests_running") != 0:
            await asyncio.sleep(0.001)
        freed = time.perf_counter() - dropped
        text = (await probe.get("/metrics")).text
    itl = metric(text, "vllm:inter_token_latency_seconds_sum") / metric(
        text, "vllm:inter_token_latency_seconds_count"
    )
    print(
        f"dropped non-streamed request: engine free {freed * 1e3:.1f} ms after the client closed "
        f"(mean round {itl * 1e3:.1f} ms incl. other modes; the probe's own scrape takes part of it)",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", help="tiny pair directory (written if missing; default: a temp dir)")
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args()
    pair = write_tiny_pair(Path(args.pair or tempfile.mkdtemp(prefix="serve-bench-")) / "pair")
    print(f"serve_bench: {os.cpu_count()} CPUs, torch {torch.__version__}, pair {pair.target.parent}, "
          f"prompt {PROMPT!r}, {TOKENS} tokens, T=0, EOS ignored, ddtree budget {BUDGET}")  # fmt: skip
    target, drafter = load_pair(pair.target, pair.drafter, torch.device("cpu"), torch.float32)
    engine = Engine(target, drafter, MAX_CONTEXT)
    ids = Tokenizer(pair.target).prompt_ids(PROMPT)
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="serve-bench-log-")) / "server.log"
    proc = start_server(pair.target, pair.drafter, port, log)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=120) as client:
            wait_ready(client, proc, log)
            compare(engine, ids, client, args.runs)
        asyncio.run(health_under_load(base, args.clients, args.seconds))
        asyncio.run(drop_frees(base))
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
