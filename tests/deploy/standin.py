"""A stand-in for vLLM 0.34.0's ``vllm serve`` and SGLang 0.5.23's ``python -m sglang.launch_server``.

vLLM and SGLang cannot be installed here; their lifecycle under ``fab deploy`` is tested against
this instead. It accepts exactly the flags below, each checked against the pinned version's own
sources (vLLM: ``vllm/engine/arg_utils.py``, ``vllm/entrypoints/common/cli_args.py``,
``vllm/config/speculative.py``, ``vllm/v1/attention/backends/registry.py``; SGLang:
``sglang/srt/arg_groups/fields/{model,serving,parallel,observability,spec,schedule}.py``), and
refuses anything else as argparse does (exit 2, "unrecognized arguments"): a subset of what they
take, never a superset. It answers the OpenAI routes (``/v1/models``, ``/v1/completions``), ``/health``
(200 while still "loading", as vLLM's is) and ``/metrics`` with the system's own counter names
(SGLang's only with ``--enable-metrics``).

Speculation is simulated, deterministically: every verify round accepts ``floor(rate * k)`` of its
``k`` drafts, where ``rate`` is the drafter directory's ``standin.json`` ``accept``, else the
``STANDIN_ACCEPT`` environment variable (the 0600 env file), else 0.75. The fixtures install this
file as ``<venv>/bin/vllm`` (vllm) and as the ``sglang.launch_server`` module (sglang)
(``install``), with the package metadata that the release record reads its pins from.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VLLM_METHODS = {"ngram", "draft_model", "suffix", "eagle", "eagle3", "mtp", "dflash", "ngram_gpu", "dspark"}
VLLM_SPEC_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
VLLM_BACKENDS = {"FLASH_ATTN", "TRITON_ATTN", "FLASHINFER", "FLEX_ATTENTION", "TREE_ATTN"}
SGLANG_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"}
LOAD_S = 0.3  # "loading": the port answers, /health is 200, /v1/models lists nothing yet


def vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm", allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", allow_abbrev=False)
    s.add_argument("model_tag")
    s.add_argument("--host")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--served-model-name", nargs="+")
    s.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    s.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    s.add_argument("--max-model-len")
    s.add_argument("--speculative-config", "-sc", type=json.loads)
    s.add_argument("--attention-backend")
    s.add_argument("--api-key", nargs="+")
    s.add_argument("--gpu-memory-utilization", type=float)
    s.add_argument("--max-num-seqs", type=int)
    s.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction)
    s.add_argument("--trust-remote-code", action=argparse.BooleanOptionalAction)
    s.add_argument("--seed", type=int)
    s.add_argument("--kv-cache-dtype")
    return p


def sglang_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang.launch_server", allow_abbrev=False)
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name")
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--dtype")
    p.add_argument("--context-length", type=int)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--api-key")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    return p


def settings(system: str, argv: list[str]) -> dict:
    """What the server runs with, from its command line; a value the real one refuses exits 2."""
    if system == "vllm":
        parser = vllm_parser()
        args = parser.parse_args(argv)
        spec = args.speculative_config or {}
        if spec and (spec.get("method") not in VLLM_METHODS or set(spec) - VLLM_SPEC_KEYS):
            parser.error(f"--speculative-config: invalid {spec}")
        if args.attention_backend and args.attention_backend.upper() not in VLLM_BACKENDS:
            parser.error(f"Unknown attention backend: '{args.attention_backend}'")
        served = (args.served_model_name or [args.model_tag])[0]
        return {
            "model": served,
            "host": args.host or "0.0.0.0",
            "port": args.port,
            "k": spec.get("num_speculative_tokens") or 0,
            "drafter": spec.get("model"),
            "metrics": True,
        }
    parser = sglang_parser()
    args = parser.parse_args(argv)
    algorithm = args.speculative_algorithm
    if algorithm and algorithm.upper() not in SGLANG_ALGORITHMS:
        parser.error(f"--speculative-algorithm: unknown {algorithm}")
    if algorithm == "DFLASH" and not args.speculative_draft_model_path:
        parser.error("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    k = (args.speculative_num_draft_tokens or 4) - 1 if algorithm else 0
    return {
        "model": args.served_model_name or args.model_path,
        "host": args.host,
        "port": args.port,
        "k": k,
        "drafter": args.speculative_draft_model_path,
        "metrics": args.enable_metrics,
    }


class Counters:
    """The speculation counters, as each system names them."""

    def __init__(self, system: str, k: int, rate: float) -> None:
        self.system, self.k, self.accepted_per_round = system, k, math.floor(rate * k)
        self.lock = threading.Lock()
        self.rounds = self.tokens = self.requests = 0

    def generate(self, tokens: int) -> None:
        with self.lock:
            self.requests += 1
            self.tokens += tokens
            if self.k:
                self.rounds += math.ceil(max(tokens - 1, 0) / (1 + self.accepted_per_round))

    def text(self) -> str:
        with self.lock:
            if self.system == "sglang":
                lines = [
                    f'sglang:generation_tokens_total{{model_name="m",is_streaming="false"}} {self.tokens}',
                    f'sglang:num_requests_total{{model_name="m",is_streaming="false"}} {self.requests}',
                ]
                if self.k:
                    lines.append(f'sglang:spec_verify_calls_total{{model_name="m"}} {self.rounds}')
                lines.append(f'sglang:spec_accept_length{{model_name="m"}} {1 + self.accepted_per_round}')
            else:
                lines = [
                    f'vllm:generation_tokens_total{{model_name="m",engine="0"}} {self.tokens}',
                    f'vllm:request_success_total{{model_name="m",engine="0",finished_reason="length"}} {self.requests}',
                ]
                if self.k:
                    lines += [
                        "# TYPE vllm:spec_decode_num_drafts counter",
                        f'vllm:spec_decode_num_drafts_total{{model_name="m",engine="0"}} {self.rounds}',
                        f'vllm:spec_decode_num_draft_tokens_total{{model_name="m",engine="0"}} {self.rounds * self.k}',
                        f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m",engine="0"}} '
                        f"{self.rounds * self.accepted_per_round}",
                    ]
            return "\n".join(lines) + "\n"


def acceptance_rate(drafter: str | None) -> float:
    marker = Path(drafter or "/nonexistent") / "standin.json"
    if marker.is_file():
        return float(json.loads(marker.read_text())["accept"])
    return float(os.environ.get("STANDIN_ACCEPT", "0.75"))


def serve(system: str, argv: list[str]) -> None:
    s = settings(system, argv)
    counters = Counters(system, s["k"], acceptance_rate(s["drafter"]))
    started = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            sys.stderr.write(f"{system} stand-in: {self.command} {self.path}\n")

        def answer(self, status: int, body: object, kind: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def loaded(self) -> bool:
            return time.monotonic() - started > LOAD_S

        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer(200, {})
            elif self.path == "/v1/models":
                self.answer(200, {"object": "list", "data": [{"id": s["model"]}] if self.loaded() else []})
            elif self.path == "/metrics" and s["metrics"]:
                self.answer(200, counters.text(), "text/plain; version=0.0.4")
            else:
                self.answer(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path != "/v1/completions":
                self.answer(404, {"error": "not found"})
            elif not self.loaded():
                self.answer(503, {"error": "loading"})
            elif body.get("model") != s["model"]:
                self.answer(404, {"error": f"model {body.get('model')!r} does not exist"})
            else:
                tokens = int(body.get("max_tokens") or 16)
                counters.generate(tokens)
                usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3}
                self.answer(
                    200, {"object": "text_completion", "choices": [{"text": " x" * tokens}], "usage": usage}
                )

    server = ThreadingHTTPServer((s["host"], s["port"]), Handler)
    sys.stderr.write(f"{system} stand-in on {s['host']}:{s['port']} serving {s['model']}\n")
    sys.stderr.flush()
    server.serve_forever()


PINNED = {"vllm": "0.34.0", "sglang": "0.5.23"}


def install(venv: Path, system: str) -> Path:
    """This stand-in as ``system`` in a venv-shaped folder; returns the venv."""
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    info = site / f"{system}-{PINNED[system]}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {system}\nVersion: {PINNED[system]}\n")
    code = Path(__file__).read_text().replace("serve(SYSTEM, sys.argv", f"serve({system!r}, sys.argv")
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    if system == "vllm":
        entry = venv / "bin" / "vllm"
        entry.write_text(f"#!{sys.executable}\n{code}")
    else:
        (site / "sglang").mkdir(exist_ok=True)
        (site / "sglang" / "__init__.py").write_text("")
        (site / "sglang" / "launch_server.py").write_text(code)
        entry = venv / "bin" / "python"
        entry.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    entry.chmod(0o755)
    return venv


if __name__ == "__main__":
    serve(SYSTEM, sys.argv[1:])  # noqa: F821 (install() names the system in the installed copy)
