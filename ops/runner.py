"""Run a playbook over hosts: probe -> plan -> apply per step, hosts in parallel.

Each host runs its whole playbook in one worker of a bounded pool (``forks``), because a playbook
is a sequence per host, not a set of independent calls (Fabric's ThreadingGroup parallelises only
single calls). A failed step stops its host only; every other host runs to the end, and the result
is one per-host map (`ops.results.RunResult`), written to ``results/<run-id>/summary.json``;
``run.log`` beside the summary keeps every line, diff and failure. Everything shown or stored
passes through one Redactor that knows every resolved secret of the run.

A playbook with ``lock: true`` holds each host's lock (``ops/hostlock.py``) while it runs there.
A first Ctrl-C (SIGINT) never cuts a step short: every host finishes the step in progress, skips
the rest, and the summary says ``"interrupted": true``; `ops.results.interrupted_message` says
where each host stopped and how to continue. A second Ctrl-C abandons the hosts still busy: their
connections are closed, their step fails as abandoned, and the summary is written all the same.

Nothing a host does may hold the run forever: every command without its own timeout gets the
step's (``timeout:`` in the playbook, else DEFAULT_COMMAND_TIMEOUT_S), and an SSH host that stops
answering is dropped by its connection's keepalive (``ops/connection/ssh.py``). Hosts run on
daemon threads, so a host stuck past all of that cannot keep the process from exiting.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops import hostlock
from ops.api.args import ArgError
from ops.api.changes import Applied, StepFailed
from ops.api.context import Progress, StepContext
from ops.connection import connect
from ops.errors import SpecopsError
from ops.hosts import Host
from ops.layout import HostLayout
from ops.output import Reporter
from ops.playbook import Playbook, RenderError, StepSpec, evaluate_when, render
from ops.redact import Redactor
from ops.results import (
    INTERRUPTED,
    HostResult,
    RunResult,
    StepResult,
    make_run_dir,
    new_run_id,
    record_run,
)
from ops.steps import get_step
from ops.steps.base import Step

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
DEFAULT_RESULTS = REPO_ROOT / "results"
DEFAULT_FORKS = 8
RETRY_DELAY = 1.0
DEFAULT_COMMAND_TIMEOUT_S = 3600.0  # a command of a step without its own timeout (playbook `timeout:`)
ABANDON_GRACE_S = 5.0  # after a second Ctrl-C, how long hosts get to report before they are left
ABANDONED = "abandoned: a second Ctrl-C stopped waiting for this host"


def check_key_files(hosts: list[Host]) -> None:
    """A key_file that does not exist is the user's to fix: say so before connecting anywhere."""
    for host in hosts:
        if host.connection == "ssh" and host.key_file and not os.path.isfile(host.key_file):
            raise SpecopsError(
                f"host '{host.name}': key_file {host.key_file} does not exist (fix: correct key_file "
                "in the inventory, or create the key with ssh-keygen)"
            )


@dataclass(frozen=True)
class RunWide:
    """What every host's steps share in one run (the steps see it through their StepContext)."""

    run_id: str
    playbook: Playbook
    check: bool
    tags: set[str] | None
    redactor: Redactor
    reporter: Reporter
    results_dir: Path
    progress: Progress | None
    stop: threading.Event = field(default_factory=threading.Event)  # set by Ctrl-C
    abandon: threading.Event = field(default_factory=threading.Event)  # set by a second Ctrl-C
    connections: dict[str, Any] = field(default_factory=dict)  # host -> its open Connection

    def abandon_hosts(self) -> None:
        """A second Ctrl-C: end what every host runs now; its step fails as abandoned."""
        self.abandon.set()
        for conn in list(self.connections.values()):
            conn.abandon(ABANDONED)

    def context(self, host: Host, variables: dict[str, Any]) -> StepContext:
        return StepContext(
            host=host,
            playbook_dir=self.playbook.dir,
            templates_dir=TEMPLATES_DIR,
            vars=dict(variables),
            check=self.check,
            run_dir=self.results_dir,
            reporter=self.reporter,
            progress=self.progress,
        )


