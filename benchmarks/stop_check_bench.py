"""The stop-string check over a long output: seconds per output length (issue 27, item 9).

Feeds `--lengths` tokens of real text, `--per-round` at a time as the engine emits them, through
`generation.Output` with a stop string that never matches, and through the server's `TextStream`;
prints the seconds each spent. Beside them, the check as it was (decode every token so far after
each new one), timed up to `--whole-up-to` tokens only: it grows with the square of the length.
The tokenizer is the committed demo pair's (byte-level BPE).

    PYTHONPATH=. .venv/bin/python benchmarks/stop_check_bench.py [--lengths 4096,32768]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ddtree_runtime.generation import Output
from ddtree_runtime.server.protocol.responses import TextStream
from ddtree_runtime.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]
STOP = ("<never said>",)


def tokens(tokenizer: Tokenizer, count: int) -> list[int]:
    """``count`` ids of real source text (two of this repository's modules), repeated as needed."""
    text = (REPO / "ops" / "runner.py").read_text() + (REPO / "ddtree_runtime" / "engine.py").read_text()
    ids = tokenizer.encode(text)
    return (ids * (count // len(ids) + 1))[:count]


def whole_decode_check(tokenizer: Tokenizer, ids: list[int]) -> None:
    """The check as it was: every token so far decoded after each new one."""
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n])
        if any(s in text for s in STOP):
            return


def seconds(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="4096,32768", help="output lengths in tokens")
    parser.add_argument("--per-round", type=int, default=4, help="tokens per engine round")
    parser.add_argument("--whole-up-to", type=int, default=4096, help="longest length for the old check")
    args = parser.parse_args()
    tokenizer = Tokenizer(REPO / "demo_pair" / "target")
    step = args.per_round
    print("tokens  Output (s)  TextStream (s)  whole decode per token (s)")
    for count in (int(n) for n in args.lengths.split(",")):
        ids = tokens(tokenizer, count)
        rounds = [ids[i : i + step] for i in range(0, count, step)]
        out = Output(10**9, set(), STOP, tokenizer.decode, None, None)
        emitted = seconds(lambda out=out, rounds=rounds: [out.emit(r) for r in rounds])
        stream = TextStream(tokenizer.decode, STOP)
        streamed = seconds(lambda stream=stream, rounds=rounds: [stream.push(r) for r in rounds])
        whole = "-"
        if count <= args.whole_up_to:
            whole = f"{seconds(lambda ids=ids: whole_decode_check(tokenizer, ids)):.2f}"
        print(f"{count:>6}  {emitted:>10.3f}  {streamed:>14.3f}  {whole:>26}")


if __name__ == "__main__":
    main()
