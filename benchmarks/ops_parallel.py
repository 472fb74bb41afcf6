"""Runner scaling: a 20-step playbook on 1 and on 8 real sshd hosts, first run vs second (no-op) run.

Goals (issue 2): the 8-host wall time at most 1.5x the 1-host time (hosts run in parallel), and
the second run at most 25% of the first (a satisfied step costs one read-only probe). The first
run does real work: directories, 1 MiB file copies, templates, line edits, a command writing
4 MiB, and one modelled install (``sleep 2``): on loopback every "host" shares the controller's
CPUs, so real host-side CPU work (a pip install) would measure this machine's cores, not the
runner; a remote install is mostly wall time the controller spends waiting, which sleep models.
Daemons come from the test harness (tests/sshd.py).

    .venv/bin/python benchmarks/ops_parallel.py [--hosts 8] [--repeat 3]

``--repeat`` keeps the best of N for each figure (other load on the machine only adds time).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ops.inventory import load_inventory
from ops.playbook import load_playbook
from ops.runner import run_playbook
from tests.sshd import SshdHost, keygen, start_all

TEMPLATE = "# {{ name }} shard {{ shard }}\n{% for i in range(200) %}key{{ i }}={{ name }}-{{ shard }}-{{ i }}\n{% endfor %}"


def write_playbook(folder: Path) -> Path:
    """20 steps: 6 directories, 5 file copies, 5 templates, 2 line edits, 2 guarded commands."""
    steps = [
        {
            "name": f"dir {i}",
            "step": "directory",
            "args": {"path": f"{{{{ base }}}}/bench/d{i}", "mode": "0755"},
        }
        for i in range(6)
    ]
    for i in range(5):
        (folder / f"blob{i}.bin").write_bytes(os.urandom(1024 * 1024))
        steps.append(
            {
                "name": f"copy {i}",
                "step": "file_copy",
                "args": {
                    "src": f"blob{i}.bin",
                    "dest": f"{{{{ base }}}}/bench/d{i}/blob.bin",
                    "mode": "0644",
                },
            }
        )
    (folder / "shard.j2").write_text(TEMPLATE)
    for i in range(5):
        steps.append(
            {
                "name": f"template {i}",
                "step": "template",
                "args": {
                    "src": "shard.j2",
                    "dest": f"{{{{ base }}}}/bench/d{i}/shard.conf",
                    "mode": "0600",
                    "vars": {"shard": i},
                },
            }
        )
    for i in range(2):
        steps.append(
            {
                "name": f"line {i}",
                "step": "line_in_file",
                "args": {
                    "path": f"{{{{ base }}}}/bench/app{i}.conf",
                    "line": "workers={{ name }}",
                    "regexp": "^workers=",
                },
            }
        )
    out = "{{ base }}/bench/data.sha"
    steps.append(
        {
            "name": "generate data",
            "step": "command",
            "args": {
                "cmd": f"head -c 4194304 /dev/urandom > {out}.bin && sha256sum {out}.bin > {out}",
                "creates": out,
            },
        }
    )
    steps.append(
        {
            "name": "modelled install",
            "step": "command",
            "args": {
                "cmd": "sleep 2 && touch {{ base }}/bench/installed",
                "creates": "{{ base }}/bench/installed",
            },
        }
    )
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump({"name": "ops-parallel-bench", "steps": steps}, sort_keys=False))
    return path


def timed_run(playbook: Path, inventory: Path) -> tuple[float, int]:
    book, hosts = load_playbook(playbook), load_inventory(inventory).select(None)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        result = run_playbook(book, hosts, forks=8, results_root=inventory.parent / "results", live=False)
    elapsed = time.perf_counter() - start
    if not result.ok:
        raise SystemExit(f"benchmark run failed: {(result.run_dir / 'run.log').read_text()[-3000:]}")
    return elapsed, sum(1 for h in result.hosts.values() for s in h.steps if s.changed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="best of N fresh runs per figure")
    options = parser.parse_args()
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ops-bench-") as tmp:
        root = Path(tmp)
        key = root / "client_key"
        keygen(key)
        daemons = [
            SshdHost(f"h{i + 1}", f"127.0.0.{i + 2}", root / f"h{i + 1}", key) for i in range(options.hosts)
        ]
        start_all(daemons)
        try:
            playbook = write_playbook(root)
            known = root / "known_hosts"
            known.write_text("".join(d.known_hosts_line + "\n" for d in daemons))
            figures: dict[int, tuple[float, float, int, int]] = {}
            for count in (1, options.hosts):
                best_first = best_second = float("inf")
                for attempt in range(options.repeat):
                    entries = {
                        d.name: {**d.host_entry(), "base": str(d.base / f"n{count}-{attempt}")}
                        for d in daemons[:count]
                    }
                    inventory = root / f"inventory-{count}-{attempt}.yaml"
                    inventory.write_text(
                        yaml.safe_dump({"defaults": {"known_hosts": [str(known)]}, "hosts": entries})
                    )
                    first, changed_first = timed_run(playbook, inventory)
                    second, changed_second = timed_run(playbook, inventory)
                    if changed_second:
                        raise SystemExit(f"second run changed {changed_second} steps: not idempotent")
                    best_first, best_second = min(best_first, first), min(best_second, second)
                figures[count] = (best_first, best_second, changed_first, changed_second)
        finally:
            for daemon in daemons:
                daemon.stop()
    one, many = figures[1], figures[options.hosts]
    print(
        f"ops_parallel: 20-step playbook, forks=8, best of {options.repeat}, "
        f"{platform.processor() or platform.machine()} x{os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    print(
        f"{'hosts':>5} {'first run s':>12} {'second run s':>13} {'changed 1st':>12} {'changed 2nd':>12} {'2nd/1st':>8}"
    )
    for count, (first, second, c1, c2) in figures.items():
        print(f"{count:>5} {first:>12.2f} {second:>13.2f} {c1:>12} {c2:>12} {second / first:>8.0%}")
    scale_first, scale_second = many[0] / one[0], many[1] / one[1]
    per_step = many[1] / (options.hosts * 20) * 1000
    print(
        f"no-op cost: {one[1] / 20 * 1000:.0f} ms per step on 1 host, {per_step:.0f} ms per host-step on "
        f"{options.hosts} hosts (connect included)"
    )
    print(
        f"{options.hosts}-host / 1-host: first run {scale_first:.2f}x, second run {scale_second:.2f}x "
        f"(goal <= 1.5x: {'met' if max(scale_first, scale_second) <= 1.5 else 'NOT met'})"
    )
    ratio = max(one[1] / one[0], many[1] / many[0])
    print(f"second / first: worst {ratio:.0%} (goal <= 25%: {'met' if ratio <= 0.25 else 'NOT met'})")


if __name__ == "__main__":
    main()
