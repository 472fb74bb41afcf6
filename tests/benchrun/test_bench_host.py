"""The bench step on a real sshd host, without a deploy: a Hugging Face prompt set fetched on the
host (once), and a vLLM-system entry reusing a server that already runs on its port.

The release is the repository's own ``ops`` (and ``specops_contract.py``) linked into
``<base>/releases/r1/site``. The already running server is our DDTree server on the tiny pair,
started outside specops; it speaks the same API as vLLM. ``datasets`` is a stand-in for the
third-party library (this machine has no internet): a module on the host python's path that
serves rows from a local file and logs each call.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.api.changes import StepFailed
from ops.api.context import StepContext
from ops.bench.prompts import parse_hf_spec, rows_to_jsonl
from ops.bench.store import completed_cells, load_result
from ops.connection import connect
from ops.inventory import load_inventory
from ops.runner import TEMPLATES_DIR
from ops.steps import get_step
from ops.wheel import REPO_ROOT
from tests.deploy.helpers import complete, free_port, healthy, is_running

GOOD = "hf:test-org/tiny-prompts:test:question"
ABSENT = "hf:test-org/absent"
ROWS = {"test": [{"question": "the first", "answer": "1"}, {"question": ""}, {"question": "the second"}]}
STAND_IN = '''"""Stand-in for the `datasets` library: rows from a local file; each call logged."""
import json

def load_dataset(path, name=None, *, split, streaming=False):
    with open({calls!r}, "a") as fh:
        fh.write(json.dumps([path, name, split, streaming]) + "\\n")
    if path != "test-org/tiny-prompts":
        raise ConnectionError("Couldn't reach 'https://huggingface.co/api/datasets/" + path + "'")
    with open({rows!r}) as fh:
        return iter(json.load(fh)[split])
'''
MATRIX = """
workload: {prompts: ['%s', '%s'], output_len: [4], num_prompts: 1, warmup: 0}
systems:
  - {system: vllm, mode: dflash, num_speculative_tokens: 7, port: %d}
  - {system: vllm, mode: mtp, num_speculative_tokens: 3, port: %d, vars: {served_name: other-model},
     workload: {prompts: [math]}}
"""
REUSED = "vllm-dflash-k7-hf-test-org-tiny-prompts-test-question-t0-c1-o4"


@pytest.fixture
def running_server(tiny_pair, tmp_path):
    """Our DDTree server started by hand, as a user's already running server would be."""
    port = free_port()
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddtree_runtime",
            "serve",
            "--target",
            str(tiny_pair.target),
            "--drafter",
            str(tiny_pair.drafter),
            "--mode",
            "dflash",
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while not healthy(port):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
        time.sleep(0.1)
    yield proc, port
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def release_of_this_checkout(base: Path) -> Path:
    """``<base>/releases/r1`` holding this checkout's ``ops`` (what the client runs), as current."""
    site = base / "releases" / "r1" / "site"
    site.mkdir(parents=True)
    (site / "ops").symlink_to(REPO_ROOT / "ops")
    (site / "specops_contract.py").symlink_to(REPO_ROOT / "specops_contract.py")  # in every wheel beside ops
    (base / "current").symlink_to("releases/r1")
    return site


def bench(conn, ctx, base: Path, tiny_pair, matrix: Path, run_dir: Path, fails: bool = True):
    """Run the bench step; the StepFailed it raises (``fails``), else None."""
    step = get_step("bench")()
    args = step.check_args(
        {
            "matrix": str(matrix),
            "base": str(base),
            "venv": str(Path(sys.executable).parents[1]),
            "target": str(tiny_pair.target),
            "drafter": str(tiny_pair.drafter),
            "env_file": str(base / "run" / "env"),
            "backend": "supervisor",
            "timeout": 60,
            "cell_timeout": 120,
            "run_dir": str(run_dir),
        }
    )
    plan = step.plan(step.probe(conn, args, ctx), args, ctx)
    if not fails:
        step.apply(conn, plan, ctx)
        return None
    with pytest.raises(StepFailed) as failed:
        step.apply(conn, plan, ctx)
    return failed.value


