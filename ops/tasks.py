"""Fabric tasks (``fab provision|deploy|bench|tune|rollback|status|facts|lint-drafter|patch-drafter|
train-drafter|play FILE``).

Thin wrappers over the runner, one shipped playbook each (``playbook_task``). ``fab_task`` gives
every task the shared options (``COMMON_HELP``), so a task declares only its own.

Each task loads the inventory, selects hosts with ``--limit``, runs one playbook and exits
non-zero when a host failed (1) or the input was wrong (2), so shell scripts and CI can rely on
``fab``'s exit status. ``fabfile.py`` at the repo root only re-exports ``ns``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from invoke import Collection, Task, task
from invoke.exceptions import Exit
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ops.bench.progress import BenchProgress
from ops.bench.report import make_report
from ops.bench.store import find_results
from ops.errors import SpecopsError
from ops.gpu.facts import fp8_support
from ops.inventory import load_inventory
from ops.playbook import load_playbook
from ops.results import (
    RunResult,
    interrupted_message,
    make_run_dir,
    new_run_id,
    publish_summary,
    resume_dir,
)
from ops.runner import DEFAULT_FORKS, DEFAULT_RESULTS, REPO_ROOT, run_playbook

PLAYBOOKS = REPO_ROOT / "playbooks"

# The options every task takes (``tags`` only the tasks that run a playbook as written), in order.
COMMON_HELP = {
    "limit": "only these hosts or groups, comma-separated (default: every host)",
    "check": "probe and plan only: print would-be changes and diffs, write nothing",
    "inventory": "inventory file (default: inventory.yaml at the repo root)",
    "forks": f"hosts run in parallel (default {DEFAULT_FORKS})",
    "tags": "only steps with one of these tags, comma-separated",
    "results": "results folder (default: results/ at the repo root)",
}


def fab_task(*, name: str | None = None, tags: bool = False, **own_help: str) -> Callable[..., Task]:
    """Make ``fn`` a ``fab`` task with the shared options (and ``--tags`` when ``tags``).

    ``fn`` declares only its own parameters (documented by ``own_help``) and takes the shared ones
    as keywords (``**opts``). Every valued option defaults to None, so invoke never casts one (and
    crashes) first: ``--forks`` arrives as text and is checked here. A bad value, like every input
    error a task finds (a ``SpecopsError``), exits 2 with one line.
    """

    def make(fn: Callable[..., None]) -> Task:
        shared = {k: v for k, v in COMMON_HELP.items() if tags or k != "tags"}
        own = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
        keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
        signature = inspect.Signature(
            [
                inspect.Parameter("c", keyword),  # invoke's Context, unused
                *(p for p in own if p.default is p.empty),  # positional: `fab play FILE`
                *(inspect.Parameter(k, keyword, default=False if k == "check" else None) for k in shared),
                *(p for p in own if p.default is not p.empty),
            ]
        )

        @functools.wraps(fn)
        def body(*args: Any, **kwargs: Any) -> None:
            values = signature.bind(*args, **kwargs)
            values.apply_defaults()
            opts = dict(values.arguments)
            opts.pop("c")
            try:
                opts["forks"] = parse_forks(opts["forks"])
                fn(**opts)
            except SpecopsError as exc:
                print(f"error: {exc}", file=sys.stderr)
                raise Exit(code=2) from None

        body.__signature__ = signature  # type: ignore[attr-defined]  # what invoke reads
        return task(help={**shared, **own_help}, name=name or fn.__name__.replace("_", "-"))(body)

    return make


def run_file(
    playbook: str | Path,
    *,
    limit: str | None = None,
    check: bool = False,
    inventory: str | None = None,
    forks: int | str | None = None,
    tags: str | None = None,
    results: str | None = None,
) -> RunResult:
    """Load everything first (so input errors stop before any host is touched), then run."""
    try:
        hosts = load_inventory(inventory).select(limit)
        book = load_playbook(playbook)
        selected = {t.strip() for t in tags.split(",") if t.strip()} if tags else None
        return run_playbook(
            book, hosts, check=check, forks=parse_forks(forks), tags=selected, results_root=results
        )
    except SpecopsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise Exit(code=2) from None


def parse_forks(value: object) -> int:
    """``--forks`` arrives as text from the command line (None: the default); anything but a whole
    number >= 1 is refused. The tasks default to None so invoke does not cast (and crash) first."""
    if value is None:
        return DEFAULT_FORKS
    try:
        forks = int(str(value))
    except ValueError:
        raise SpecopsError(
            f"--forks must be a whole number of hosts in parallel, got '{value}' "
            f"(fix: --forks {DEFAULT_FORKS})"
        ) from None
    if forks < 1:
        raise SpecopsError(f"--forks must be at least 1, got {forks}")
    return forks


INTERRUPTED_EXIT = 130  # the shell's code for a SIGINT


def _finish(result: RunResult) -> None:
    if result.interrupted:
        print(interrupted_message(result), file=sys.stderr)
        raise Exit(code=INTERRUPTED_EXIT)
    if not result.ok:
        raise Exit(code=1)


@fab_task(tags=True, file="the playbook YAML to run")
def play(file: str, **opts: Any) -> None:
    """Run any playbook FILE over the inventory."""
    _finish(run_file(file, **opts))


def playbook_task(name: str, playbook: str, doc: str) -> Task:
    """A task that runs one shipped playbook with the common options (``fab NAME``)."""

    def body(**opts: Any) -> None:
        _finish(run_file(PLAYBOOKS / playbook, **opts))

    body.__name__, body.__doc__ = name.replace("-", "_"), doc
    return fab_task(name=name, tags=True)(body)


provision = playbook_task(
    "provision",
    "provision.yaml",
    "Provision hosts: base layout, Python stack, facts (playbooks/provision.yaml).",
)
deploy = playbook_task(
    "deploy",
    "deploy.yaml",
    "Deploy this checkout's runtime as a new release and start serving (playbooks/deploy.yaml).",
)
rollback = playbook_task(
    "rollback", "rollback.yaml", "Switch back to the previous release and restart (playbooks/rollback.yaml)."
)
lint_drafter = playbook_task(
    "lint-drafter",
    "lint-drafter.yaml",
    "Lint each host's DFlash drafter config against its target (read-only).",
)
patch_drafter = playbook_task(
    "patch-drafter", "patch-drafter.yaml", "Patch each host's drafter config.json to its spec, with a backup."
)


def facts_table(result: RunResult, title: str) -> Table:
    """One row per host from the ``host_facts`` each host registered (a failed host shows why)."""
    services = any("service_status" in h.registered for h in result.hosts.values())
    table = Table(title=title)
    stacks = any("gpu_facts" in h.registered for h in result.hosts.values())
    columns = [
        "host",
        "os",
        "cpus",
        "memory",
        "disk free",
        "python",
        "systemd",
        "gpus",
        "fp8",
        *(["driver", "CUDA", "torch", "triton", "vllm", "systems"] if stacks else []),
        "venv",
        "release",
    ]
    for column in columns + (["service"] if services else []):
        table.add_column(column)
    for name, host in result.hosts.items():
        f = host.registered.get("host_facts")
        if not f or "os" not in f:
            reason = next((s.message for s in host.steps if s.status == "failed"), "no facts")
            table.add_row(name, Text(f"unreachable or failed: {reason}", style="red"))
            continue
        gpus = ", ".join(f"{g['name']} (sm_{g['compute_cap'].replace('.', '')})" for g in f["gpus"]) or "none"
        stack = host.registered.get("gpu_facts", {}).get("summary") or {}
        row = [
            name,
            f["os"]["name"],
            f"{f['cpu']['count']} ({f['cpu']['model']})",
            f"{f['memory']['total_gib']} GiB",
            f"{f['disk']['free_gib']} GiB",
            f["python"]["version"] or "none",
            "usable" if f["systemd"]["usable"] else "no",
            gpus,
            fp8_support([g["compute_cap"] for g in f["gpus"]]) or "-",
            *(
                stack.get(key) or "-"
                for key in ("driver", "cuda", "torch", "triton", "vllm", "systems")
                if stacks
            ),
            f["venv"] or "none",
            f["release"] or "none",
        ]
        if services:
            row.append(host.registered.get("service_status", {}).get("message", "unknown"))
        table.add_row(*row)
    return table


def save_facts(result: RunResult) -> Path:
    """results/<run-id>/facts.json (all hosts) and results/<run-id>/<host>/facts.json."""
    everything: dict[str, Any] = {}
    for name, host in result.hosts.items():
        f = {
            k: v
            for k, v in host.registered.get("host_facts", {}).items()
            if k not in ("status", "changed", "message")
        }
        if f:
            f["gpu_stack"] = host.registered.get("gpu_facts", {}).get("summary")
        everything[name] = f or None
        if f:
            (result.run_dir / name).mkdir(exist_ok=True)
            (result.run_dir / name / "facts.json").write_text(json.dumps(f, indent=2) + "\n")
    path = result.run_dir / "facts.json"
    path.write_text(json.dumps(everything, indent=2) + "\n")
    return path


def _facts_task(playbook: str, title: str, **opts: Any) -> None:
    result = run_file(PLAYBOOKS / playbook, **opts)
    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
    console.print(facts_table(result, title))
    console.print(f"saved {save_facts(result)}")
    _finish(result)


# facts and status are read-only playbooks: --check is accepted for uniformity and changes nothing.
@fab_task()
def facts(**opts: Any) -> None:
    """Gather OS, CPU, memory, disk, python, systemd and GPU facts: one table for all hosts."""
    _facts_task("facts.yaml", "host facts", **opts)


@fab_task()
def status(**opts: Any) -> None:
    """Show each host's reachability, facts, current release and server health (playbooks/status.yaml)."""
    _facts_task("status.yaml", "host status", **opts)


