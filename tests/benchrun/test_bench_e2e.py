"""`fab bench` and `fab tune` end to end: a real sshd host, the real DDTree server on the CPU with
the tiny pair, real HTTP, results home over SFTP.

One deploy serves three checks (each server restart costs seconds on a CPU): a bench run killed
after its first cell and resumed (every cell exactly once), the numbers of the finished run checked
against the server's own records, then `fab tune` choosing a budget and redeploying with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from invoke import Context

from ops import tasks
from ops.bench.store import completed_cells, find_results, load_result
from ops.steps.bench import TUNED_FILE
from ops.tasks import run_bench_file
from ops.wheel import REPO_ROOT
from tests.deploy.helpers import complete, deploy, free_port, host_vars, server_pid

MATRIX = """
workload: {prompts: [math], output_len: [12], num_prompts: 2, warmup: 1}
systems:
  - {system: ddtree, mode: ar}
  - {system: ddtree, mode: dflash}
  - {system: ddtree, mode: ddtree, budget: [8]}
  - {system: vllm, mode: dflash, num_speculative_tokens: 7, template: %s, port: %d, vars: {venv: %s}}
"""
# The foreign-server path (template -> supervisor -> health wait -> our client -> stop) with a
# stand-in that speaks the same API and /metrics names as vLLM: our own server, in DFlash mode.
STAND_IN = """{{ venv }}/bin/python
-m
ddtree_runtime
serve
--target
{{ target }}
--drafter
{{ drafter }}
--mode
{{ mode }}
--port
{{ port }}
--device
cpu
"""
CELLS = {
    "ddtree-ar-math-t0-c1-o12",
    "ddtree-dflash-math-t0-c1-o12",
    "ddtree-ddtree-b8-math-t0-c1-o12",
    "vllm-dflash-k7-math-t0-c1-o12",
}


def requests_between_scrapes(log: Path) -> list[dict]:
    """The server's own records of the measured requests: completions between the two /metrics reads."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    scrapes = [i for i, r in enumerate(records) if r.get("path") == "/metrics"]
    return [r for r in records[scrapes[0] : scrapes[1]] if r.get("path") == "/v1/completions"]


def results_home(paths: Iterable[Path]) -> list[Path]:
    """Cells' result files, not a fetch's hidden temporary copy (`.<cell>.fetched.json`, which a kill
    in the middle of a fetch leaves behind and the results store skips)."""
    return [p for p in paths if not p.name.startswith(".")]


def kill_after_first_cell(command: list[str], results: Path, env: dict[str, str]) -> Path:
    """Start `fab bench`, kill it (its whole process group) once one cell is home; its run dir."""
    proc = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    try:
        while not results_home(results.glob("*/h1/*.json")):
            assert proc.poll() is None and time.monotonic() < deadline, "fab bench ended before any cell"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    (run_dir,) = [p for p in results.iterdir() if p.is_dir() and not p.is_symlink()]
    return run_dir


