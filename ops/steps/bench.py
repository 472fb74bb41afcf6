"""Benchmark steps: ``bench`` (run a matrix), ``bench_tune`` (sweep and pick) and ``tuned_settings``.

``bench`` takes a host through a matrix file (``ops/bench/matrix.py``), one server at a time; the
session that starts servers and measures cells is ``ops/bench/session.py``. The probe reads which
cells of the run directory are complete, so a run killed midway and run again with the same run
directory (``fab bench --resume RUN_ID``) measures each cell exactly once; with every cell done
the step is ``ok`` with nothing to do. A cell or server that fails is recorded and the others
still run; the step then fails naming them. The run directory is ``ctx.run_dir`` (``fab bench``
sets it to the run it measures into), unless the ``run_dir`` argument names one.

``bench_tune`` sweeps the DDTree budget (``ops/bench/tune.py``) and writes the best to
``<base>/run/specops-ddtree.tuned.json``, which ``tuned_settings`` reads back, with the cost table
the ``cost_table`` step measured (``ops/steps/cost_table.py``) when it was measured for the models
and settings the server runs now, so the service step (``fab tune``, and ``fab deploy`` when its
playbook includes it) serves the tuned settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.api.args import Arg, arguments
from ops.api.changes import Action, Applied, Fact, Plan, StepFailed
from ops.bench.hardware import hardware_fact
from ops.bench.matrix import Cell, Server, load_matrix
from ops.bench.session import ServerOutcome, Session, ensure_progress
from ops.bench.store import completed_cells
from ops.bench.tune import sweep, tokens_to_sweep, tuned_serve
from ops.layout import HostLayout
from ops.service.costs import parse_table, stale_settings, table_settings
from ops.service.releases import layout_fact
from ops.service.settings import backend_arg, serve_arg
from ops.shell import join
from ops.steps.base import Step, register
from specops_contract import SERVICE

if TYPE_CHECKING:
    from ops.api.context import StepContext
    from ops.connection import CommandResult, Connection

TUNED_FILE = f"{SERVICE}.tuned.json"  # in <base>/run (HostLayout.tuned)
CELL_TIMEOUT_S = 3600.0


def int_list(value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    out = []
    for v in values:
        if isinstance(v, bool) or not str(v).strip().isdigit() or int(v) < 1:
            raise ValueError(f"expected whole numbers >= 1, got {v!r}")
        out.append(int(v))
    return out


COMMON_ARGS = dict(
    base=Arg(str, required=True, help="the host's base directory"),
    venv=Arg(str, help="host venv (default <base>/venv)"),
    target=Arg(str, required=True, help="target checkpoint directory on the host"),
    drafter=Arg(str, required=True, help="drafter checkpoint directory on the host"),
    env_file=Arg(str, required=True, help="the deployed server's 0600 environment file"),
    serve=Arg(serve_arg, default={}, help="inventory serve vars; mode and budget are set per server"),
    backend=Arg(backend_arg, default="auto", help="auto | systemd | supervisor (our server)"),
    timeout=Arg(float, default=300.0, help="seconds for a server to answer after a (re)start"),
    cell_timeout=Arg(float, default=CELL_TIMEOUT_S, help="seconds for one cell's client run"),
    run_dir=Arg(str, help="controller results/<run-id> directory (default: the run's, ctx.run_dir)"),
)

SERVE_ENV_ARG = Arg(dict, default={}, help="the inventory's serve_env (SPECOPS_SERVE_MAX_BATCH, ...)")


def run_dir(args: dict[str, Any], ctx: StepContext) -> Path:
    if args["run_dir"]:
        return Path(args["run_dir"])
    if ctx.run_dir is None:
        raise StepFailed("no results directory for the benchmark (fix: run it through fab bench or fab play)")
    return ctx.run_dir


def _host_facts(conn: Connection, args: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    layout = layout_fact(args["base"]).gather(conn)
    hardware = hardware_fact(f"{args['venv'] or HostLayout(args['base']).venv}/bin/python").gather(conn)
    return {
        "release": layout["current"],
        "hardware": hardware,
        "done": sorted(completed_cells(run_dir(args, ctx), ctx.host.name)),
    }


def _need_release(facts: dict[str, Any], args: dict[str, Any]) -> str:
    if facts["release"] is None:
        raise StepFailed(f"no release is deployed under {args['base']} (fix: run fab deploy first)")
    return facts["release"]


@dataclass(frozen=True)
class ServerRun(Action):
    """One server's turn of a matrix: start it, measure ``cells``, stop it."""

    server: Server | None = None
    cells: tuple[Cell, ...] = ()


def _session(conn: Connection, setup: dict[str, Any]) -> Session:
    return Session(conn=conn, **setup)


def _measure(
    setup: dict[str, Any], server: Server, cells: tuple[Cell, ...], conn: Connection
) -> ServerOutcome:
    return _session(conn, setup).run_server(server, list(cells))


