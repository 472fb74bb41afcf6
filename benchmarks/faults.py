"""Fault injection into `fab deploy` (issue 15): faults at random points of a deploy, then the
invariants a user relies on.

A real sshd host on 127.0.0.2 (the test suite's daemon), the real server on the CPU with the tiny
pair, and one good release deployed first. Each run commits a new release and deploys it while one
fault strikes after a random delay:

- ``kill-server``: SIGKILL the running server (the OOM killer, an operator's mistake);
- ``cut-sshd``: kill sshd with every session it forked, restart it two seconds later;
- ``broken-release``: the new release crashes at start-up.

After each run: ``current`` names a complete release; the state file, the environment file and the
supervisor script are whole; a server answers within a minute (the old one when the new one could
not); if none does, one more ``fab deploy`` must bring one back. Prints one JSON line per run and
a summary. Needs root or an sshd that runs as the current user, like the tests (``make test``).

    PYTHONPATH=. .venv/bin/python benchmarks/faults.py --runs 6 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import tempfile
import threading
import time
from pathlib import Path

import yaml

from ddtree_runtime.tiny import write_tiny_pair
from tests.deploy.helpers import (
    CRASH_AT_START,
    MAIN,
    Checkout,
    deploy,
    free_port,
    healthy,
    host_vars,
    link,
    running_release,
    stop_servers,
    with_crash,
)
from tests.sshd import SshdHost, keygen

FAULTS = ("kill-server", "cut-sshd", "broken-release")


def inventory_for(host: SshdHost, folder: Path, variables: dict) -> Path:
    known = folder / "known_hosts"
    known.write_text(host.known_hosts_line + "\n")
    data = {
        "defaults": {"known_hosts": [str(known)]},
        "hosts": {host.name: {**host.host_entry(), "vars": variables}},
    }
    path = folder / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def files_whole(base: Path) -> bool:
    """The files a deploy writes are absent or whole: never a short or half-written one."""
    run = base / "run"
    state, env, supervisor = (
        run / "specops-ddtree.state",
        run / "specops-ddtree.env",
        base / "bin" / "specops-supervisor.py",
    )
    try:
        if state.exists():
            json.loads(state.read_text())
        if env.exists() and any(
            "=" not in line
            for line in env.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ):
            return False
        if supervisor.exists():
            compile(supervisor.read_text(), str(supervisor), "exec")
    except (ValueError, SyntaxError):
        return False
    return True


def strike(fault: str, host: SshdHost, base: Path) -> str:
    if fault == "kill-server":
        pidfile = base / "run" / "specops-ddtree.pid"
        try:
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGKILL)
            return f"killed pid {pid}"
        except (OSError, ValueError):
            return "no server to kill"
    host.stop()
    time.sleep(2)
    host.start()
    return "sshd cut for 2 s"


def answering(port: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if healthy(port):
            return True
        time.sleep(0.5)
    return False


def one_run(
    i: int, rng: random.Random, host: SshdHost, checkout: Checkout, inventory: Path, results: Path, port: int
) -> dict:
    fault = rng.choice(FAULTS)
    edits = {MAIN: with_crash(checkout.read(MAIN), CRASH_AT_START)} if fault == "broken-release" else {}
    if fault != "broken-release" and CRASH_AT_START in checkout.read(MAIN):
        edits = {MAIN: checkout.read(MAIN).replace(CRASH_AT_START, "")}
    checkout.commit(f"run {i}: {fault}", edits)
    delay = rng.uniform(0.0, 8.0)  # a deploy of a new release takes about 10 s on the CPU test host
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("result", deploy(inventory, results)))
    began = time.monotonic()
    worker.start()
    note = ""
    if fault != "broken-release":
        worker.join(delay)
        note = strike(fault, host, host.base) if worker.is_alive() else "deploy ended before the fault"
    worker.join()
    result = outcome["result"]
    current = link(host.base, "current")
    complete = current is not None and (host.base / "releases" / current / "COMPLETE").is_file()
    answers = answering(port, 60)
    recovered = None
    if not answers:
        recovered = deploy(inventory, results).ok and answering(port, 60)
    pid_file = host.base / "run" / "specops-ddtree.pid"
    serving = running_release(int(pid_file.read_text())) if answers and pid_file.exists() else None
    return {
        "run": i,
        "fault": fault,
        "at_s": round(delay, 1),
        "note": note,
        "deploy_ok": result.ok,
        "seconds": round(time.monotonic() - began, 1),
        "current_complete": complete,
        "files_whole": files_whole(host.base),
        "answers": answers,
        "serving": serving,
        "current": current,
        "recovered_by_redeploy": recovered,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="specops-faults-"))
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    key = work / "id_ed25519"
    keygen(key)
    host = SshdHost("h1", "127.0.0.2", work / "h1", key)
    host.start()
    try:
        pair = write_tiny_pair(work / "pair")
        checkout = Checkout.create(work / "checkout")
        port = free_port()
        inventory = inventory_for(host, work, host_vars(pair, checkout, port))
        results = work / "results"
        assert deploy(inventory, results).ok, "the first deploy must succeed"
        rows = [one_run(i, rng, host, checkout, inventory, results, port) for i in range(args.runs)]
        for row in rows:
            print(json.dumps(row), flush=True)
        print(
            f"\n{len(rows)} runs; faults: "
            + ", ".join(f"{f} {sum(r['fault'] == f for r in rows)}" for f in FAULTS)
        )
        for key_ in ("deploy_ok", "current_complete", "files_whole", "answers"):
            print(f"{key_}: {sum(bool(r[key_]) for r in rows)}/{len(rows)}")
        print(
            f"recovered by one more deploy: {sum(bool(r['recovered_by_redeploy']) for r in rows)}"
            f"/{sum(r['recovered_by_redeploy'] is not None for r in rows)} that needed it"
        )
    finally:
        stop_servers(host.base)
        host.stop()


if __name__ == "__main__":
    main()
