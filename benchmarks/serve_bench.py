"""Served vs direct generation on the demo pair, /health under load, and how fast a drop frees the engine.

Three figures for issue 17, all on the tiny fitted pair (`ddtree_runtime.tiny`), T=0, EOS ignored:

1. tokens/s of `Engine.generate` in this process (what `python -m ddtree_runtime generate` reports)
   against one warmed, non-streamed `/v1/chat/completions` per request through a real server
   (`python -m ddtree_runtime serve --modes ar,dflash,ddtree`), per mode, in `--runs` turns of
   shuffled order, the median of each turn's ratio; the goal is served within 10% of direct.
   Beside it, what serving adds per request: the client's time minus the engine's own time in
   the server's log line (`engine_s`);
2. `/health` latency (p50, p99, max) while `--clients` streaming clients keep the engine busy; the
   goal is p99 under 50 ms with 16 clients;
3. a non-streamed request dropped mid-generation, nine times per mode: how long the engine ran on
   after the server saw the client gone (its log, read without touching the server), in rounds
   (the mean inter-round time from `vllm:inter_token_latency_seconds`), and the median; goal: one
   round.

Direct runs twice per turn: with torch's default CPU threads (what the `generate` CLI uses) and with
the server's default (every core but one, `--threads`).

    PYTHONPATH=. .venv/bin/python benchmarks/serve_bench.py [--pair DIR] [--runs 15] [--clients 16]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from ddtree_runtime.engine import Engine
from ddtree_runtime.loader import default_threads, load_pair
from ddtree_runtime.tiny import write_tiny_pair
from ddtree_runtime.tokenizer import Tokenizer
from specops_contract import MODES

PROMPT, TOKENS, BUDGET, MAX_CONTEXT = "the city", 64, 16, 4096
CHAT = "/v1/chat/completions"
PROBE = """
import http.client, json, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
time.sleep(1.0)  # let the queue fill
conn, out, end = http.client.HTTPConnection("127.0.0.1", port, timeout=60), [], time.monotonic() + seconds
while time.monotonic() < end:
    began = time.perf_counter()
    conn.request("GET", "/health")
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 200, resp.status
    out.append(time.perf_counter() - began)
    time.sleep(0.02)
print(json.dumps(out))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    target: Path, drafter: Path, port: int, log: Path, flags: list[str]
) -> subprocess.Popen[bytes]:
    """`python -m ddtree_runtime serve` on the CPU at 127.0.0.1:`port` with `flags`, logging to `log`."""
    args = [sys.executable, "-m", "ddtree_runtime", "serve", "--target", str(target), "--drafter",
            str(drafter), "--device", "cpu", "--port", str(port), *flags]  # fmt: skip
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


def log_records(log: Path, **match: str) -> list[dict]:
    """The server log's JSON lines whose fields equal `match`, oldest first."""
    lines = filter(None, log.read_text().splitlines())
    return [e for e in map(json.loads, lines) if all(e.get(k) == v for k, v in match.items())]


