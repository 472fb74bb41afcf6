"""One host's benchmark session: start each server, measure its cells, bring results home.

One GPU holds one model, so servers run one at a time. Our DDTree server is switched between
modes and budgets by re-planning it through the service lifecycle (``ops/service``: the same
launch fingerprint, backend and health wait as ``fab deploy``); vLLM and SGLang start under the
built-in supervisor from the command-line template ``fab deploy`` uses too
(``templates/serve-<system>.argv.j2``, run from ``<base>/venvs/<system>``) after our
server is stopped, unless a server already answers on the entry's port listing the served model:
that one is reused as it is, and left running, since this run did not start it. Every cell runs
our client on the host (``python -m ops.bench.client``); its JSON comes home over SFTP and is
written atomically to ``results/<run-id>/<host>/<cell-id>.json`` (the commit point), with the
server's log slice in ``.../<host>/logs/<server>.log``. A failing server or cell is recorded and
the rest still run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ops.api.changes import StepFailed
from ops.api.context import Progress, StepContext
from ops.bench.matrix import Cell, Server
from ops.bench.progress import BenchProgress
from ops.bench.prompts import HF_PREFIX, parse_hf_spec, prompt_set_name, shipped_sets
from ops.bench.schema import BenchResult, Hardware, SchemaError
from ops.bench.store import write_result
from ops.layout import HostLayout
from ops.service.acceptance import probe
from ops.service.backends import Supervisor, stop_ours, wait
from ops.service.command import TEMPLATE_DEFAULTS, render_argv
from ops.service.facts import gather, parse_json_line, run_script
from ops.service.plan import plan_service
from ops.service.rollout import execute_plan
from ops.service.settings import serve_url, service_args
from ops.service.systems import SYSTEMS
from ops.service.thresholds import DEFAULTS as GATE_DEFAULTS
from ops.shell import join
from specops_files.store import LocalStore

if TYPE_CHECKING:
    from ops.connection import CommandResult, Connection


class ServerOutcome(NamedTuple):
    """What one server's turn measured, and what failed (each failure names the server or cell)."""

    measured: list[BenchResult]
    failures: list[str]


