"""`python -m ddtree_runtime serve`: bind, load and warm, serve, drain.

1. bind (127.0.0.1 by default) and log `listening` before the first request can be answered; the
   HTTP loop answers at once: `/health` is 503 until the pair is loaded AND every (mode, budget)
   the server allows has been warmed (kernels compiled, caches touched), then 200;
2. serve (`app`); the engine runs on its own thread (`worker`), with every core but one on CPU, so
   the HTTP loop keeps a core and never waits behind the engine's threads;
3. on SIGTERM (or SIGINT): stop accepting connections, answer 503 on the open ones, let in-flight
   and queued requests finish for up to `--drain-timeout` seconds (a second signal cuts that
   short), cancel the rest, exit 0.

Settings come from flags, else from `--env-file`, else defaults (`settings`); nothing from that
file is ever logged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import torch
import uvicorn

from ddtree_runtime.batching import BatchEngine
from ddtree_runtime.budgets import BudgetPolicy, CostTable, CostTableError
from ddtree_runtime.config import ConfigError, read_json
from ddtree_runtime.engine import FP8_DRAFT_HEAD, Engine, GenerationError
from ddtree_runtime.host_memory import keep_freed_memory
from ddtree_runtime.loader import load_pair
from ddtree_runtime.quant import Fp8Linear
from ddtree_runtime.server.app import build_app
from ddtree_runtime.server.connections import (
    accept_backlog,
    connection_cap,
    guarded_protocol,
    raise_open_file_limit,
)
from ddtree_runtime.server.events import EventLog
from ddtree_runtime.server.metrics import Metrics
from ddtree_runtime.server.protocol.validation import Limits
from ddtree_runtime.server.settings import SettingsError, settings_from
from ddtree_runtime.server.state import State
from ddtree_runtime.server.worker import BatchWorker, Worker
from ddtree_runtime.tokenizer import Tokenizer
from specops_contract import DEFAULT_MAX_CONTEXT

# generation_config.json keys vLLM applies as request defaults, and their no-op values
GENERATION_KEYS = {"temperature": None, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
APPLIED = ("temperature", "top_p")
SWITCH_S = 0.001


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the drain below owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def generation_defaults(target: str) -> tuple[dict[str, float], dict[str, float]]:
    """(applied, not applied) sampling defaults from the target's generation_config.json."""
    path = Path(target) / "generation_config.json"
    raw = read_json(path) if path.exists() else {}
    found = {k: raw[k] for k in GENERATION_KEYS if raw.get(k) not in (None, GENERATION_KEYS[k])}
    return {k: v for k, v in found.items() if k in APPLIED}, {
        k: v for k, v in found.items() if k not in APPLIED
    }


def pairs(modes: tuple[str, ...], budgets: tuple[int, ...], default_budget: int) -> list[tuple[str, int]]:
    """Every (mode, budget) a request may pick; the budget only varies for ddtree."""
    return [(m, b) for m in modes for b in (budgets if m == "ddtree" else (default_budget,))]


def load(st: State) -> Engine:
    """The pair, its tokenizer and an engine; then the warm-up that /health waits for."""
    s = st.settings
    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SettingsError("--device cuda, but torch sees no CUDA device (fix: --device cpu)")
    if device.type == "cpu":
        keep_freed_memory()
        if s.threads:
            torch.set_num_threads(s.threads)
    dtype = getattr(torch, str(s.dtype))
    policy = None
    if s.budget_policy == "load":  # a bad cost table fails before the pair loads
        try:
            policy = BudgetPolicy(s.budgets, CostTable.load(s.cost_table) if s.cost_table else None)
        except CostTableError as e:
            raise SettingsError(f"--cost-table {e}") from None
    tokenizer = Tokenizer(s.target)
    spec = any(m != "ar" for m in s.modes)
    target, drafter = load_pair(s.target, s.drafter if spec else None, device, dtype)
    max_context = s.max_context or min(target.config.max_position_embeddings, DEFAULT_MAX_CONTEXT)
    fp8_head = FP8_DRAFT_HEAD[s.draft_head]
    if s.max_batch > 1:
        engine: Engine = BatchEngine(
            target,
            drafter,
            max_context,
            s.max_batch,
            prefill_chunk=s.prefill_chunk,
            policy=policy,
            fp8_draft_head=fp8_head,
        )
    else:
        engine = Engine(target, drafter, max_context, fp8_draft_head=fp8_head)
    block = drafter.config.block_size if drafter is not None else 2
    applied, ignored = generation_defaults(s.target)
    st.log.write(
        "generation_defaults", applied=applied, not_applied=ignored, overridden_by_flag=s.temperature
    )
    longest = max(len(t) for t in tokenizer.tok.get_vocab())
    limits = Limits(
        model=st.model,
        max_context=max_context,
        vocab_size=target.config.vocab_size,
        block_size=block,
        modes=s.modes,
        budgets=s.budgets,
        default_mode=s.mode,
        default_budget=s.budget,
        default_temperature=s.temperature if s.temperature is not None else applied.get("temperature", 0.0),
        default_top_p=applied.get("top_p", 1.0),
        max_prompt_chars=max_context * longest,
    )
    warm_ids = tokenizer.encode("Hello, world") or [0]
    allowed = pairs(s.modes, s.budgets, s.budget)
    for mode, budget in allowed:
        if len(warm_ids) + 2 * block + limits.rows(mode, budget) > max_context:
            raise SettingsError(
                f"--mode {mode} --budget {budget} needs {limits.rows(mode, budget)} cache rows per verify "
                f"round, which leaves no room in --max-context {max_context} (fix: lower --budgets or "
                "raise --max-context)"
            )
    began = time.perf_counter()
    try:
        engine.warmup(modes=s.modes, budgets=s.budgets)  # CUDA graphs per mode and budget on a GPU
    except GenerationError as e:
        raise SettingsError(f"the warm-up generation was refused: {e}") from None
    head = "fp8" if isinstance(engine.draft_head, Fp8Linear) else "target"
    st.log.write("warmed", seconds=round(time.perf_counter() - began, 3), pairs=allowed, draft_head=head)
    st.tokenizer, st.limits = tokenizer, limits
    st.metrics = Metrics(st.model, spec, block - 1)
    # Everything made so far lives as long as the server: take it out of the collector's sight, or
    # every full collection walks it (over 100 ms with torch loaded) and stalls requests and /health.
    gc.collect()
    gc.freeze()
    return engine


