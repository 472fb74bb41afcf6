"""The progress display prints the lines hosts send as they are: a torch traceback line such as
`[rank0]: ... [/__w/pytorch/...]` is text, not rich markup (it used to end the step with a
MarkupError)."""

from __future__ import annotations

import io

from ops.bench.progress import BenchProgress

LINE = (
    "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error"
)


def test_notes_are_printed_verbatim() -> None:
    out = io.StringIO()
    with BenchProgress(stream=out, live=False) as progress:
        progress.note("h1", LINE)
    assert f"bench h1 | {LINE}" in out.getvalue()