@dataclass
class Session:
    """What measuring on one host needs: the connection, the step's arguments and its context."""

    conn: Connection
    args: dict[str, Any]
    ctx: StepContext
    release: str
    hardware: dict[str, Any]
    matrix_dir: Path
    run_dir: Path
    reused: set[str] = field(default_factory=set)  # labels of servers found running, not started by us

    @property
    def host(self) -> str:
        return self.ctx.host.name

    @property
    def layout(self) -> HostLayout:
        return HostLayout(self.args["base"])

    @property
    def venv(self) -> str:
        return self.args["venv"] or self.layout.venv

    @property
    def progress(self) -> Progress:
        """The run's display (``ctx.progress``); ``ensure_progress`` gives one to a direct run."""
        assert self.ctx.progress is not None, "ensure_progress(ctx) before a session runs"
        return self.ctx.progress

    def service_args(self, server: Server) -> dict[str, Any]:
        """The service step's arguments for our server: in ``server``'s mode and budget when it is
        ours (on the deployed host and port, whichever system is deployed there), else as deployed
        (only its files and URL matter then: it is stopped)."""
        serve = dict(self.args["serve"])
        if server.system == "ddtree":
            if serve.get("system", "ddtree") != "ddtree":  # the deployed vLLM/SGLang's settings do not apply
                serve = {k: serve[k] for k in ("host", "port") if k in serve}
            serve.update(system="ddtree", mode=server.mode)
            if server.budget is not None:
                serve["budget"] = server.budget
        return service_args(
            base=self.args["base"],
            release=self.release,
            venv=self.venv,
            target=self.args["target"],
            drafter=self.args["drafter"],
            env_file=self.args["env_file"],
            serve=serve,
            backend=self.args["backend"],
            timeout=self.args["timeout"],
        )

    # -- servers
    def start(self, server: Server) -> tuple[str, str, int]:
        """Start ``server`` (and stop whatever else holds the GPU); returns (url, log path, log offset)."""
        ours = self.service_args(server)
        facts = gather(self.conn, ours)
        if server.system == "ddtree":
            self._stop_foreign()
            plan = plan_service(facts, ours, self.ctx, preflight=False)
            offset = facts["service"]["log_size"]
            if plan.will_change:
                try:
                    execute_plan(self.conn, plan)
                except StepFailed as exc:
                    raise StepFailed(
                        f"{server.label} did not answer: {exc}", command=exc.command, stderr=exc.stderr
                    ) from None
            return serve_url(ours["serve"]), self.layout.log(), offset
        context = self._foreign_context(server)
        url = f"http://127.0.0.1:{server.port}"
        self._stop_ours(facts)
        if self._running_already(server, url, context["served_name"]):
            self.reused.add(server.label)
            return url, "", 0
        self._stop_foreign()
        return self._start_foreign(server, facts, context, url)

    def _foreign_context(self, server: Server) -> dict[str, Any]:
        context = {
            **TEMPLATE_DEFAULTS,
            "venv": SYSTEMS[server.system].venv(self.args["base"]),
            "host": "127.0.0.1",
            "target": self.args["target"],
            "drafter": self.args["drafter"],
            "port": server.port,
            "mode": server.mode,
            "num_speculative_tokens": server.num_speculative_tokens,
            "block_size": server.block_size,
            **server.vars,
        }
        context["served_name"] = context["served_name"] or context["target"]
        return context

    def _running_already(self, server: Server, url: str, served: str) -> bool:
        """True when a server on ``url`` lists ``served``; something else answering there is an error."""
        answer = parse_json_line("the running-server probe")(
            self.conn.run(run_script("models", url), timeout=60)
        )
        if answer.get("models") is None and "error" not in answer:
            return False
        if served in (answer.get("models") or ()):
            self.progress.note(self.host, f"{server.label}: reusing the server already on port {server.port}")
            return True
        found = (
            f"lists {answer['models']}" if answer.get("models") is not None else f"answers {answer['error']}"
        )
        raise StepFailed(
            f"{server.label}: port {server.port} on {self.host} is taken: {url} {found}, not "
            f"{served!r} (fix: stop that server, set this entry's port, or vars.served_name)"
        )

    def _stop_ours(self, facts: dict[str, Any]) -> None:
        for stop in stop_ours(self.layout, facts["service"]):
            self._run(stop.command, "stop our server")

    def _foreign(self, system: str) -> Supervisor:
        return Supervisor(HostLayout(self.args["base"], f"specops-bench-{system}"))

    def _stop_foreign(self) -> None:
        for system in ("vllm", "sglang"):
            foreign = self._foreign(system)
            if (
                self.conn.stat(foreign.pidfile) is not None
                and self.conn.stat(self.layout.supervisor) is not None
            ):
                self._run(foreign.stop().command, f"stop {system}")

    def _start_foreign(
        self, server: Server, facts: dict[str, Any], context: dict[str, Any], url: str
    ) -> tuple[str, str, int]:
        foreign = self._foreign(server.system)
        argv = render_argv(server.template, context, self.ctx)
        if argv[0].startswith("/") and self.conn.stat(argv[0]) is None:
            raise StepFailed(
                f"{server.label}: {argv[0]} does not exist on the host (fix: list {server.system} in the "
                f"host's systems and run fab provision, set vars.venv on the matrix entry, or set "
                "enabled: false on it)"
            )
        for change in foreign.install(facts["service"]):
            change.apply(self.conn)
        info = self.conn.stat(foreign.log)
        offset = info.size if info else 0
        self._run(
            foreign.launch(self.args["base"], argv, self.args["env_file"]).command, f"start {server.label}"
        )
        try:
            wait(url, self.args["timeout"], "the", foreign.wait_on).apply(self.conn)
        except StepFailed as exc:
            raise StepFailed(
                f"{server.label} did not answer: {exc}",
                stderr=self._log_slice(foreign.log, offset).decode("utf-8", "replace")[-4000:],
            ) from None
        return url, foreign.log, offset

    def gate(self, server: Server, cell: Cell, url: str) -> None:
        """The acceptance gate of ``fab deploy`` on this server: tau from its own /metrics over a
        greedy probe of the cell's prompts (a dataset set, not on the controller: ``math``)."""
        prompts = cell.prompts
        if prompts.startswith(HF_PREFIX):
            prompts = "math"
        elif prompts not in shipped_sets() and not Path(prompts).is_absolute():
            prompts = str(self.matrix_dir / prompts)
        settings = {**GATE_DEFAULTS, "min_tau": server.min_tau, "spec": None, "prompts": prompts}
        extra = {"mode": server.mode} if server.system == "ddtree" else {}
        served = None if server.system == "ddtree" else self._foreign_context(server)["served_name"]
        remote = f"{self.layout.results}/{self.run_dir.name}/{server.label}.acceptance.json"
        self._run(join(["mkdir", "-p", "--", f"{self.layout.results}/{self.run_dir.name}"]), "results folder")
        gate = probe(url, served, server.system, {server.mode: extra}, settings, self.ctx, remote)
        try:
            record = gate.apply(self.conn)["acceptance"]
        except StepFailed as exc:
            if server.label not in self.reused:
                self.stop(server)
            raise StepFailed(f"{server.label}: {exc}") from None
        tau = record["modes"][server.mode]["tau"]
        self.progress.note(self.host, f"{server.label}: acceptance gate passed (tau {tau:g})")

    def stop(self, server: Server) -> None:
        if server.system == "ddtree":
            self._stop_ours(gather(self.conn, self.service_args(server)))
        else:
            self._stop_foreign()

    # -- cells
    def run_cell(self, server: Server, cell: Cell, url: str, log: tuple[str, int]) -> BenchResult:
        """Measure one cell on the host; its server log comes home first, so every complete cell
        (the result file is the commit point) has the log of its measurement beside it."""
        remote_dir = f"{self.layout.results}/{self.run_dir.name}"
        remote = f"{remote_dir}/{cell.cell_id}.json"
        self._run(join(["mkdir", "-p", "--", f"{remote_dir}/prompts"]), "results folder")
        prompts = self._prompts(cell.prompts, f"{remote_dir}/prompts")
        result = self.conn.run(
            join(self._client_argv(server, cell, url, prompts, remote)), timeout=self.args["cell_timeout"]
        )
        if not result.ok:
            raise StepFailed(
                f"cell {cell.cell_id}: the client exited {result.exit_code}",
                command=result.command,
                stderr=result.stderr or result.stdout,
            )
        measured = self._fetch_result(cell, remote)
        measured.host, measured.run_id, measured.cell_id = self.host, self.run_dir.name, cell.cell_id
        measured.prompt_set = prompt_set_name(cell.prompts)
        measured.hardware = Hardware(**self.hardware)
        self.fetch_log(server, *log)
        write_result(self.run_dir, measured)
        return measured

    def _client_argv(self, server: Server, cell: Cell, url: str, prompts: str, out: str) -> list[str]:
        argv = [
            "env",
            f"PYTHONPATH={self.layout.release_site(self.release)}",
            f"{self.venv}/bin/python",
            "-m",
            "ops.bench.client",
            "--url",
            url,
            "--prompts",
            prompts,
            "--num-prompts",
            str(cell.num_prompts),
            "--concurrency",
            str(cell.concurrency),
            "--output-len",
            str(cell.output_len),
            "--temperature",
            f"{cell.temperature:g}",
            "--warmup",
            str(cell.warmup),
            "--system",
            server.system,
            "--mode",
            server.mode,
            "--target",
            self.args["target"],
            "--cell-id",
            cell.cell_id,
            "--out",
            out,
        ]
        for flag, value in (
            ("--budget", server.budget),
            ("--block-size", server.block_size),
            ("--num-speculative-tokens", server.num_speculative_tokens),
        ):
            if value is not None:
                argv += [flag, str(value)]
        if server.mode != "ar":
            argv += ["--drafter", self.args["drafter"]]
        if server.system == "ddtree":  # our server: its API key, if any, is in its env file
            argv += ["--api-key-env-file", self.args["env_file"]]
        return argv

    def _fetch_result(self, cell: Cell, remote: str) -> BenchResult:
        host_dir = self.run_dir / self.host
        host_dir.mkdir(parents=True, exist_ok=True)
        fetched = host_dir / f".{cell.cell_id}.fetched.json"
        self.conn.get_file(remote, fetched)
        try:
            return BenchResult.from_dict(json.loads(fetched.read_text()))
        except (ValueError, SchemaError) as exc:
            raise StepFailed(f"cell {cell.cell_id}: {remote} is not a result: {exc}") from None
        finally:
            fetched.unlink(missing_ok=True)

    def _prompts(self, prompts: str, remote_dir: str) -> str:
        """A shipped set by name; a dataset fetched on the host; a user file (beside the matrix)
        uploaded next to the results."""
        if prompts in shipped_sets():
            return prompts
        if prompts.startswith(HF_PREFIX):
            return self._dataset_prompts(prompts)
        local = Path(prompts).expanduser()
        local = local if local.is_absolute() else self.matrix_dir / local
        if not local.is_file():
            raise StepFailed(
                f"prompt set {prompts!r}: no shipped set of that name and no file {local} "
                f"(fix: one of {', '.join(shipped_sets())}, or a JSONL path beside the matrix)"
            )
        remote = f"{remote_dir}/{local.name}"
        self.conn.write_bytes(remote, local.read_bytes(), 0o644)
        return remote

    def _dataset_prompts(self, prompts: str) -> str:
        """The dataset's prompt file on the host, fetched there unless present: the fetch renames a
        complete file into place, so one that exists is whole and is used as it is."""
        spec = parse_hf_spec(prompts)
        remote = f"{self.layout.prompts}/{spec.name}.jsonl"
        if self.conn.stat(remote) is not None:
            return remote
        self._run(join(["mkdir", "-p", "--", self.layout.prompts]), "prompts folder")
        result = self.conn.run(
            join(
                [
                    "env",
                    f"PYTHONPATH={self.layout.release_site(self.release)}",
                    f"{self.venv}/bin/python",
                    "-m",
                    "ops.bench.prompts",
                    spec.text,
                    remote,
                ]
            ),
            timeout=self.args["cell_timeout"],
        )
        if not result.ok:
            said = (result.stderr or result.stdout).strip().splitlines() or [f"exited {result.exit_code}"]
            raise StepFailed(
                f"host {self.host}: prompt set {prompts}: {said[-1]}",
                command=result.command,
                stderr=result.stderr,
            )
        return remote

    def fetch_log(self, server: Server, log: str, offset: int) -> None:
        data = self._log_slice(log, offset)
        logs = self.run_dir / self.host / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        LocalStore().write_bytes(str(logs / f"{server.label}.log"), data)

    def _log_slice(self, log: str, offset: int) -> bytes:
        if not log:  # a reused server: its log is not ours to read
            return b"reused a server that was already running; its log is wherever it writes it\n"
        info = self.conn.stat(log)
        if info is None:
            return b""
        return self.conn.read_bytes(log, offset if info.size >= offset else 0)

    def _run(self, command: str, what: str) -> CommandResult:
        result = self.conn.run(command, timeout=self.args["timeout"] + 60)
        if not result.ok:
            raise StepFailed(
                f"{what}: command exited {result.exit_code}",
                command=result.command,
                stderr=result.stderr or result.stdout,
            )
        return result

    # -- one server, all its cells
    def run_server(self, server: Server, cells: list[Cell]) -> ServerOutcome:
        """Start, measure every cell, bring the log home, stop (unless ``stay``); failures are recorded."""
        done: list[BenchResult] = []
        failures: list[str] = []
        self.progress.note(self.host, f"starting {server.label}")
        try:
            url, log, offset = self.start(server)
            if server.min_tau is not None:
                self.gate(server, cells[0] if cells else server.cells[0], url)
        except StepFailed as exc:
            failures.append(f"{exc}" + (f"\n{exc.stderr[-2000:]}" if exc.stderr else ""))  # names the server
            for cell in cells:
                self.progress.cell_started(self.host, cell.cell_id)
                self.progress.cell_finished(self.host, cell.cell_id, ok=False)
            return ServerOutcome(done, failures)
        try:
            for cell in cells:
                self.progress.cell_started(self.host, cell.cell_id)
                try:
                    done.append(self.run_cell(server, cell, url, (log, offset)))
                    self.progress.cell_finished(self.host, cell.cell_id)
                except StepFailed as exc:
                    failures.append(
                        f"{cell.cell_id}: {exc}" + (f"\n{exc.stderr[-2000:]}" if exc.stderr else "")
                    )
                    self.progress.cell_finished(self.host, cell.cell_id, ok=False)
        finally:
            if not server.stay and server.label not in self.reused:
                self.stop(server)
        return ServerOutcome(done, failures)


def ensure_progress(ctx: StepContext) -> Progress:
    """The run's progress display; a step applied outside ``fab bench``/``fab tune`` gets plain lines."""
    if ctx.progress is None:
        ctx.progress = BenchProgress(live=False)
    return ctx.progress
