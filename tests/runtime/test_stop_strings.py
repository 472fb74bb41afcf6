"""The stop-string check and the streamed text decode each token a bounded number of times (issue 27,
item 9: decoding the whole output after every token made a 32K-token output spend about a minute
in the check), and still agree with decoding everything at once: where a stop string ends the
output, and what a stream sends in the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ddtree_runtime.generation import IncrementalText, Output
from ddtree_runtime.server.protocol.responses import TextStream
from ddtree_runtime.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[2]
WORDS = "after the war his school was the city of his time "


def counted(tokenizer: Tokenizer) -> tuple[Callable[[list[int]], str], list[int]]:
    """The tokenizer's decode, counting the ids it is handed."""
    handed = [0]

    def decode(ids: list[int]) -> str:
        handed[0] += len(ids)
        return tokenizer.decode(ids)

    return decode, handed


def test_the_stop_check_decodes_each_token_a_few_times_and_stops_where_a_whole_decode_does(tiny_pair):
    tokenizer = Tokenizer(tiny_pair.target)
    ids = tokenizer.encode(WORDS * 300)  # 3,300 tokens
    decode, handed = counted(tokenizer)
    out = Output(10**6, set(), ("never said",), decode, None, None)
    for i in range(0, len(ids), 3):
        assert not out.emit(ids[i : i + 3])
    assert handed[0] < 8 * len(ids)  # a whole decode per token would hand over 5 million ids

    stop = "city of his time after"
    first = next(t for t in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:t]))
    out = Output(10**6, set(), ("xyz", stop), tokenizer.decode, None, None)
    for i in range(0, len(ids), 4):
        if out.emit(ids[i : i + 4]):
            break
    assert out.reason == "stop" and len(out.ids) == first
    assert out.text() == tokenizer.decode(ids[:first]).split(stop)[0]


def test_incremental_text_is_the_whole_decode_across_split_utf8_characters():
    tokenizer = Tokenizer(REPO / "demo_pair" / "target")  # byte-level BPE: é, — and 東 span tokens
    ids = tokenizer.encode("def naïve_café():  # — 東京 ünïcödé\n    return '✓' * 3\n" * 40)
    text = IncrementalText(tokenizer.decode)
    pieces = [text.push([t]) for t in ids]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in piece for piece in pieces)

    decode, handed = counted(tokenizer)
    stream = TextStream(decode, ("return '✓' * 3\n    x",))
    sent = "".join(stream.push(ids[i : i + 5]) for i in range(0, len(ids), 5))
    final = tokenizer.decode(ids)
    assert sent + stream.finish(final) == final and handed[0] < 8 * len(ids)
