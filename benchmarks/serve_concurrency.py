"""Many streaming clients against our server on the CPU, beside plain batched decoding (issue 25).

On the demo pair (demo_pair/), T=0, EOS ignored, our server started as a user starts it
(`python -m ddtree_runtime serve --device cpu --mode ddtree --budget 16` on 127.0.0.1, the same
`--threads` and `--dtype` as the baseline, then every `--serve-arg`, which wins: e.g.
`--serve-arg=--max-batch=16` for the batched server), three figures:

1. per concurrency (1, 4, 16, 64 streaming clients, `--requests-per-client` requests each, at least
   4, of `--output-len` tokens on the pair's held-out prompts), measured by `fab bench`'s own
   client (`ops.bench.client`): total output tokens/s, tokens/s per client (its tokens over its
   end-to-end time, as the bench report counts it) and TTFT p50/p99;
2. a short request behind a long one: once a long request (a `--long-prompt`-token prompt,
   `--long-tokens` out) runs, a `--short-tokens` request is sent; its time to first token, beside
   the long one's (its prefill) and in rounds (the median gap between streamed chunks at one
   client); the goal is one prefill chunk plus two rounds;
3. plain batched greedy decoding of the same target (transformers' `generate`, after the server has
   stopped, same threads and dtype): tokens/s at batch 1 and `--ar-batch` wide, and the server's
   total at that many clients over it (goal: >= 1).

    PYTHONPATH=. .venv/bin/python benchmarks/serve_concurrency.py [--concurrency 1,4,16,64] \\
        [--serve-arg=--max-batch=16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch

from benchmarks.serve_bench import free_port, metric, start_server, wait_ready
from ddtree_runtime.loader import default_dtype, default_threads
from ddtree_runtime.tokenizer import Tokenizer
from ops.bench.client import Endpoint, Sample, Workload, measure, model_id, stream_completion, to_result
from ops.bench.prompts import load_prompts
from ops.bench.report import per_user_throughput
from ops.bench.schema import BenchResult
from specops_contract import REQUESTS_RUNNING

PAIR = Path(__file__).resolve().parent.parent / "demo_pair"
MIN_REQUESTS = 4


def sweep(ep: Endpoint, prompts: list[str], args: argparse.Namespace) -> dict[int, BenchResult]:
    """One measured cell per concurrency level, as `fab bench` measures a matrix cell."""
    print(f"{'clients':>7} {'requests':>8} {'total tok/s':>11} {'tok/s/client':>12} "
          f"{'TTFT p50 ms':>11} {'TTFT p99 ms':>11} {'failed':>6}")  # fmt: skip
    results = {}
    for clients in args.concurrency:
        work = Workload(
            prompts,
            num_prompts=max(MIN_REQUESTS, args.requests_per_client * clients),
            concurrency=clients,
            output_len=args.output_len,
            warmup=1,
        )
        r = to_result(
            asyncio.run(measure(ep, work)), system="ddtree", mode=args.mode, work=work, prompt_set=""
        )
        results[clients] = r
        print(f"{clients:7d} {work.num_prompts:8d} {r.output_throughput or 0:11.1f} "
              f"{per_user_throughput(r) or 0:12.1f} {r.ttft_ms.median or 0:11.1f} {r.ttft_ms.p99 or 0:11.1f} "
              f"{r.failed_requests:6d}", flush=True)  # fmt: skip
    return results


async def short_behind_long(
    ep: Endpoint, long_prompt: str, short_prompt: str, args: argparse.Namespace
) -> tuple[Sample, Sample]:
    """The long request streams; once the server counts it running (`/metrics`), the short one is sent."""
    async with ep.client(4) as client:
        model = await model_id(client)

        def body(prompt: str, tokens: int) -> dict[str, object]:
            return {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip

        long = asyncio.create_task(stream_completion(client, body(long_prompt, args.long_tokens)))
        while not long.done() and metric((await client.get("/metrics")).text, REQUESTS_RUNNING) < 1:
            await asyncio.sleep(0.005)
        short = await stream_completion(client, body(short_prompt, args.short_tokens))
        return await long, short


def behind_long(
    ep: Endpoint, tok: Tokenizer, prompts: list[str], round_ms: float, args: argparse.Namespace
) -> None:
    """`--trials` short-behind-long pairs; the long prompt is the held-out prompts, cut to length."""
    joined = tok.encode("\n".join(prompts * (1 + args.long_prompt // 32)))
    long_prompt = tok.decode(joined[: args.long_prompt])
    pairs = [asyncio.run(short_behind_long(ep, long_prompt, prompts[0], args)) for _ in range(args.trials)]
    for long, short in pairs:
        if long.error or short.error or short.ttft_s is None or long.ttft_s is None:
            raise SystemExit(f"short-behind-long failed: {long.error or short.error}")
    first = statistics.median(short.ttft_s for _, short in pairs) * 1e3
    prefill = statistics.median(long.ttft_s for long, _ in pairs) * 1e3
    print(f"a {args.short_tokens}-token request sent while a {pairs[0][0].prompt_tokens}-token-prompt, "
          f"{args.long_tokens}-token request runs: first token after {first:.1f} ms "
          f"(median of {args.trials}; {first / round_ms:.1f} rounds of {round_ms:.2f} ms); "
          f"the long one's own first token (its prefill): {prefill:.1f} ms", flush=True)  # fmt: skip


def batched_ar(
    target: Path, tok: Tokenizer, prompts: list[str], args: argparse.Namespace
) -> dict[int, float]:
    """Greedy tokens/s of transformers' `generate` on the target at batch 1 and `--ar-batch`."""
    from transformers import AutoModelForCausalLM  # the baseline only; the server never uses it
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, args.dtype)).eval()
    pad = tok.eos_token_id if tok.eos_token_id is not None else 0

    def generate(rows: list[list[int]], tokens: int) -> None:
        width = max(map(len, rows))
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # left-padded
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                       do_sample=False, pad_token_id=pad)  # fmt: skip

    rates = {}
    for batch in (1, args.ar_batch):
        rows = [tok.encode(prompts[i % len(prompts)]) for i in range(batch)]
        with torch.inference_mode():
            generate(rows, 8)  # warm-up
            began = time.perf_counter()
            generate(rows, args.output_len)
            rates[batch] = batch * args.output_len / (time.perf_counter() - began)
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default=str(PAIR), help="directory with target/ and drafter/")
    p.add_argument("--prompts", help="JSONL file or shipped set (default: the pair's held_out_prompts.jsonl)")
    p.add_argument("--concurrency", default="1,4,16,64", type=lambda v: [int(c) for c in v.split(",")])
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--mode", default="ddtree")
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--long-prompt", type=int, default=512, help="tokens of the long request's prompt")
    p.add_argument("--long-tokens", type=int, default=1024, help="tokens the long request generates")
    p.add_argument("--short-tokens", type=int, default=16)
    p.add_argument("--trials", type=int, default=3, help="short-behind-long repeats")
    p.add_argument("--ar-batch", type=int, default=16, help="width of the batched ar baseline (0: skip it)")
    p.add_argument("--threads", type=int, default=default_threads())
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=default_dtype("cpu"))
    p.add_argument("--serve-arg", action="append", default=[], help="one more serve argument (repeatable)")
    args = p.parse_args()
    pair = Path(args.pair)
    prompt_set = load_prompts(args.prompts or pair / "held_out_prompts.jsonl")
    prompts = [q.text for q in prompt_set.prompts]
    tok = Tokenizer(pair / "target")
    torch.set_num_threads(args.threads)
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="serve-concurrency-")) / "server.log"
    flags = ["--mode", args.mode, "--modes", args.mode, "--budget", str(args.budget), "--threads", str(args.threads),
             "--dtype", args.dtype, "--queue-size", str(max(args.concurrency)), *args.serve_arg]  # fmt: skip
    proc = start_server(pair / "target", pair / "drafter", port, log, flags)
    ep = Endpoint.parse(f"http://127.0.0.1:{port}")
    try:
        with httpx.Client(base_url=ep.base, timeout=120) as client:
            wait_ready(client, proc, log)
            served = client.get("/v1/models").json()["data"][0]["id"]
        print(f"serve_concurrency: {os.cpu_count()} CPUs, {args.threads} thread(s), {args.dtype}, torch "
              f"{torch.__version__}; {pair}, prompts {prompt_set.name}, {args.output_len} tokens a request, "
              f"T=0, EOS ignored; model {served!r} served with {' '.join(flags)}", flush=True)  # fmt: skip
        results = sweep(ep, prompts, args)
        round_ms = results[min(results)].itl_ms.median or float("nan")
        behind_long(ep, tok, prompts, round_ms, args)
    finally:
        proc.terminate()
        proc.wait(60)
    if args.ar_batch:
        rates = batched_ar(pair / "target", tok, prompts, args)
        line = (f"batched ar (transformers generate, greedy, {args.output_len} tokens): batch 1 {rates[1]:.1f} "
                f"tok/s, batch {args.ar_batch} {rates[args.ar_batch]:.1f} tok/s "
                f"({rates[args.ar_batch] / rates[1]:.1f}x)")  # fmt: skip
        if args.ar_batch in results:
            total = results[args.ar_batch].output_throughput or 0
            line += f"; the server at {args.ar_batch} clients: {total / rates[args.ar_batch]:.2f}x of it"
        print(line, flush=True)


if __name__ == "__main__":
    main()
