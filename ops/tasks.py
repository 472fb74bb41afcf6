"""Fabric tasks (``fab provision|status|facts|play FILE``): thin wrappers over the runner.

Each task loads the inventory, selects hosts with ``--limit``, runs one playbook and exits
non-zero when a host failed (1) or the input was wrong (2), so shell scripts and CI can rely on
``fab``'s exit status. ``fabfile.py`` at the repo root only re-exports ``ns``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from invoke import Collection, task
from invoke.exceptions import Exit
from rich.console import Console
from rich.table import Table

from ops.errors import SpecopsError
from ops.inventory import load_inventory
from ops.playbook import load_playbook
from ops.runner import DEFAULT_FORKS, REPO_ROOT, RunResult, run_playbook

PLAYBOOKS = REPO_ROOT / "playbooks"

COMMON_HELP = {
    "limit": "only these hosts or groups, comma-separated (default: every host)",
    "check": "probe and plan only: print would-be changes and diffs, write nothing",
    "inventory": "inventory file (default: inventory.yaml at the repo root)",
    "forks": f"hosts run in parallel (default {DEFAULT_FORKS})",
    "tags": "only steps with one of these tags, comma-separated",
    "results": "results folder (default: results/ at the repo root)",
}


def run_file(playbook: str | Path, *, limit: str | None = None, check: bool = False,
             inventory: str | None = None, forks: int = DEFAULT_FORKS, tags: str | None = None,
             results: str | None = None) -> RunResult:
    """Load everything first (so input errors stop before any host is touched), then run."""
    try:
        hosts = load_inventory(inventory).select(limit)
        book = load_playbook(playbook)
        selected = {t.strip() for t in tags.split(",") if t.strip()} if tags else None
        return run_playbook(book, hosts, check=check, forks=int(forks), tags=selected, results_root=results)
    except SpecopsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise Exit(code=2) from None


def _finish(result: RunResult) -> None:
    if not result.ok:
        raise Exit(code=1)


@task(help={"file": "the playbook YAML to run", **COMMON_HELP})
def play(c, file, limit=None, check=False, inventory=None, forks=DEFAULT_FORKS, tags=None, results=None):
    """Run any playbook FILE over the inventory."""
    _finish(run_file(file, limit=limit, check=check, inventory=inventory, forks=forks, tags=tags,
                     results=results))


@task(help=COMMON_HELP)
def provision(c, limit=None, check=False, inventory=None, forks=DEFAULT_FORKS, tags=None, results=None):
    """Provision hosts: base layout, Python stack, facts (playbooks/provision.yaml)."""
    _finish(run_file(PLAYBOOKS / "provision.yaml", limit=limit, check=check, inventory=inventory, forks=forks,
                     tags=tags, results=results))


def facts_table(result: RunResult, title: str) -> Table:
    """One row per host from the ``host_facts`` each host registered (a failed host shows why)."""
    table = Table(title=title)
    for column in ("host", "os", "cpus", "memory", "disk free", "python", "systemd", "gpus", "venv", "release"):
        table.add_column(column)
    for name, host in result.hosts.items():
        f = host.registered.get("host_facts")
        if not f or "os" not in f:
            reason = next((s.message for s in host.steps if s.status == "failed"), "no facts")
            table.add_row(name, f"[red]unreachable or failed: {reason}[/red]")
            continue
        gpus = ", ".join(f"{g['name']} (sm_{g['compute_cap'].replace('.', '')})" for g in f["gpus"]) or "none"
        table.add_row(name, f["os"]["name"], f"{f['cpu']['count']} ({f['cpu']['model']})",
                      f"{f['memory']['total_gib']} GiB", f"{f['disk']['free_gib']} GiB",
                      f["python"]["version"] or "none",
                      "usable" if f["systemd"]["usable"] else "no", gpus, f["venv"] or "none",
                      f["release"] or "none")
    return table


def save_facts(result: RunResult) -> Path:
    """results/<run-id>/facts.json (all hosts) and results/<run-id>/<host>/facts.json."""
    everything: dict[str, Any] = {}
    for name, host in result.hosts.items():
        f = {k: v for k, v in host.registered.get("host_facts", {}).items()
             if k not in ("status", "changed", "message")}
        everything[name] = f or None
        if f:
            (result.run_dir / name).mkdir(exist_ok=True)
            (result.run_dir / name / "facts.json").write_text(json.dumps(f, indent=2) + "\n")
    path = result.run_dir / "facts.json"
    path.write_text(json.dumps(everything, indent=2) + "\n")
    return path


def _facts_task(playbook: str, title: str, limit, inventory, forks, results) -> None:
    result = run_file(PLAYBOOKS / playbook, limit=limit, inventory=inventory, forks=forks, results=results)
    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
    console.print(facts_table(result, title))
    console.print(f"saved {save_facts(result)}")
    _finish(result)


FACTS_HELP = {k: v for k, v in COMMON_HELP.items() if k not in ("check", "tags")}


@task(help=FACTS_HELP)
def facts(c, limit=None, inventory=None, forks=DEFAULT_FORKS, results=None):
    """Gather OS, CPU, memory, disk, python, systemd and GPU facts: one table for all hosts."""
    _facts_task("facts.yaml", "host facts", limit, inventory, forks, results)


@task(help=FACTS_HELP)
def status(c, limit=None, inventory=None, forks=DEFAULT_FORKS, results=None):
    """Show each host's reachability, current release, venv and GPUs (playbooks/status.yaml)."""
    _facts_task("status.yaml", "host status", limit, inventory, forks, results)


ns = Collection(play, provision, facts, status)
