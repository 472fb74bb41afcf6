"""`fab tune` on a host that batches with the load policy: the cost table is measured on the host
(real sshd, the real server on the CPU with the tiny pair), the server restarts reading it, a
later deploy keeps it, the table is not measured again while release and settings hold, and a
measurement cut at its timeout leaves the old table served."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import yaml
from invoke import Context

from ops import tasks
from ops.tasks import run_bench_file
from ops.wheel import REPO_ROOT
from tests.deploy.helpers import complete, deploy, free_port, host_vars, running_release, server_pid, step

BATCHING = {
    "SPECOPS_SERVE_MAX_BATCH": 2,
    "SPECOPS_SERVE_BUDGET_POLICY": "load",
    "SPECOPS_SERVE_BUDGETS": "4,8",
}
TUNE = {
    "tune_budgets": [4],
    "tune_output_len": 8,
    "tune_num_prompts": 1,
    "tune_warmup": 0,
    "tune_cost_budgets": [1, 2],
    "tune_cost_context": 16,
    "tune_cost_reps": 1,
}


def command_lines() -> list[str]:
    """Every process's command line (from /proc: a clean CI image may have no `ps`)."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return lines


def cost_table_flag(base: Path) -> str | None:
    cmdline = Path(f"/proc/{server_pid(base)}/cmdline").read_bytes().decode().split("\0")
    return cmdline[cmdline.index("--cost-table") + 1] if "--cost-table" in cmdline else None


@pytest.mark.slow
def test_tune_measures_the_cost_table_the_server_then_reads(
    sshd_hosts, make_inventory, tiny_pair, checkout, servers, tmp_path
):
    (h1,) = sshd_hosts(1)
    base = servers(h1.base)
    port = free_port()
    # No acceptance gate: the tiny pair's trees do not pay on a CPU (the sweep: ddtree about 0.7x
    # ar), so under the measured table the load policy may verify none and the gate counts no
    # speculation (its message names the cost table then).
    host = {**host_vars(tiny_pair, checkout, port), "serve_env": BATCHING, "acceptance": {"enabled": False}}
    inventory = make_inventory([h1], host_vars={"h1": {**host, **TUNE}})
    assert deploy(inventory, tmp_path / "deploy").ok
    assert cost_table_flag(base) is None  # never tuned: the simple cost model

    tasks.tune(Context(), inventory=str(inventory), results=str(tmp_path / "tune"))
    table_path = base / "run" / "specops-ddtree.costs.json"
    table = json.loads(table_path.read_text())
    release = running_release(server_pid(base))
    argv = table["measured_for"]["argv"]
    assert table["measured_for"]["release"] == release
    assert argv[argv.index("--max-batch") + 1] == "2" and argv[argv.index("--device") + 1] == "cpu"
    assert len(table["rows"]) == 3 and table["draft_slots"] == [1, 2]  # ar, budgets 1 and 2, at 2 slots
    assert all(s > 0 for s in table["seconds"] + table["draft_seconds"])
    assert cost_table_flag(base) == str(table_path) and complete(port)["choices"]

    # The cost table step alone, again: nothing to measure while release and settings hold.
    tune = yaml.safe_load((REPO_ROOT / "playbooks" / "tune.yaml").read_text())
    only = tmp_path / "costs.yaml"
    only.write_text(
        yaml.safe_dump({"name": "costs", "steps": [s for s in tune["steps"] if s["step"] == "cost_table"]})
    )
    again, _ = run_bench_file(only, inventory=str(inventory), results=str(tmp_path / "again"), live=False)
    assert again.ok and not step(again, "h1", "cost_table").changed
    assert "was measured for release" in step(again, "h1", "cost_table").message

    # A later deploy of the same release keeps serving the table, without a restart.
    pid = server_pid(base)
    redeploy = deploy(inventory, tmp_path / "redeploy")
    assert redeploy.ok and server_pid(base) == pid and cost_table_flag(base) == str(table_path)
    assert "cost_table" in str(step(redeploy, "h1", "tuned_settings").message)

    # A measurement the host cuts at its timeout fails the step, not the tune: the old table stays,
    # the server answers again with it, and nothing is left measuring.
    cut, _ = run_bench_file(
        REPO_ROOT / "playbooks" / "tune.yaml",
        inventory=str(inventory),
        results=str(tmp_path / "cut"),
        extra_vars={"tune_cost_reps": 2, "tune_cost_timeout": 1},
        live=False,
    )
    costs = step(cut, "h1", "cost_table")
    assert costs.status == "failed" and costs.ignored and "did not finish within 1 s" in costs.message
    assert json.loads(table_path.read_text()) == table
    assert cut.ok and cost_table_flag(base) == str(table_path) and complete(port)["choices"]
    assert not [c for c in command_lines() if "ddtree_runtime cost-table" in c and str(base) in c]
