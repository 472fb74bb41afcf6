"""benchmarks/serve_concurrency.py end to end: our real server on the tiny pair, real streaming
clients at two concurrency levels, the short-behind-long probe, and the batched `ar` baseline."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ops.wheel import REPO_ROOT


@pytest.mark.slow
def test_every_figure_is_printed_against_the_real_server(tiny_pair):
    argv = [
        *("--pair", str(tiny_pair.target.parent), "--prompts", "math", "--concurrency", "1,3"),
        *("--requests-per-client", "1", "--output-len", "8", "--trials", "1", "--ar-batch", "3"),
        *("--long-prompt", "48", "--long-tokens", "40", "--short-tokens", "4"),
        "--serve-arg=--served-model-name=sweep-test",
    ]
    done = subprocess.run(
        [sys.executable, "benchmarks/serve_concurrency.py", *argv],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "model 'sweep-test'" in lines[0]  # --serve-arg reached the server
    rows = {int(r[0]): r for r in (line.split() for line in lines) if r and r[0].isdigit()}
    assert sorted(rows) == [1, 3]
    for row in rows.values():
        requests, total, per_client, p50, p99, failed = row[1:]
        assert (int(requests), int(failed)) == (4, 0)  # at least 4 requests, none refused
        assert min(float(total), float(per_client), float(p50)) > 0 and float(p50) <= float(p99)
    assert float(rows[3][3]) < float(rows[3][2])  # three clients share the total
    assert re.search(r"a 4-token request sent while a \d+-token-prompt, 40-token request runs: first token "
                     r"after [\d.]+ ms \(median of 1; [\d.]+ rounds of [\d.]+ ms\)", done.stdout)  # fmt: skip
    assert re.search(r"batched ar .* batch 1 [\d.]+ tok/s, batch 3 [\d.]+ tok/s .*; the server at 3 "
                     r"clients: [\d.]+x of it", done.stdout)  # fmt: skip