@pytest.mark.slow
def test_hf_prompts_fetched_once_and_a_running_server_reused(
    sshd_hosts, make_inventory, tiny_pair, running_server, tmp_path
):
    proc, port = running_server
    (h1,) = sshd_hosts(1)
    site = release_of_this_checkout(h1.base)
    (tmp_path / "rows.json").write_text(json.dumps(ROWS))
    calls = tmp_path / "calls.jsonl"
    (site / "datasets").mkdir()
    (site / "datasets" / "__init__.py").write_text(
        STAND_IN.format(calls=str(calls), rows=str(tmp_path / "rows.json"))
    )
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(MATRIX % (GOOD, ABSENT, port, port))
    host = load_inventory(make_inventory([h1])).hosts["h1"]
    ctx = StepContext(
        host=host, playbook_dir=tmp_path, templates_dir=TEMPLATES_DIR, vars=host.template_vars()
    )
    conn = connect(host)
    try:
        # First run: the good dataset is fetched and measured on the reused server; the absent one
        # fails in one line; the entry whose served model differs finds the port taken.
        failed = bench(conn, ctx, h1.base, tiny_pair, matrix, tmp_path / "results" / "run-1")
        lines = failed.stderr.splitlines()
        assert any(
            f"host h1: prompt set {ABSENT}: dataset test-org/absent: cannot load split 'train': "
            "ConnectionError"
            in line
            and "fix: the host needs internet access" in line
            for line in lines
        )
        assert any(
            f"port {port} on h1 is taken" in line
            and f"lists ['{tiny_pair.target}'], not 'other-model'" in line
            for line in lines
        )
        assert completed_cells(tmp_path / "results" / "run-1", "h1") == {REUSED}
        fetched = h1.base / "results" / "prompts" / "hf-test-org-tiny-prompts-test-question.jsonl"
        assert fetched.read_bytes() == rows_to_jsonl(iter(ROWS["test"]), parse_hf_spec(GOOD))
        assert [json.loads(line)[0] for line in calls.read_text().splitlines()] == [
            "test-org/tiny-prompts",
            "test-org/absent",
        ]
        result = load_result(tmp_path / "results" / "run-1" / "h1" / f"{REUSED}.json")
        assert result.prompt_set == "hf-test-org-tiny-prompts-test-question" and result.num_requests == 1
        assert result.output_tokens == 4 and result.tau is not None  # measured on the DFlash server

        # Reused, not started, and still serving afterwards.
        assert is_running(proc.pid) and complete(port)["choices"]
        assert not (h1.base / "run" / "specops-bench-vllm.pid").exists()

        # Second run without `datasets` on the host: the fetched file is used as it is (no call);
        # the other dataset fails naming the host, the dataset and the fix.
        shutil.rmtree(site / "datasets")
        failed = bench(conn, ctx, h1.base, tiny_pair, matrix, tmp_path / "results" / "run-2")
        assert completed_cells(tmp_path / "results" / "run-2", "h1") == {REUSED}
        assert len(calls.read_text().splitlines()) == 2
        missing = [line for line in failed.stderr.splitlines() if ABSENT in line]
        assert (
            len(missing) == 1
            and "host h1: prompt set hf:test-org/absent: dataset test-org/absent: " in missing[0]
        )
        assert "has no 'datasets' module (fix: " in missing[0] and "/pip install datasets" in missing[0]
        assert is_running(proc.pid)
    finally:
        conn.close()


GATED = """
workload: {prompts: [math], output_len: [4], num_prompts: 1, warmup: 0}
systems:
  - {system: vllm, mode: dflash, num_speculative_tokens: 7, port: %d, min_tau: 50}
  - {system: vllm, mode: dflash, num_speculative_tokens: 6, port: %d, min_tau: 1.1}
"""


def test_the_acceptance_gate_checks_a_matrix_server_through_its_metrics(
    sshd_hosts, make_inventory, tiny_pair, running_server, tmp_path
):
    """fab deploy's gate on bench matrix entries (min_tau): a server below it measures nothing and
    the failure names the fields to check; one above it is measured. The server is our DDTree
    server on the tiny pair, reused as a vLLM entry: real tau from real counters."""
    proc, port = running_server
    (h1,) = sshd_hosts(1)
    release_of_this_checkout(h1.base)
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(GATED % (port, port))
    host = load_inventory(make_inventory([h1])).hosts["h1"]
    ctx = StepContext(
        host=host, playbook_dir=tmp_path, templates_dir=TEMPLATES_DIR, vars=host.template_vars()
    )
    conn = connect(host)
    try:
        failed = bench(conn, ctx, h1.base, tiny_pair, matrix, tmp_path / "results" / "run-1")
    finally:
        conn.close()
    assert "vllm-dflash-k7: acceptance gate: vllm dflash tau " in str(failed) and "< min_tau 50" in str(
        failed
    )
    assert "likely wrong: the drafter's config.json: dflash_config.mask_token_id" in str(failed)
    done = completed_cells(tmp_path / "results" / "run-1", "h1")
    assert done == {"vllm-dflash-k6-math-t0-c1-o4"}  # the gate passed there: tau from the counters > 1.1
    record = json.loads((h1.base / "results" / "run-1" / "vllm-dflash-k6.acceptance.json").read_text())
    assert record["modes"]["dflash"]["tau"] > 1.1 and is_running(proc.pid)


SWEEP = """
workload: {prompts: [math], output_len: [4], num_prompts: 1, warmup: 0, concurrency: [1, 3]}
systems:
  - {system: vllm, mode: dflash, num_speculative_tokens: 7, port: %d}
"""


@pytest.mark.slow
def test_a_concurrency_sweep_measures_each_level_with_a_request_per_client(
    sshd_hosts, make_inventory, tiny_pair, running_server, tmp_path
):
    """Matrix concurrency [1, 3]: one cell per level, each measured by the client at its level,
    with at least one request per client; the level is in the cell id a resumed run skips."""
    _, port = running_server
    (h1,) = sshd_hosts(1)
    release_of_this_checkout(h1.base)
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(SWEEP % port)
    host = load_inventory(make_inventory([h1])).hosts["h1"]
    ctx = StepContext(
        host=host, playbook_dir=tmp_path, templates_dir=TEMPLATES_DIR, vars=host.template_vars()
    )
    conn = connect(host)
    try:
        bench(conn, ctx, h1.base, tiny_pair, matrix, tmp_path / "run", fails=False)
    finally:
        conn.close()
    cells = {c: f"vllm-dflash-k7-math-t0-c{c}-o4" for c in (1, 3)}
    assert completed_cells(tmp_path / "run", "h1") == set(cells.values())
    for clients, cell in cells.items():
        result = load_result(tmp_path / "run" / "h1" / f"{cell}.json")
        assert (result.concurrency, result.num_requests, result.failed_requests) == (clients, clients, 0)
        assert result.output_tokens == 4 * clients and f"--concurrency {clients}" in result.command
        assert result.ttft_ms.median is not None and result.e2el_ms.mean is not None