# ---------------------------------------------------------------- bench
@register
class Bench(Step):
    name = "bench"
    summary = "run a benchmark matrix, one server at a time; results come home to results/<run-id>/<host>/"
    args = arguments(
        matrix=Arg(str, required=True, help="matrix file (beside the playbook, or a path)"),
        workload=Arg(dict, default={}, help="workload keys that replace the matrix's (e.g. num_prompts)"),
        **COMMON_ARGS,
    )

    def probe(self, conn, args, ctx):
        return _host_facts(conn, args, ctx)

    def plan(self, facts, args, ctx):
        matrix = load_matrix(ctx.find_source(args["matrix"]), args["workload"])
        done, results = set(facts["done"]), run_dir(args, ctx)
        pending = [(s, tuple(c for c in s.cells if c.cell_id not in done)) for s in matrix.servers]
        pending = [(s, cells) for s, cells in pending if cells]
        total = len(matrix.cells)
        todo = sum(len(cells) for _, cells in pending)
        data = {
            "release": facts["release"],
            "hardware": facts["hardware"],
            "matrix_dir": str(matrix.path.parent),
            "total": total,
            "done_before": total - todo,
            "run_dir": str(results),
        }
        if not pending:
            return Plan.noop(f"all {total} cells of {matrix.path.name} are complete in {results}", **data)
        setup = {
            "args": args,
            "ctx": ctx,
            "release": _need_release(facts, args),
            "hardware": facts["hardware"],
            "matrix_dir": matrix.path.parent,
            "run_dir": results,
        }
        changes = [
            ServerRun(
                partial(_measure, setup, s, cells),
                f"bench: {s.label}: {len(cells)} cell(s) ({', '.join(c.cell_id for c in cells)})",
                server=s,
                cells=cells,
            )
            for s, cells in pending
        ]
        return Plan.of(changes, f"run {todo} of {total} cells on {len(changes)} server(s)", **data)

    def apply(self, conn, plan, ctx):
        data = plan.data
        ensure_progress(ctx).start(ctx.host.name, data["total"], data["done_before"])
        outcomes = [change.apply(conn) for change in plan.changes]
        ran = sum(len(o.measured) for o in outcomes)
        failures = [f for o in outcomes for f in o.failures]
        where = Path(data["run_dir"])
        if failures:
            raise StepFailed(
                f"{len(failures)} failure(s), {ran} cell(s) measured (fix, then resume: "
                f"fab bench --resume {where.name}): " + "; ".join(f.splitlines()[0] for f in failures),
                stderr="\n".join(failures),
            )
        return Applied(
            True,
            f"measured {ran} cell(s); {data['done_before']} were done before; results in "
            f"{where / ctx.host.name}",
            {"run_dir": str(where), "measured": ran, "release": data["release"]},
        )


# ---------------------------------------------------------------- tune
def _tune(setup: dict[str, Any], args: dict[str, Any], conn: Connection) -> dict[str, Any]:
    """Sweep, pick the best DDTree budget, write it to the host; the tuned record (with failures)."""
    session = _session(conn, setup)
    rows, failures = sweep(session, args)
    system = args["serve"].get("system", "ddtree")
    ours = [r for r in rows if r["system"] == system and r["tokens_per_s"]]
    if not ours:
        what = "DDTree budget" if system == "ddtree" else f"{system} num_speculative_tokens"
        raise StepFailed(
            f"no {what} was measured: " + "; ".join(f.splitlines()[0] for f in failures),
            stderr="\n".join(failures),
        )
    best = max(ours, key=lambda r: r["tokens_per_s"])
    record = {
        "serve": tuned_serve(system, best),
        "tokens_per_s": best["tokens_per_s"],
        "speedup": best["speedup"],
        "run_id": session.run_dir.name,
        "tuned_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sweep": rows,
    }
    path = HostLayout(args["base"]).tuned
    conn.write_bytes(path, (json.dumps(record, indent=1) + "\n").encode(), 0o644)
    return {**record, "best": best, "failures": failures, "path": path, "run_dir": str(session.run_dir)}