def run_playbook(
    playbook: Playbook,
    hosts: list[Host],
    *,
    check: bool = False,
    forks: int = DEFAULT_FORKS,
    tags: set[str] | None = None,
    results_root: str | Path | None = None,
    redactor: Redactor | None = None,
    live: bool | None = None,
    results_dir: Path | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Run ``playbook`` on every host; never raises for a host's failure (see RunResult).

    ``results_dir`` is the steps' ``ctx.run_dir`` (default: this run's own directory; ``fab bench``
    passes the run it measures into), ``progress`` their ``ctx.progress``.
    """
    if forks < 1:
        raise SpecopsError(f"--forks must be at least 1, got {forks}")
    if not hosts:
        raise SpecopsError("no hosts selected (fix: check --limit against the inventory)")
    check_key_files(hosts)
    root = Path(results_root) if results_root is not None else DEFAULT_RESULTS
    run_id = new_run_id(playbook)
    run_dir = make_run_dir(root / run_id)
    redactor = redactor or Redactor()
    result = RunResult(run_id, playbook, check, {}, run_dir)
    with Reporter(
        playbook,
        [h.name for h in hosts],
        check=check,
        log_path=run_dir / "run.log",
        redactor=redactor,
        live=live,
    ) as reporter:
        reporter.note(
            f"run {run_id}: playbook {playbook.path} on {len(hosts)} host(s)"
            + (" [check mode: nothing will be written]" if check else "")
        )
        run = RunWide(run_id, playbook, check, tags, redactor, reporter, results_dir or run_dir, progress)
        with hostlock.active(run_id), _interruptible(run):
            result.hosts.update(_run_hosts(hosts, run, forks))
        result.interrupted = run.stop.is_set()
        result.record_error = record_run(result, redactor, root)
        reporter.close(result)
    return result


def _run_hosts(hosts: list[Host], run: RunWide, forks: int) -> dict[str, HostResult]:
    """Every host on its own daemon thread, at most ``forks`` at once; in inventory order.

    After a second Ctrl-C, a host that has not reported within ABANDON_GRACE_S is recorded as
    abandoned where it stood, and its thread is left behind (it cannot hold the exit)."""
    slots = threading.BoundedSemaphore(max(1, min(forks, len(hosts))))
    outcomes: dict[str, HostResult] = {}

    def work(host: Host) -> None:
        with slots:
            outcomes[host.name] = _not_started(host, run) if run.stop.is_set() else _run_host(host, run)

    threads = [threading.Thread(target=work, args=(h,), name=f"host-{h.name}", daemon=True) for h in hosts]
    for thread in threads:
        thread.start()
    deadline = None
    for thread in threads:
        while thread.is_alive():
            if run.abandon.is_set():
                deadline = deadline or time.monotonic() + ABANDON_GRACE_S
                if time.monotonic() >= deadline:
                    break
            thread.join(0.1)
    left = StepResult("abandoned", "abandoned", "failed", False, ABANDONED)
    return {h.name: outcomes.get(h.name) or HostResult(h.name, [left], interrupted=True) for h in hosts}


def _not_started(host: Host, run: RunWide) -> HostResult:
    """A host whose turn came after Ctrl-C: every step skipped, nothing connected."""
    outcome = HostResult(host.name, interrupted=True)
    for spec in run.playbook.steps:
        outcome.steps.append(StepResult(spec.name, spec.step, "skipped", False, INTERRUPTED))
        run.reporter.step_finished(host.name, spec, outcome.steps[-1])
    run.reporter.host_finished(host.name, outcome)
    return outcome


class _interruptible:
    """While a run is on, the first Ctrl-C asks every host to stop after its current step (a step
    cut in half could leave a host with no server); the second abandons the hosts still busy."""

    def __init__(self, run: RunWide) -> None:
        self.run = run
        self.previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.run.stop.is_set():
            self.run.stop.set()
            os.write(
                2,
                b"\ninterrupted: finishing the step in progress on each host, then stopping (the steps "
                b"are not cut short; Ctrl-C again to abandon the hosts still busy)\n",
            )
            return
        if not self.run.abandon.is_set():
            os.write(2, b"\ninterrupted again: abandoning the hosts still busy; writing the summary\n")
            self.run.abandon_hosts()

    def __enter__(self) -> _interruptible:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _run_host(host: Host, run: RunWide) -> HostResult:
    """The whole playbook on one host; the first unignored failure skips the rest.

    Secrets are resolved first: a host whose secret cannot be resolved fails before any step runs,
    so no step ever writes an env file with a key silently missing. Nothing raised here may take
    the other hosts (or the summary) down with it.
    """
    start = time.monotonic()
    outcome = HostResult(host.name)
    reporter = run.reporter
    stage = "secrets"
    try:
        secret_values = host.resolve_secrets(run.redactor)
        stage = "connect"
        variables: dict[str, Any] = {
            **host.template_vars(),
            "layout": HostLayout(host.base),
            "secrets": secret_values,
            "check": run.check,
        }
        with (
            connect(host, redactor=run.redactor) as conn,
            _tracked(conn, host, run),
            _host_lock(conn, host, run),
        ):
            for spec in run.playbook.steps:
                if outcome.failed:
                    step = StepResult(
                        spec.name, spec.step, "skipped", False, "not run: an earlier step failed"
                    )
                elif run.stop.is_set():
                    outcome.interrupted = True
                    step = StepResult(spec.name, spec.step, "skipped", False, INTERRUPTED)
                else:
                    reporter.step_started(host.name, spec)
                    step = _run_step(conn, host, spec, variables, run)
                    step.redact(run.redactor)
                    if spec.register:
                        variables[spec.register] = outcome.registered[spec.register] = step.registered()
                outcome.steps.append(step)
                reporter.step_finished(host.name, spec, step)
    except SpecopsError as exc:  # secrets, connection set-up or the lock, before any step could report it
        what = "lock" if isinstance(exc, hostlock.LockError) else stage
        outcome.steps.append(StepResult(what, what, "failed", False, str(exc)))
        reporter.step_finished(host.name, None, outcome.steps[-1])
    except Exception as exc:  # a bug outside any step: this host fails, the run and its summary go on
        reporter.note(f"{host.name} | internal error:\n{traceback.format_exc()}")
        outcome.steps.append(
            StepResult(
                stage,
                stage,
                "failed",
                False,
                run.redactor.redact(f"internal error: {type(exc).__name__}: {exc}"),
            )
        )
        reporter.step_finished(host.name, None, outcome.steps[-1])
    outcome.duration = time.monotonic() - start
    reporter.host_finished(host.name, outcome)
    return outcome


@contextmanager
def _tracked(conn: Any, host: Host, run: RunWide) -> Iterator[None]:
    """The host's connection, where a second Ctrl-C can reach it."""
    run.connections[host.name] = conn
    if run.abandon.is_set():
        conn.abandon(ABANDONED)
    try:
        yield
    finally:
        run.connections.pop(host.name, None)