# ---------------------------------------------------------------- bench and tune
def bench_dir(book_path: Path, results: str | None, resume: str | None) -> Path:
    """results/<run-id> of a new benchmark run, or of the run ``resume`` names (``latest`` works)."""
    root = Path(results) if results else DEFAULT_RESULTS
    if resume:
        return resume_dir(root, resume)
    return make_run_dir(root / new_run_id(load_playbook(book_path))).resolve()


def run_bench_file(
    playbook: str | Path,
    *,
    limit: str | None = None,
    check: bool = False,
    inventory: str | None = None,
    forks: int | str | None = None,
    results: str | None = None,
    resume: str | None = None,
    extra_vars: dict[str, Any] | None = None,
    live: bool | None = None,
) -> tuple[RunResult, Path]:
    """Run a bench/tune playbook into one run directory that holds every cell of every attempt.

    The cells of ``results/<run-id>/<host>/`` outlive an interrupted attempt; each attempt's runner
    files go to ``results/<run-id>/runs/<attempt>/``, the newest summary is copied to
    ``results/<run-id>/summary.json`` and ``results/latest`` points at the run.
    """
    try:
        hosts = load_inventory(inventory).select(limit)
        book = load_playbook(playbook)
        run_dir = bench_dir(Path(playbook), results, resume)
        if extra_vars:
            hosts = [dataclasses.replace(h, vars={**h.vars, **extra_vars}) for h in hosts]
        with BenchProgress(live=live) as progress:
            result = run_playbook(
                book,
                hosts,
                check=check,
                forks=parse_forks(forks),
                results_root=run_dir / "runs",
                live=False,
                results_dir=run_dir,
                progress=progress,
            )
    except SpecopsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise Exit(code=2) from None
    result.record_error = publish_summary(result, run_dir)
    return result, run_dir