@register
class BenchTune(Step):
    name = "bench_tune"
    summary = (
        "sweep the DDTree budget (vLLM/SGLang: num_speculative_tokens) against ar, pick the best "
        "tokens/s, write it to <base>/run/" + TUNED_FILE
    )
    args = arguments(
        budgets=Arg(int_list, default=[8, 16, 32, 64, 128, 256, 512], help="DDTree budgets, ascending"),
        vllm_dflash_tokens=Arg(int_list, default=[], help="also sweep vLLM DFlash num_speculative_tokens"),
        tokens=Arg(
            int_list,
            default=[],
            help="num_speculative_tokens to sweep on a vLLM/SGLang host (default: per mode)",
        ),
        prompts=Arg(str, default="math", help="prompt set of the sweep"),
        output_len=Arg(int, default=128, help="tokens per request"),
        num_prompts=Arg(int, default=8, help="measured requests per point"),
        warmup=Arg(int, default=1, help="unmeasured requests per point"),
        temperature=Arg(float, default=0.0),
        patience=Arg(int, default=2, help="stop after this many points in a row below the best"),
        min_gain=Arg(float, default=0.03, help="'below the best' means by more than this fraction"),
        **COMMON_ARGS,
    )
    idempotent = False

    def probe(self, conn, args, ctx):
        return _host_facts(conn, args, ctx)

    def plan(self, facts, args, ctx):
        release = _need_release(facts, args)
        system, mode = args["serve"].get("system", "ddtree"), args["serve"].get("mode")
        what = f"ar, then ddtree budgets {', '.join(map(str, args['budgets']))}"
        if system != "ddtree":
            ks = ", ".join(map(str, tokens_to_sweep(mode, args["tokens"])))
            what = f"{system} ar, then {system} {mode} num_speculative_tokens {ks}"
        if args["vllm_dflash_tokens"]:
            what += f", vLLM DFlash k {', '.join(map(str, args['vllm_dflash_tokens']))}"
        setup = {
            "args": args,
            "ctx": ctx,
            "release": release,
            "hardware": facts["hardware"],
            "matrix_dir": ctx.playbook_dir,
            "run_dir": run_dir(args, ctx),
        }
        return Plan.of(
            [Action(partial(_tune, setup, args), f"sweep {what}")],
            f"tune on release {release}: {what}",
            release=release,
            hardware=facts["hardware"],
        )

    def apply(self, conn, plan, ctx):
        ensure_progress(ctx)
        (tuned,) = [change.apply(conn) for change in plan.changes]
        best, failures = tuned["best"], tuned["failures"]
        note = f"; {len(failures)} point(s) failed" if failures else ""
        setting = f"budget {best['budget']}" if best["budget"] else f"k {best['num_speculative_tokens']}"
        return Applied(
            True,
            f"best {best['system']} {best['mode']} {setting}: {best['tokens_per_s']:.1f} tok/s, "
            f"{best['speedup']:.2f}x over ar; written to {tuned['path']}{note}",
            {
                "serve": tuned["serve"],
                "release": plan.data["release"],
                "sweep": tuned["sweep"],
                "run_dir": tuned["run_dir"],
                "best": best,
            },
        )


# ---------------------------------------------------------------- tuned_settings
def tuned_fact(path: str) -> Fact[dict[str, Any]]:
    return Fact(f"cat -- {join([path])} 2>/dev/null; true", parse_tuned)


def parse_tuned(result: CommandResult) -> dict[str, Any]:
    """The tuned record, or {} when there is none; a damaged file is an error naming it."""
    text = result.stdout.strip()
    if not text:
        return {}
    try:
        record = json.loads(text)
        serve = serve_arg(record["serve"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StepFailed(
            f"{TUNED_FILE} on the host is damaged ({exc}); fix: run fab tune again, or delete it"
        ) from None
    return {**record, "serve": serve}


def tuned_serve_settings(record: dict[str, Any], cost_table: str | None) -> dict[str, Any]:
    """The serve settings fab tune chose: the sweep's, plus the measured cost table for our server
    (a vLLM/SGLang choice takes none)."""
    serve = dict(record.get("serve", {}))
    if cost_table and serve.get("system", "ddtree") == "ddtree":
        serve["cost_table"] = cost_table
    return serve


def checked_cost_table(
    facts: dict[str, Any], args: dict[str, Any], ctx: StepContext
) -> tuple[str | None, str]:
    """The cost table to hand our server, and a note for the step's message: a table measured for
    other models or settings is left out (the load policy would pick budgets from wrong costs)."""
    path, measured_for = facts["cost_table"], facts["measured_for"]
    if path is None or args["serve"].get("system", "ddtree") != "ddtree":
        return None, ""  # vLLM and SGLang read no cost table
    if measured_for is None:
        return path, f"; {path} has no measured_for record: served unchecked"
    stale = stale_settings(measured_for, table_settings(args, ctx))
    if stale:
        return None, f"; {path} left out, it was measured for {', '.join(stale)} (fix: run fab tune)"
    return path, ""


@register
class TunedSettings(Step):
    name = "tuned_settings"
    summary = (
        "read the serve settings fab tune chose, with its cost table while measured for the models and "
        "settings the server runs (register it; {} when never tuned)"
    )
    args = arguments(
        **{k: COMMON_ARGS[k] for k in ("base", "target", "drafter", "serve")},
        serve_env=SERVE_ENV_ARG,
    )

    def probe(self, conn, args, ctx):
        layout = HostLayout(args["base"])
        table = layout.cost_table if conn.stat(layout.cost_table) is not None else None
        text = conn.read_bytes(table).decode("utf-8", "replace") if table else ""
        return {
            "tuned": tuned_fact(layout.tuned).gather(conn),
            "cost_table": table,
            "measured_for": (parse_table(text) or {}).get("measured_for"),
        }

    def plan(self, facts, args, ctx):
        record, (table, note) = facts["tuned"], checked_cost_table(facts, args, ctx)
        serve = tuned_serve_settings(record, table)
        if not serve:
            return Plan.noop(f"never tuned: the inventory's serve settings apply{note}", serve={})
        return Plan.noop(
            f"tuned {record.get('tuned_at', 'batched round costs only')}: {serve}{note}",
            serve=serve,
            tuned_at=record.get("tuned_at"),
        )