@contextmanager
def _host_lock(conn: Any, host: Host, run: RunWide) -> Iterator[None]:
    """The host's lock around a changing playbook (never under --check)."""
    if not run.playbook.lock or run.check:
        yield
        return
    mine = hostlock.acquire(
        conn, host.name, host.base, run.run_id, lambda text: run.reporter.note(f"{host.name} | {text}")
    )
    try:
        yield
    finally:
        with suppress(SpecopsError):  # a lost connection leaves a lock the next run finds stale
            hostlock.release(conn, host.base, mine)


def _run_step(conn: Any, host: Host, spec: StepSpec, variables: dict[str, Any], run: RunWide) -> StepResult:
    start = time.monotonic()

    def finish(status: str, changed: bool, message: str, **extra: Any) -> StepResult:
        ignored = status == "failed" and spec.ignore_errors
        return StepResult(
            spec.name,
            spec.step,
            status,
            changed,
            message + (" (ignored: ignore_errors)" if ignored else ""),
            duration=time.monotonic() - start,
            ignored=ignored,
            **extra,
        )

    if run.tags and not run.tags & set(spec.tags):
        return finish("skipped", False, f"not tagged {', '.join(sorted(run.tags))}")
    try:
        if not evaluate_when(spec.when, variables):
            return finish("skipped", False, f"when is false: {spec.when}")
        step = get_step(spec.step)()
        args = step.check_args(render(spec.args, variables))
    except (RenderError, ArgError) as exc:
        return finish("failed", False, f"step '{spec.name}' on host '{host.name}': {exc}")
    ctx = run.context(host, variables)
    conn.default_timeout = spec.timeout or DEFAULT_COMMAND_TIMEOUT_S
    failure: StepResult | None = None
    for attempt in range(spec.retries + 1):
        if attempt:
            run.reporter.note(
                f"{host.name} | retry {attempt}/{spec.retries} of '{spec.name}': {failure.message}"
            )
            time.sleep(RETRY_DELAY)
        try:
            return _attempt_step(conn, step, args, ctx, run.check, finish)
        except Exception as exc:
            failure = _step_failure(exc, host, spec, run.reporter, finish)
    assert failure is not None
    return failure


def _attempt_step(
    conn: Any,
    step: Step,
    args: dict[str, Any],
    ctx: StepContext,
    check: bool,
    finish: Callable[..., StepResult],
) -> StepResult:
    """One probe -> plan -> apply pass (probe -> plan only under --check); failures raise."""
    facts = step.probe(conn, args, ctx)
    plan = step.plan(facts, args, ctx)
    changes = [c.describe() for c in plan.changes]
    if check:
        return finish(
            "changed" if plan.will_change else "ok",
            plan.will_change,
            plan.reason,
            changes=changes,
            diff=plan.diff,
            data=plan.data,
        )
    applied = step.apply(conn, plan, ctx) if plan.will_change else Applied(False, plan.reason, plan.data)
    message = applied.message
    if applied.changed and not step.is_idempotent(args):
        message += " (not idempotent)"
    return finish(
        "changed" if applied.changed else "ok",
        applied.changed,
        message,
        changes=changes if applied.changed else [],
        diff=plan.diff if applied.changed else "",
        data=applied.data,
    )


def _step_failure(
    exc: Exception, host: Host, spec: StepSpec, reporter: Reporter, finish: Callable[..., StepResult]
) -> StepResult:
    """The failed result of one attempt; called inside the ``except`` so a bug's traceback is logged."""
    if isinstance(exc, StepFailed):
        return finish(
            "failed", False, str(exc), command=exc.command, stderr=exc.stderr, data={"stderr": exc.stderr}
        )
    if isinstance(exc, SpecopsError):  # HostUnreachable, HostKeyError, ...
        return finish("failed", False, str(exc))
    if isinstance(exc, OSError):  # a file operation the host refused (ENOENT, EACCES): the user's to fix
        return finish("failed", False, f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
    # a bug in a step must not take the other hosts down
    reporter.note(f"{host.name} | internal error in step '{spec.name}':\n{traceback.format_exc()}")
    return finish("failed", False, f"internal error: {type(exc).__name__}: {exc}")
