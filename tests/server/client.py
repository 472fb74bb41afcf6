"""A running `python -m ddtree_runtime serve` process and plain-socket helpers to talk to it.

Tests speak raw HTTP (http.client) where they need control over the socket (disconnects, bad
bodies) and the official `openai` client where compatibility is the point.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_SpecopsServerTestSecret0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """One torch thread per process: the tiny models are fastest so, and the CI box has two cores."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    health_seen: list[int] = field(default_factory=list)
    early_post: tuple[int, dict[str, str], bytes] | None = None  # a completion sent while loading

    @classmethod
    def start(cls, args: list[str], log: Path, open_files: int | None = None) -> Server:
        """``open_files``: the process's open-file limit, soft and hard (a login's 1024, say)."""

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        port = free_port()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ddtree_runtime", "serve", "--port", str(port), *args],
                cwd=REPO,
                env=child_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=limit if open_files else None,
            )
        return cls(proc, port, log)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, deadline_s: float = 120.0) -> None:
        """Poll /health until 200, recording every status seen on the way."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                status, _, _ = self.request("GET", "/health")
            except OSError:
                time.sleep(0.1)
                continue
            self.health_seen.append(status)
            if status == 503 and self.early_post is None:
                self.early_post = self.request("POST", "/v1/completions", {"prompt": "the", "max_tokens": 1})
            if status == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {deadline_s}s:\n{self.log.read_text()}")

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def post(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        status, _, data = self.request("POST", path, body)
        return status, json.loads(data)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, keyed by `name{labels}` with the model/engine labels dropped."""
        status, _, data = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                name, _, labels = key.partition("{")
                kept = [
                    p
                    for p in labels.rstrip("}").split(",")
                    if p and not p.startswith(("model_name=", "engine="))
                ]
                out[name + (f"{{{','.join(kept)}}}" if kept else "")] = float(value)
        return out

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def sse_events(raw: bytes) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded ("[DONE]" kept as a string)."""
    out = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            payload = block.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def stream_text(events: list[Any], chat: bool) -> str:
    parts = []
    for e in events:
        if isinstance(e, dict) and e.get("choices"):
            c = e["choices"][0]
            parts.append((c["delta"].get("content") or "") if chat else c["text"])
    return "".join(parts)


class Pending:
    """A request sent on its own connection, response not yet read."""

    def __init__(self, server: Server, body: dict[str, Any]) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        self.conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.head = b""
        self.resp: http.client.HTTPResponse | None = None

    def first_event(self) -> Pending:
        """Block until the first streamed event: the request is then running."""
        self.resp = self.conn.getresponse()
        while b"data: " not in self.head:
            self.head += self.resp.read1(4096)
        return self

    def body(self) -> tuple[int, bytes]:
        resp = self.resp or self.conn.getresponse()
        data = self.head + resp.read()
        self.conn.close()
        return resp.status, data

    def leave(self) -> None:
        self.conn.close()


def until(
    server: Server, check: Callable[[dict[str, float]], bool], deadline_s: float = 30.0
) -> dict[str, float]:
    end = time.monotonic() + deadline_s
    while not check(m := server.metrics()):
        assert time.monotonic() < end, f"metrics never matched: {m}"
        time.sleep(0.05)
    return m