async def drain(st: State, server: _Server, worker: Worker, hurry: asyncio.Event) -> None:
    """Stop accepting, let in-flight requests finish (bounded), cancel the rest, and wait for the
    engine thread to leave its round (exiting under a running torch op aborts the process)."""
    st.state = "draining"
    for listener in server.servers:
        listener.close()  # new connections are refused; open ones get 503
    waiting, running = st.scheduler.counts()
    st.log.write("draining", waiting=waiting, running=running, timeout_s=st.settings.drain_timeout)
    deadline = time.monotonic() + st.settings.drain_timeout
    while st.inflight and not hurry.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    drained = st.inflight == 0
    if not drained:
        st.scheduler.cancel_all()
        end = time.monotonic() + 5.0
        while st.inflight and time.monotonic() < end:
            await asyncio.sleep(0.05)
    worker.stop.set()
    await asyncio.to_thread(worker.join, 60)
    st.log.write("stopped", drained=drained)


async def serve(st: State, sock: socket.socket, backlog: int, max_connections: int) -> int:
    loop = asyncio.get_running_loop()
    stopping, hurry = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        (hurry if stopping.is_set() else stopping).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    config = uvicorn.Config(
        build_app(st),
        log_config=None,
        access_log=False,
        lifespan="off",
        # h11 (httptools frames streams to HTTP/1.0 clients as chunked), with a deadline for each
        # request's headers and a cap on open connections (connections.py)
        http=guarded_protocol(st.settings.header_timeout, max_connections),
        backlog=backlog,
        timeout_keep_alive=60,
        timeout_graceful_shutdown=5,
        server_header=False,
    )
    st.log.capture("uvicorn", "uvicorn.error", "uvicorn.access", "asyncio")
    server = _Server(config)
    http = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        engine = await asyncio.to_thread(load, st)
    except (ConfigError, GenerationError, SettingsError) as e:
        print(f"error: {e}", file=sys.stderr)
        st.log.write("failed", error=str(e))
        server.should_exit = True
        await http
        return 2
    assert st.metrics is not None and st.tokenizer is not None and st.limits is not None
    limits = st.limits
    parts = (
        st.scheduler,
        st.metrics,
        st.tokenizer.decode,
        lambda mode, budget: budget if mode == "ddtree" else limits.block_size - 1,
        st.log,
    )
    worker = BatchWorker(engine, *parts) if isinstance(engine, BatchEngine) else Worker(engine, *parts)
    worker.start()
    if not stopping.is_set():
        st.state = "ready"
        st.log.write("ready", max_context=limits.max_context)
    await stopping.wait()
    await drain(st, server, worker, hurry)
    server.should_exit = True
    await http
    return 0


def _version() -> str:
    try:
        return metadata.version("specops")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def run(args: argparse.Namespace) -> int:
    """The `serve` command; exit 0 after a drain, 2 on bad settings or a pair that cannot load."""
    log = EventLog(sys.stderr)
    try:
        settings = settings_from(args)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    st = State(settings, log, _version())
    open_files = raise_open_file_limit()  # connections.py: the listen queue and the cap fit in it
    backlog = accept_backlog(open_files)
    try:
        sock = socket.create_server((settings.host, settings.port), backlog=backlog)
        # accepted connections inherit it: a response's head and body go out without waiting for
        # the client's delayed ACK (40 ms per keep-alive request otherwise; asyncio only sets it on
        # sockets it created itself)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as e:
        print(
            f"error: cannot listen on {settings.host}:{settings.port}: {e.strerror} "
            "(fix: pick another --port or stop what holds it)",
            file=sys.stderr,
        )
        return 2
    host, port = sock.getsockname()[:2]
    max_connections = settings.max_connections or connection_cap(open_files)
    # the socket already listens; log that before serving, so no request line can come first
    log.write(
        "listening",
        host=host,
        port=port,
        pid=os.getpid(),
        model=st.model,
        mode=settings.mode,
        budget=settings.budget,
        modes=settings.modes,
        budgets=settings.budgets,
        device=settings.device,
        dtype=settings.dtype,
        threads=settings.threads,
        max_context=settings.max_context,
        queue_size=settings.queue_size,
        max_batch=settings.max_batch,
        prefill_chunk=settings.prefill_chunk,
        budget_policy=settings.budget_policy,
        max_connections=max_connections,
        header_timeout=settings.header_timeout,
        api_key=settings.api_key_routes if settings.api_key else None,
    )
    # the engine thread runs Python between torch ops; hand the GIL to the HTTP loop within 1 ms
    # (not Python's 5 ms), or every /health under load waits several switch intervals
    sys.setswitchinterval(SWITCH_S)
    code = asyncio.run(serve(st, sock, backlog, max_connections))
    # load() froze the model's objects out of the collector's sight; frozen at exit, Triton's
    # bindings report them as leaks (31 non-JSON lines on stderr): hand them back first
    gc.unfreeze()
    return code