def _report(run_dir: Path, console: Console) -> None:
    if not find_results([run_dir]):
        console.print(f"no results in {run_dir} yet")
        return
    report = make_report([run_dir], run_dir)
    console.print(report.table)
    console.print(f"report {report.markdown_path}" + "".join(f"\nplot {p}" for p in report.plots))


RESUME_HELP = "RUN_ID (or latest) of an interrupted run: measure only its missing cells"


@fab_task(
    matrix="benchmark matrix file (default: playbooks/bench-matrix.yaml; bench-quick.yaml on cpu hosts)",
    resume=RESUME_HELP,
)
def bench(matrix: str | None = None, resume: str | None = None, **opts: Any) -> None:
    """Benchmark each host's servers over a matrix; results, logs, report.md and plots in results/<run-id>/."""
    if matrix and not Path(matrix).is_file():
        raise SpecopsError(
            f"--matrix {matrix}: no such file (fix: e.g. --matrix playbooks/bench-matrix.yaml)"
        )
    extra = {"bench_matrix": str(Path(matrix).resolve())} if matrix else {}
    result, run_dir = run_bench_file(PLAYBOOKS / "bench.yaml", resume=resume, extra_vars=extra, **opts)
    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
    if not opts["check"]:
        _report(run_dir, console)
    console.print(
        f"run directory {run_dir}" + ("" if result.ok else f" (resume: fab bench --resume {run_dir.name})")
    )
    _finish(result)


def sweep_table(result: RunResult) -> Table:
    """One row per host and swept point, the chosen one marked."""
    table = Table(title="fab tune: DDTree budget sweep")
    for column in ("host", "system", "mode", "budget / k", "tok/s", "τ", "speedup", "chosen"):
        table.add_column(column, justify="right" if column in ("tok/s", "τ", "speedup") else "left")
    for name, host in result.hosts.items():
        sweep = host.registered.get("sweep", {})
        for row in sweep.get("sweep", []):
            setting = row["budget"] if row["budget"] is not None else row["num_speculative_tokens"]
            chosen = row == sweep.get("best")
            table.add_row(
                name,
                row["system"],
                row["mode"],
                str(setting),
                f"{row['tokens_per_s']:.1f}",
                "-" if row["tau"] is None else f"{row['tau']:.2f}",
                f"{row['speedup']:.2f}x",
                "<-" if chosen else "",
            )
        if not sweep.get("sweep"):
            table.add_row(name, Text(sweep.get("message", "not run"), style="red"))
    return table


@fab_task()
def tune(**opts: Any) -> None:
    """Sweep the DDTree budget, serve the best tokens/s (written to <base>/run, restarted via the deploy steps)."""
    result, run_dir = run_bench_file(PLAYBOOKS / "tune.yaml", **opts)
    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
    if not opts["check"]:
        console.print(sweep_table(result))
        _report(run_dir, console)
    _finish(result)


@fab_task(resume="RUN_ID (or latest) of an earlier run: keep its results folder")
def train_drafter(resume: str | None = None, **opts: Any) -> None:
    """Train a DFlash drafter on each host (resumable); progress, drafter and tau come home to results/<run-id>/."""
    result, run_dir = run_bench_file(PLAYBOOKS / "train-drafter.yaml", resume=resume, **opts)
    Console().print(f"run directory {run_dir}")
    _finish(result)


ns = Collection(
    play, provision, facts, status, deploy, bench, tune, rollback, lint_drafter, patch_drafter, train_drafter
)