@pytest.mark.slow
def test_bench_killed_and_resumed_then_tune(
    sshd_hosts, make_inventory, tiny_pair, checkout, servers, tmp_path, capsys
):
    (h1,) = sshd_hosts(1)
    base = servers(h1.base)
    port = free_port()
    matrix = tmp_path / "matrix.yaml"
    stand_in = tmp_path / "stand-in.argv.j2"
    stand_in.write_text(STAND_IN)
    matrix.write_text(MATRIX % (stand_in, free_port(), base / "venv"))  # the stand-in is our server
    tune = {"tune_budgets": [4, 8], "tune_output_len": 8, "tune_num_prompts": 1, "tune_warmup": 0}
    inventory = make_inventory(
        [h1], host_vars={"h1": {**host_vars(tiny_pair, checkout, port), "bench_matrix": str(matrix), **tune}}
    )
    results = tmp_path / "results"
    assert deploy(inventory, tmp_path / "deploy-results").ok

    # A bench run killed as soon as its first cell is home, then resumed: every cell exactly once.
    fab = Path(sys.executable).with_name("fab")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    run_dir = kill_after_first_cell(
        [str(fab), "bench", "--inventory", str(inventory), "--results", str(results)], results, env
    )
    first = {p.name: p.read_bytes() for p in results_home((run_dir / "h1").glob("*.json"))}
    assert 1 <= len(first) < len(CELLS) and set(first) <= {f"{c}.json" for c in CELLS}
    tasks.bench(
        Context(), inventory=str(inventory), results=str(results), resume=run_dir.name
    )  # fab bench --resume
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"] == 0 and completed_cells(run_dir, "h1") == CELLS
    assert {name: (run_dir / "h1" / name).read_bytes() for name in first} == first  # not measured again
    resumed = next(st["message"] for st in summary["hosts"]["h1"]["steps"] if st["step"] == "bench")
    assert f"{len(CELLS) - len(first)} cell(s)" in resumed and f"{len(first)} were done" in resumed
    assert (results / "latest").resolve() == run_dir
    printed = capsys.readouterr().out
    assert "specops benchmark" in printed and "B=8" in printed and "ETA" in printed

    # Afterwards the deployed server answers again with its deployed settings.
    cmdline = Path(f"/proc/{server_pid(base)}/cmdline").read_bytes().split(b"\0")
    assert (
        cmdline[cmdline.index(b"--mode") + 1 :][:3] == [b"ddtree", b"--budget", b"8"]
        and complete(port)["choices"]
    )

    # A third run of the same directory has nothing left to do, and changes nothing.
    again, _ = run_bench_file(
        REPO_ROOT / "playbooks" / "bench.yaml",
        inventory=str(inventory),
        results=str(results),
        resume=run_dir.name,
        live=False,
    )
    assert again.ok and not [st.name for st in again.hosts["h1"].steps if st.changed]

    # The numbers agree with the server's own records of the measured requests.
    for cell in CELLS:
        r = load_result(run_dir / "h1" / f"{cell}.json")
        served = requests_between_scrapes(run_dir / "h1" / "logs" / f"{cell.rsplit('-math', 1)[0]}.log")
        assert r.system == cell.split("-")[0]
        assert r.num_requests == len(served) == 2 and r.failed_requests == 0
        assert r.output_tokens == sum(s["completion_tokens"] for s in served) == 2 * 12
        assert r.input_tokens == sum(s["prompt_tokens"] for s in served)
        assert r.hardware.torch and r.command.startswith("python -m ops.bench.client")
        if r.mode == "ar":
            assert r.tau is None and r.num_drafts is None
            continue
        rounds = sum(s["rounds"] for s in served)
        assert r.num_drafts == rounds
        assert abs(r.tau - sum(s["tau"] * s["rounds"] for s in served) / rounds) < 1e-3
        hist = r.accepted_length_histogram
        assert (
            sum(hist.values()) == rounds and abs(sum(k * n for k, n in hist.items()) / rounds - r.tau) < 1e-9
        )
    report = run_dir / "report.md"
    assert report.is_file() and "ddtree" in report.read_text()
    assert {p.name for p in run_dir.glob("*.png")} >= {"throughput.png", "tau_vs_budget.png"}
    assert len(find_results([run_dir])) == len(CELLS)

    # fab tune: sweeps, writes the best budget on the host, serves it through the deploy steps.
    tasks.tune(Context(), inventory=str(inventory), results=str(results))
    assert "DDTree budget sweep" in capsys.readouterr().out
    tune_dir = (results / "latest").resolve()
    assert json.loads((tune_dir / "summary.json").read_text())["hosts"]["h1"]["status"] == "changed"
    record = json.loads((base / "run" / TUNED_FILE).read_text())
    sweep = {row["budget"]: row["tokens_per_s"] for row in record["sweep"]}
    assert record["serve"] == {"mode": "ddtree", "budget": max(sweep, key=sweep.get)} and set(sweep) == {4, 8}
    cmdline = Path(f"/proc/{server_pid(base)}/cmdline").read_bytes().split(b"\0")
    assert cmdline[cmdline.index(b"--budget") + 1] == str(record["serve"]["budget"]).encode()
    assert complete(port)["choices"]
    assert (tune_dir / "speedup_vs_budget.png").is_file()

    # A server that cannot start fails its cells, the run says how to resume, the next servers still run.
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "workload: {output_len: [4], num_prompts: 1, warmup: 0}\nsystems:\n"
        f"  - {{system: sglang, mode: mtp, num_speculative_tokens: 3, port: {free_port()}}}\n"
        "  - {system: ddtree, mode: ar}\n"
    )
    failed, fail_dir = run_bench_file(
        REPO_ROOT / "playbooks" / "bench.yaml",
        inventory=str(inventory),
        results=str(results),
        extra_vars={"bench_matrix": str(broken)},
        live=False,
    )
    failure = next(st for st in failed.hosts["h1"].steps if st.step == "bench")
    assert (
        not failed.ok
        and "sglang-mtp-k3" in failure.message
        and f"--resume {fail_dir.name}" in failure.message
    )
    assert "sglang" in failure.stderr and completed_cells(fail_dir, "h1") == {"ddtree-ar-math-t0-c1-o4"}
