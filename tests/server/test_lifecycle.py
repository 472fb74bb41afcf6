"""Queueing and shutdown on the `small` server (ar, queue of 2): a full queue answers 503 with
Retry-After, a client that leaves frees its place at once, SIGTERM drains then exits 0.

Nothing here depends on speed: long requests (thousands of tokens) only need to outlast a few HTTP
round trips, and are cut short by the test (a client leaving, a second SIGTERM), never waited for.
The SIGTERM test must stay last in this file.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.server.client import Pending, Server, sse_events, stream_text, until

LONG = 3900  # ar on the tiny pair: seconds of tokens, far more than any step below needs


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, Any]:
    conn.request("GET", path)
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def _waiting(n: int) -> Callable[[dict[str, float]], bool]:
    return lambda m: m["vllm:num_requests_waiting"] == n


def test_queue_full_then_leaving_clients_free_their_places(small_server: Server) -> None:
    s = small_server
    short = {"prompt": "the city of", "max_tokens": 5}
    ref = s.post("/v1/completions", short)[1]["choices"][0]["text"]
    before = s.metrics()
    assert "vllm:spec_decode_num_drafts_total" not in before  # ar serves no drafts
    running = Pending(s, {**short, "max_tokens": LONG, "stream": True, "ignore_eos": True}).first_event()
    queued = [Pending(s, short), Pending(s, short)]
    until(s, _waiting(2))
    status, headers, data = s.request("POST", "/v1/completions", short)
    assert status == 503 and headers["retry-after"] == "1"
    assert json.loads(data)["error"]["code"] == "queue_full"

    queued[0].leave()  # a waiting client leaves: its place is free at once
    until(s, _waiting(1))
    late = Pending(s, short)
    until(s, _waiting(2))
    running.leave()  # the running client leaves: its generation stops at the end of the round
    for pending in (queued[1], late):
        status, data = pending.body()
        assert status == 200 and json.loads(data)["choices"][0]["text"] == ref
    key = 'vllm:request_success_total{finished_reason="abort"}'
    idle = lambda m: m["vllm:num_requests_waiting"] == m["vllm:num_requests_running"] == 0  # noqa: E731
    after = until(s, lambda m: idle(m) and m[key] - before[key] == 2)  # the two that left, once each
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < LONG


def test_dropped_non_streamed_request_frees_the_engine(small_server: Server) -> None:
    """Tokens flowing or not, a client that hangs up is noticed, its generation is cancelled at the
    next round, and it counts as aborted (issue 17, defect 1)."""
    s = small_server
    key = 'vllm:request_success_total{finished_reason="abort"}'
    before = s.metrics()
    dropped = Pending(s, {"prompt": "the city of", "max_tokens": LONG, "ignore_eos": True})
    until(s, lambda m: m["vllm:num_requests_running"] == 1)
    dropped.leave()
    after = until(s, lambda m: m["vllm:num_requests_running"] == 0 and m[key] - before[key] == 1)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert 0 < generated < LONG / 2
    assert (
        after['vllm:request_success_total{finished_reason="length"}']
        == before['vllm:request_success_total{finished_reason="length"}']
    )
    status, body = s.post("/v1/completions", {"prompt": "the city of", "max_tokens": 3})
    assert status == 200 and body["usage"]["completion_tokens"] == 3
    log = [json.loads(line) for line in s.log.read_text().splitlines() if line.startswith("{")]
    record = next(e for e in reversed(log) if e.get("max_tokens") == LONG)
    assert record["status"] == 499 and record["finish_reason"] == "abort" and record["disconnected"]
    cancelled = next(e for e in log if e["event"] == "cancelled" and e["job"] == record["job"])
    # the engine stops at the end of the round it was in: at most one round's tokens after the abort
    assert 0 <= cancelled["tokens"] - record["completion_tokens"] <= 1  # ar: one token per round


def test_sigterm_drains_in_flight_requests_then_exits(small_server: Server) -> None:
    s = small_server
    first = Pending(s, {"prompt": "the city of", "max_tokens": 1000, "stream": True, "ignore_eos": True})
    first.first_event()
    queued = Pending(s, {"prompt": "his time was", "max_tokens": 10})
    until(s, _waiting(1))  # one at a time: the queue is FIFO by arrival
    last = Pending(s, {"prompt": "the", "max_tokens": LONG, "stream": True, "ignore_eos": True})
    until(s, _waiting(2))
    kept = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)  # keep-alive, open before SIGTERM
    assert _get(kept, "/health")[0] == 200
    s.proc.send_signal(signal.SIGTERM)

    end = time.monotonic() + 30
    while (health := _get(kept, "/health")) != (503, {"status": "draining"}):  # new work is refused
        assert time.monotonic() < end, health
        time.sleep(0.05)
    kept.request("POST", "/v1/completions", json.dumps({"prompt": "the", "max_tokens": 1}))
    refused = kept.getresponse()
    assert refused.status == 503 and "draining" in json.loads(refused.read())["error"]["message"]
    kept.close()
    status, data = first.body()  # in flight: finishes whole
    events = sse_events(data)
    assert status == 200 and events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert len(stream_text(events, chat=False).split()) == 1000
    status, data = queued.body()  # queued before SIGTERM: still served
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 10
    last.first_event()  # running now; a second SIGTERM cuts the drain short
    s.proc.send_signal(signal.SIGTERM)
    status, data = last.body()
    cut = sse_events(data)
    assert status == 200 and cut[-1] == "[DONE]" and "shutting down" in cut[-2]["error"]["message"]
    assert 0 < len(stream_text(cut, chat=False).split()) < LONG
    assert s.proc.wait(60) == 0
    log = [json.loads(line) for line in s.log.read_text().splitlines() if line.startswith("{")]
    assert [e["event"] for e in log if e["event"] in ("draining", "stopped")] == ["draining", "stopped"]
    assert log[-1]["event"] == "stopped" and log[-1]["drained"] is False
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", s.port), timeout=5).close()
