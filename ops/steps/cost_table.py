"""The ``cost_table`` step: time our server's batched rounds on the host, for ``--budget-policy load``.

The load policy picks each round's tree sizes from what a round costs at each batch and budget on
this machine (``ddtree_runtime/budgets.py``); ``python -m ddtree_runtime cost-table`` measures that
with the deployed release, checkpoints, device, dtype and ``--max-batch``. This step runs it when
the server batches with the load policy (``SPECOPS_SERVE_MAX_BATCH`` above 1 and
``SPECOPS_SERVE_BUDGET_POLICY=load`` in ``serve_env``) and writes the table, with what it was
measured for, to ``<base>/run/specops-ddtree.costs.json``; ``tuned_settings`` then hands the server
``--cost-table`` (``fab tune`` restarts it, later ``fab deploy`` runs keep it while the models,
device, dtype and max batch it was measured for are the server's: ``ops/service/costs.py``).

- probe: the current release, the table's ``measured_for`` record, and where our server runs;
- plan: nothing when the record matches (same command line, same release); else stop our server
  (on a GPU the two would share its memory, on a CPU its cores) and measure; the service step
  after it starts the server again;
- apply: one foreground command (minutes on a GPU: every batch and budget captures a graph),
  which the host's ``timeout`` ends at the step's ``timeout``; a failed measurement keeps the
  table there was (``fab tune`` ignores this step's failure, so its service step starts the
  server again).
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Any

from ops.api.args import Arg, arguments
from ops.api.changes import Action, Applied, Plan, StepFailed
from ops.layout import HostLayout
from ops.service.backends import stop_ours
from ops.service.command import system_venv
from ops.service.costs import env_setting, max_batch, parse_table, table_settings
from ops.service.facts import service_fact
from ops.service.releases import layout_fact
from ops.shell import join
from ops.steps.base import Step, register
from ops.steps.bench import COMMON_ARGS, SERVE_ENV_ARG, int_list
from ops.steps.command import tail
from specops_contract import SERVE_ENV_PREFIX, SERVE_OPTIONS, SERVICE

if TYPE_CHECKING:
    from ops.api.context import StepContext
    from ops.connection import Connection


def measure_argv(args: dict[str, Any], ctx: StepContext) -> list[str]:
    """The cost-table command line: the server's settings (``table_settings``), what to time, and
    its CPU threads."""
    settings, threads = table_settings(args, ctx), env_setting(args["serve_env"], "threads")
    argv = [
        f"{system_venv(args)}/bin/python", "-m", "ddtree_runtime", "cost-table",
        "--target", settings["--target"],
        "--drafter", settings["--drafter"],
        "--device", settings["--device"],
        "--max-batch", settings["--max-batch"],
        "--budgets", ",".join(map(str, args["budgets"])),
        "--context", str(args["context"]),
        "--reps", str(args["reps"]),
        "--out", HostLayout(args["base"]).cost_table,
    ]  # fmt: skip
    argv += ["--dtype", settings["--dtype"]] if "--dtype" in settings else []
    argv += ["--threads", threads] if threads else []
    devices = args["serve_env"].get("CUDA_VISIBLE_DEVICES")
    return ["env", f"CUDA_VISIBLE_DEVICES={devices}", *argv] if devices is not None else argv


def _measure(
    argv: list[str], record: dict[str, Any], args: dict[str, Any], ctx: StepContext, conn: Connection
) -> dict[str, Any]:
    """Run the measurement, then add what it was measured for to the table it wrote."""
    if ctx.progress is not None:
        ctx.progress.note(ctx.host.name, "timing batched rounds for the cost table (minutes on a GPU)")
    limit = args["timeout"]
    # the host ends it at the limit (a lost connection must not leave it holding the GPU)
    bounded = ["timeout", "--kill-after=30", f"{limit:g}", *argv]
    result = conn.run(join(bounded), timeout=limit + 60)
    if result.exit_code in (124, 137):
        raise StepFailed(
            f"the cost table's measurement did not finish within {limit:g} s (fix: raise tune_cost_timeout, "
            "or time fewer budgets or reps)",
            command=result.command,
            stderr=tail(result.stderr or result.stdout, 30),
        )
    if not result.ok:
        raise StepFailed(
            f"the cost table's measurement exited {result.exit_code}",
            command=result.command,
            stderr=tail(result.stderr or result.stdout, 30),
        )
    path = HostLayout(args["base"]).cost_table
    table = parse_table(conn.read_bytes(path).decode("utf-8", "replace"))
    if table is None:
        raise StepFailed(f"{path}: the measurement wrote no JSON table", command=result.command)
    conn.write_bytes(path, (json.dumps({**table, "measured_for": record}, indent=1) + "\n").encode(), 0o644)
    return table


@register
class CostTable(Step):
    name = "cost_table"
    summary = "time our server's batched rounds on the host: the cost table --budget-policy load reads"
    args = arguments(
        **{k: COMMON_ARGS[k] for k in ("base", "venv", "target", "drafter", "env_file", "serve")},
        serve_env=SERVE_ENV_ARG,
        budgets=Arg(int_list, default=[1, 2, 4, 8, 16], help="ddtree budgets to time, two or more"),
        context=Arg(int, default=512, help="prompt tokens of every timed sequence"),
        reps=Arg(int, default=5, help="timed rounds per point (the median counts)"),
        timeout=Arg(float, default=3600.0, help="seconds the measurement may take"),
    )

    def probe(self, conn, args, ctx):
        layout = HostLayout(args["base"])
        service = service_fact({**args, "name": SERVICE}).gather(conn, timeout=60)
        table = parse_table(conn.run(f"cat -- {join([layout.cost_table])} 2>/dev/null; true").stdout)
        return {
            "release": layout_fact(args["base"]).gather(conn)["current"],
            "measured_for": (table or {}).get("measured_for"),
            "service": {k: service[k] for k in ("systemd", "supervisor_process")},
        }

    def plan(self, facts, args, ctx):
        path = HostLayout(args["base"]).cost_table
        system, env = args["serve"].get("system", "ddtree"), args["serve_env"]
        if system != "ddtree":
            return Plan.noop(f"serve.system is {system}: the cost table is our server's")
        if max_batch(env) < 2:
            return Plan.noop(f"{SERVE_ENV_PREFIX}MAX_BATCH is 1: the server decodes one sequence at a time")
        policy = env_setting(env, "budget_policy") or SERVE_OPTIONS["budget_policy"].default
        if policy != "load":
            return Plan.noop(
                f"the budget policy is {policy}: only {SERVE_ENV_PREFIX}BUDGET_POLICY=load reads a cost table"
            )
        if facts["release"] is None:
            raise StepFailed(f"no release is deployed under {args['base']} (fix: run fab deploy first)")
        if len(args["budgets"]) < 2:
            raise StepFailed(
                "cost_table budgets: two or more tell drafting's share from the rows' (fix: [1, 2, 4, 8, 16])"
            )
        argv = measure_argv(args, ctx)
        record = {"argv": argv, "release": facts["release"]}
        old = facts["measured_for"]
        if old == record:
            return Plan.noop(
                f"{path} was measured for release {facts['release']} with these settings", path=path
            )
        if old is None:
            why = "no cost table yet"
        elif old.get("argv") == argv:
            why = f"measured for release {old.get('release')}, release {facts['release']} runs now"
        else:
            why = "measured with other settings"
        stops = stop_ours(
            HostLayout(args["base"]), facts["service"], "the measurement needs the device alone"
        )
        measure = Action(partial(_measure, argv, record, args, ctx), f"run: {join(argv)}  # {why}")
        return Plan.of([*stops, measure], f"{why}: time batched rounds into {path}", path=path, why=why)

    def apply(self, conn, plan, ctx):
        table = [change.apply(conn) for change in plan.changes][-1]
        rows, slots = table["rows"], table.get("draft_slots") or [0]
        return Applied(
            True,
            f"{plan.data['path']}: rounds of {rows[0]}-{rows[-1]} verify rows, drafting for up to "
            f"{slots[-1]} slots ({plan.data['why']})",
            {"path": plan.data["path"]},
        )
