"""Issue 27 on the real server: half-open connections cannot keep `/health` from answering, the API
key guards `/v1/*` only, the tokenizer's own special tokens and a missing chat template are
handled as vLLM handles them, and the server's output is JSON lines from start to exit."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from ddtree_runtime.tokenizer import Tokenizer
from tests.server.client import REPO, Server
from tests.server.conftest import API_KEY, BOS, HEADER_TIMEOUT, MODEL, OPEN_FILES, Launched

C, CHAT = "/v1/completions", "/v1/chat/completions"
HALF_OPEN = OPEN_FILES + 76  # more than the server's open-file limit allows
KEY = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}


def test_the_api_key_guards_v1_and_leaves_health_and_metrics_open(guarded_server: Server) -> None:
    s = guarded_server
    status, headers, data = s.request("GET", "/v1/models")
    error = json.loads(data)["error"]
    assert status == 401 and headers["www-authenticate"] == "Bearer" and error["code"] == "invalid_api_key"
    wrong = {**KEY, "Authorization": f"Bearer {API_KEY[:-1]}x"}
    assert s.request("GET", "/v1/models", headers=wrong)[0] == 401
    assert s.request("POST", C, {"prompt": "the", "max_tokens": 1})[0] == 401
    assert s.request("GET", "/v1/models", headers=KEY)[0] == 200
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    assert (
        client.completions.create(model=MODEL, prompt="the city", max_tokens=2).usage.completion_tokens == 2
    )
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="sk-wrong", max_retries=0).models.list()
    for path in ("/health", "/metrics", "/version"):  # operators' routes stay open, as vLLM's
        assert s.request("GET", path)[0] == 200, path
    assert API_KEY not in s.log.read_text()


def _half_open(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the headers never end
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.slow
def test_half_open_connections_never_keep_health_from_answering(
    guarded_server: Server, main_server: Server
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * HALF_OPEN + 256
    if soft < want:  # this test holds more sockets than a login's 1024 allows (CI runs as root)
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    try:
        with ThreadPoolExecutor(32) as pool:
            held = list(pool.map(_half_open, [guarded_server.port] * HALF_OPEN))
        try:
            status, _, body = guarded_server.request("GET", "/health")  # through the crowd
            assert (status, json.loads(body)) == (200, {"status": "ready"})
            # the cap made room by closing the longest idle, not the header deadline (120 s there):
            # most of the crowd is still connected
            still = sum(not _closed_by_server(sock) for sock in held)
            assert OPEN_FILES // 4 < still < HALF_OPEN
        finally:
            for sock in held:
                sock.close()
        listening = json.loads(guarded_server.log.read_text().splitlines()[0])
        assert listening["event"] == "listening" and 0 < listening["max_connections"] < OPEN_FILES

        # main's header deadline is HEADER_TIMEOUT s: a client that never finishes its headers is let go
        slow = _half_open(main_server.port)
        slow.settimeout(HEADER_TIMEOUT + 30)
        assert slow.recv(1) == b""
        slow.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_tokenizers_special_tokens_and_a_model_without_chat_template(
    guarded_server: Server, launched: Launched
) -> None:
    s = guarded_server
    tokenizer = Tokenizer(launched.guarded_target)
    words = tokenizer.encode("the city of")
    status, _, data = s.request("POST", "/tokenize", {"prompt": "the city of"})
    assert status == 200 and json.loads(data)["tokens"] == [BOS, *words]  # vLLM's default for a prompt
    status, _, data = s.request("POST", "/tokenize", {"prompt": "the city of", "add_special_tokens": False})
    assert json.loads(data)["tokens"] == words
    status, _, data = s.request("POST", "/tokenize", {"messages": [{"role": "user", "content": "the"}]})
    error = json.loads(data)["error"]
    assert status == 400 and error["param"] == "messages" and "no chat template" in error["message"]
    body = {"model": MODEL, "prompt": "the city of", "max_tokens": 1}
    status, _, data = s.request("POST", C, body, headers=KEY)
    assert status == 200 and json.loads(data)["usage"]["prompt_tokens"] == len(words) + 1
    status, _, data = s.request("POST", C, {**body, "add_special_tokens": False}, headers=KEY)
    assert json.loads(data)["usage"]["prompt_tokens"] == len(words)


def test_the_benchmark_client_sends_the_key_from_the_env_file(
    guarded_server: Server, launched: Launched
) -> None:
    """`fab bench` runs this client on the host with our server's env file (issue 27, item 6)."""
    argv = ["--url", guarded_server.base_url, "--prompts", "chat", "--num-prompts", "2", "--warmup", "0",
            "--output-len", "2", "--system", "ddtree", "--mode", "ar"]  # fmt: skip
    keyed = subprocess.run(
        [sys.executable, "-m", "ops.bench.client", *argv, "--api-key-env-file", str(launched.guarded_env)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert keyed.returncode == 0, keyed.stderr
    assert json.loads(keyed.stdout)["num_requests"] == 2
    bare = subprocess.run(
        [sys.executable, "-m", "ops.bench.client", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert bare.returncode == 1 and "401" in bare.stderr


def test_every_line_the_server_writes_is_json(guarded_server: Server) -> None:
    """At exit too: frozen objects made Triton's bindings print 31 leak lines (issue 27, item 9)."""
    assert guarded_server.terminate() == 0
    lines = guarded_server.log.read_text().splitlines()
    assert lines and [json.loads(line)["event"] for line in lines][-1] == "stopped"