def served(conn: http.client.HTTPConnection, mode: str, tokens: int, log: Path) -> tuple[float, float]:
    """One non-streamed chat completion over a keep-alive stdlib connection (the lightest client,
    so the figure is the server's): (tokens/s at the client, seconds the server added to the
    engine's own generation time, from the request's log line)."""
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": PROMPT}],
                       "max_tokens": tokens, "ignore_eos": True, "temperature": 0, "mode": mode})  # fmt: skip
    seen = len(log_records(log, path=CHAT))
    began = time.perf_counter()
    conn.request("POST", CHAT, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    seconds = time.perf_counter() - began
    assert resp.status == 200, data
    end = time.monotonic() + 10
    while len(records := log_records(log, path=CHAT)) == seen:  # the line is written after the last byte
        assert time.monotonic() < end, "no log line for the request"
        time.sleep(0.001)
    return data["usage"]["completion_tokens"] / seconds, seconds - records[seen]["engine_s"]


def compare(engine: Engine, ids: list[int], port: int, log: Path, runs: int) -> None:
    """Direct with torch's default threads (what `generate` uses) and with the server's count,
    against served, per mode (see `compare_mode`)."""
    default, served_threads = torch.get_num_threads(), default_threads()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    order = random.Random(0)
    print(f"{'mode':8} {f'direct {default} thr':>14} {f'direct {served_threads} thr':>14} "
          f"{'served':>8} {'served/direct':>14} {'served/direct same thr':>23} "
          f"{'serving adds (ms/request)':>26}")  # fmt: skip
    for mode in MODES:
        direct, tps, added = compare_mode(
            engine, ids, conn, log, mode, (default, served_threads), runs, order
        )
        d, d1, s = (statistics.median(x) for x in (*direct, tps))
        # ratios per turn, then their median: the box's slow spells last longer than a turn
        r, r1 = (statistics.median(a / b for a, b in zip(tps, x, strict=True)) for x in direct)
        print(f"{mode:8} {d:14.0f} {d1:14.0f} {s:8.0f} {r:13.2f}x {r1:22.2f}x "
              f"{statistics.median(added) * 1e3:26.2f}", flush=True)  # fmt: skip
    conn.close()
    torch.set_num_threads(default)


def compare_mode(
    engine: Engine,
    ids: list[int],
    conn: http.client.HTTPConnection,
    log: Path,
    mode: str,
    threads: tuple[int, int],
    runs: int,
    order: random.Random,
) -> tuple[list[list[float]], list[float], list[float]]:
    """`runs` turns of: direct at each thread count, and served; each side runs a short warm-up
    generation just before its timed one, and the order is shuffled every turn, so no side gains
    from having had the cores (and caches) last or always follows another. Returns tokens/s
    direct (one list per thread count) and served, and what serving added per request (seconds)."""
    direct: list[list[float]] = [[] for _ in threads]
    tps: list[float] = []
    added: list[float] = []

    def run_direct(side: int) -> None:
        torch.set_num_threads(threads[side])
        engine.generate(ids, mode=mode, budget=BUDGET, max_new_tokens=8, eos_ids=())
        r = engine.generate(ids, mode=mode, budget=BUDGET, max_new_tokens=TOKENS, eos_ids=())
        direct[side].append(r.tokens_per_s)

    def run_served() -> None:
        served(conn, mode, 8, log)
        t, a = served(conn, mode, TOKENS, log)
        tps.append(t)
        added.append(a)

    sides = [*(functools.partial(run_direct, i) for i in range(len(threads))), run_served]
    for _ in range(runs):
        order.shuffle(sides)
        for side in sides:
            side()
    return direct, tps, added


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

    # the prober is a process of its own: in this one it would wait on this loop and its GIL
    port = int(base.rsplit(":", 1)[1])
    prober = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROBE, str(port), str(seconds - 1.0), stdout=asyncio.subprocess.PIPE
    )
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        await asyncio.gather(*(streamer(client) for _ in range(clients)))
    latencies = json.loads((await prober.communicate())[0])
    q = statistics.quantiles(latencies, n=100)
    print(
        f"/health under {clients} streaming clients for {seconds:.0f} s ({streamed} streams done): "
        f"{len(latencies)} probes, p50 {q[49] * 1e3:.1f} ms, p99 {q[98] * 1e3:.1f} ms, "
        f"max {max(latencies) * 1e3:.1f} ms",
        flush=True,
    )


def drop_frees(port: int, mode: str, log: Path) -> float:
    """A raw socket sends a long non-streamed request and closes mid-generation. The engine's
    freeing is read from the server's log (the worker writes a "cancelled" line once it is free),
    not by polling /metrics, whose scrapes would compete with the engine for the GIL. The rounds'
    own gaps give the round time. Returns how many rounds the engine ran on after the server saw
    the client gone."""
    body = json.dumps(
        {"model": "tiny", "prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True, "mode": mode}
    )
    probe = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def scrape() -> str:
        probe.request("GET", "/metrics")
        return probe.getresponse().read().decode()

    itl = "vllm:inter_token_latency_seconds"
    before = scrape()
    seen = len(log_records(log, event="cancelled"))
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        while metric(scrape(), "vllm:num_requests_running") != 1:
            time.sleep(0.01)
        time.sleep(0.2)  # tokens are flowing
    dropped = time.perf_counter()  # the socket is closed
    while len(events := log_records(log, event="cancelled")) == seen:
        time.sleep(0.001)
    logged = time.perf_counter() - dropped
    text = scrape()
    assert metric(text, "vllm:num_requests_running") == 0
    engine_s = events[-1]["engine_freed_after_s"]
    rounds = metric(text, f"{itl}_count") - metric(before, f"{itl}_count")
    round_s = (metric(text, f"{itl}_sum") - metric(before, f"{itl}_sum")) / rounds
    print(
        f"dropped non-streamed {mode} request: the server logged the engine free {logged * 1e3:.1f} ms "
        f"after the close, {engine_s * 1e3:.2f} ms after it saw the client gone; its rounds took "
        f"{round_s * 1e3:.2f} ms each: {engine_s / round_s:.2f} rounds",
        flush=True,
    )
    return engine_s / round_s


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
    flags = ["--dtype", "float32", "--modes", ",".join(MODES), "--mode", "ddtree", "--budget", str(BUDGET),
             "--max-context", str(MAX_CONTEXT), "--served-model-name", "tiny"]  # fmt: skip
    proc = start_server(pair.target, pair.drafter, port, log, flags)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=120) as client:
            wait_ready(client, proc, log)
        compare(engine, ids, port, log, args.runs)
        asyncio.run(health_under_load(base, args.clients, args.seconds))
        for mode in ("ar", "ddtree"):
            rounds = [drop_frees(port, mode, log) for _ in range(9)]
            print(
                f"{mode}: the engine ran on for a median {statistics.median(rounds):.2f} rounds after the drop"
            )
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
