"""Benchmark steps: ``bench`` (run a matrix), ``bench_tune`` (sweep and pick) and ``tuned_settings``.

``bench`` takes a host through a matrix file (``ops/bench/matrix.py``) one server at a time, because
one GPU holds one model: our DDTree server is switched between modes and budgets by re-rendering
its serve settings and restarting it through the deploy machinery (``ops/steps/service.py``: the
same launch fingerprint, supervisor or systemd unit, health wait); vLLM and SGLang start under the
built-in supervisor from a command-line template (``templates/bench-*.argv.j2``) after our server
is stopped, unless a server already answers on the entry's port listing the served model in
``/v1/models``: that one is reused as it is, and left running afterwards, since this run did not
start it. Each server is health-checked (``/health``, ``/v1/models``, one completion), then every
pending cell runs our client on the host (a ``hf:`` prompt set is first fetched there, once, into
``<base>/results/prompts/``) (``python -m ops.bench.client``), whose JSON comes home
over SFTP and is written atomically to ``results/<run-id>/<host>/<cell-id>.json``; the server's
log slice comes home to ``.../<host>/logs/<server>.log``. A server is stopped afterwards unless its
matrix entry says ``stay: true``.

The probe reads which cells of the run directory are complete, so a run killed midway and run
again with the same run directory (``fab bench --resume RUN_ID``) measures each cell exactly once;
with every cell done the step is ``ok`` with nothing to do. A cell or server that fails is
recorded and the others still run; the step then fails naming them.

``bench_tune`` sweeps the DDTree budget (plus vLLM DFlash ``num_speculative_tokens`` when asked)
against an ``ar`` baseline, stopping a sweep once the speedup has fallen ``patience`` times in a row
below its best by more than ``min_gain``; it writes the best budget to
``<base>/run/specops-ddtree.tuned.json``, which ``tuned_settings`` reads back so the service step
(``fab tune``, and ``fab deploy`` when its playbook includes it) serves the tuned settings.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drafter_config.store import LocalStore
from ops.bench.matrix import DEFAULT_TEMPLATES, Cell, Server, load_matrix
from ops.bench.progress import BenchProgress
from ops.bench.prompts import HF_PREFIX, parse_hf_spec, prompt_set_name, shipped_sets
from ops.bench.schema import BenchResult, Hardware, SchemaError, cell_id_for, slug
from ops.bench.store import completed_cells, write_result
from ops.shell import join
from ops.steps.base import Applied, Arg, Fact, Plan, Run, Step, StepFailed, arguments, register
from ops.steps.files import render_template
from ops.steps.release import layout_fact, release_dir
from ops.steps.service import (
    SERVICE,
    SUPERVISOR_SOURCE,
    WAIT_SCRIPT,
    Paths,
    backend_arg,
    execute_plan,
    gather,
    parse_json_line,
    plan_service,
    serve_arg,
    serve_url,
    systemctl,
)

if TYPE_CHECKING:
    from ops.connection import CommandResult, Connection
    from ops.steps.base import StepContext

TUNED_FILE = "specops-ddtree.tuned.json"
CELL_TIMEOUT_S = 3600.0
# On the host: the model ids a server on the URL lists; {"models": null} when nothing listens there.
_MODELS = r"""
import json, sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/v1/models", timeout=10) as r:
        out = {"models": [m["id"] for m in json.load(r)["data"]]}
except urllib.error.HTTPError as exc:
    out = {"error": "HTTP %d from /v1/models" % exc.code}
except urllib.error.URLError as exc:
    out = {"models": None} if isinstance(exc.reason, ConnectionRefusedError) else {"error": str(exc.reason)}
except (OSError, ValueError, KeyError, TypeError) as exc:
    out = {"error": "%s: %s" % (type(exc).__name__, exc)}
print(json.dumps(out))
"""


def progress_arg(value: Any) -> BenchProgress:
    if not isinstance(value, BenchProgress):
        raise ValueError(f"expected the run's BenchProgress (set by fab bench), got {value!r}")
    return value


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
    run_dir=Arg(str, required=True, help="controller results/<run-id> directory (set by fab bench/tune)"),
    progress=Arg(progress_arg, help="progress display (set by fab bench/tune)"),
)


# ---------------------------------------------------------------- facts
_HW = (
    "nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null; "
    "nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*'; echo '--'; "
    "{python} -c 'import importlib.metadata as m; print(m.version(\"torch\"))' 2>/dev/null; true"
)


def hardware_fact(python: str) -> Fact[dict[str, Any]]:
    """GPU name/compute capability/driver and the venv's torch version (empty on a CPU host)."""
    return Fact(_HW.format(python=join([python])), parse_hardware)


def parse_hardware(result: CommandResult) -> dict[str, Any]:
    """Pure parser of :func:`hardware_fact` (CUDA is the driver's, from the nvidia-smi banner)."""
    gpus_text, _, torch_text = result.stdout.partition("--")
    gpus = [[p.strip() for p in line.split(",")] for line in gpus_text.splitlines() if line.count(",") >= 2]
    first = gpus[0] if gpus else [None, None, None]
    cuda = [line.split(":", 1)[1].strip() for line in gpus_text.splitlines() if line.startswith("CUDA Version:")]
    return {"gpu_name": first[0], "gpu_count": len(gpus) or None, "compute_cap": first[1], "driver": first[2],
            "cuda": cuda[0] if cuda else None,
            "torch": torch_text.strip().splitlines()[-1] if torch_text.strip() else None}


# ---------------------------------------------------------------- one host's session
@dataclass(frozen=True)
class ServerRun(Run):
    """The change that starts one server, runs its pending cells and stops it."""

    server: Any = None
    cells: tuple[Cell, ...] = ()

    def describe(self) -> str:
        return f"bench: {self.server.label}: {len(self.cells)} cell(s) ({', '.join(c.cell_id for c in self.cells)})"


@dataclass
class Session:
    """What applying a bench plan on one host needs: the connection, the arguments and the outcome."""

    conn: Connection
    args: dict[str, Any]
    ctx: StepContext
    release: str
    hardware: dict[str, Any]
    matrix_dir: Path
    progress: BenchProgress
    failures: list[str] = field(default_factory=list)
    measured: list[BenchResult] = field(default_factory=list)
    reused: set[str] = field(default_factory=set)  # labels of servers found running, not started by us

    @property
    def host(self) -> str:
        return self.ctx.host.name

    @property
    def base(self) -> str:
        return self.args["base"]

    @property
    def venv(self) -> str:
        return self.args["venv"] or f"{self.base}/venv"

    @property
    def run_dir(self) -> Path:
        return Path(self.args["run_dir"])

    def service_args(self, server: Server) -> dict[str, Any]:
        serve = {**self.args["serve"], "mode": server.mode}
        if server.budget is not None:
            serve["budget"] = server.budget
        return {"base": self.base, "release": self.release, "venv": self.venv, "target": self.args["target"],
                "drafter": self.args["drafter"], "env_file": self.args["env_file"], "serve": serve,
                "name": SERVICE, "backend": self.args["backend"], "timeout": self.args["timeout"],
                "stop_timeout": 30.0, "prompt": "the"}

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
                    raise StepFailed(f"{server.label} did not answer: {exc}", command=exc.command,
                                     stderr=exc.stderr) from None
            return serve_url(ours["serve"]), Paths(self.base, SERVICE).log, offset
        context = self._foreign_context(server)
        url = f"http://127.0.0.1:{server.port}"
        self._stop_ours(facts)
        if self._running_already(server, url, context["served_name"]):
            self.reused.add(server.label)
            return url, "", 0
        self._stop_foreign()
        return self._start_foreign(server, facts, context, url)

    def _foreign_context(self, server: Server) -> dict[str, Any]:
        context = {"venv": self.venv, "target": self.args["target"], "drafter": self.args["drafter"],
                   "port": server.port, "mode": server.mode, "num_speculative_tokens": server.num_speculative_tokens,
                   "block_size": server.block_size, **server.vars}
        context.setdefault("served_name", context["target"])
        return context

    def _running_already(self, server: Server, url: str, served: str) -> bool:
        """True when a server on ``url`` lists ``served``; something else answering there is an error."""
        answer = parse_json_line("the running-server probe")(
            self.conn.run(join(["python3", "-c", _MODELS, url]), timeout=60))
        if answer.get("models") is None and "error" not in answer:
            return False
        if served in (answer.get("models") or ()):
            self.progress.note(self.host, f"{server.label}: reusing the server already on port {server.port}")
            return True
        found = f"lists {answer['models']}" if answer.get("models") is not None else f"answers {answer['error']}"
        raise StepFailed(f"{server.label}: port {server.port} on {self.host} is taken: {url} {found}, not "
                         f"{served!r} (fix: stop that server, set this entry's port, or vars.served_name)")

    def _stop_ours(self, facts: dict[str, Any]) -> None:
        svc = facts["service"]
        if svc["systemd"]["process"]:
            self._run(systemctl(svc["systemd"], "stop", f"{SERVICE}.service"), "stop our server (systemd)")
        if svc["supervisor_process"]:
            self._run(join(["python3", Paths(self.base, SERVICE).supervisor, "stop", "--pidfile",
                            Paths(self.base, SERVICE).pidfile]), "stop our server")

    def _stop_foreign(self) -> None:
        paths = Paths(self.base, SERVICE)
        for system in ("vllm", "sglang"):
            pidfile = Paths(self.base, f"specops-bench-{system}").pidfile
            if self.conn.stat(pidfile) is not None and self.conn.stat(paths.supervisor) is not None:
                self._run(join(["python3", paths.supervisor, "stop", "--pidfile", pidfile]), f"stop {system}")

    def _start_foreign(self, server: Server, facts: dict[str, Any], context: dict[str, Any],
                       url: str) -> tuple[str, str, int]:
        paths = Paths(self.base, f"specops-bench-{server.system}")
        argv = render_argv(server.template, context, self.ctx)
        if argv[0].startswith("/") and self.conn.stat(argv[0]) is None:
            raise StepFailed(f"{server.label}: {argv[0]} does not exist on the host (fix: install {server.system} "
                             f"into {self.venv}, or set enabled: false on its matrix entry)")
        source = SUPERVISOR_SOURCE.read_bytes()
        if facts["service"]["supervisor_sha"] != hashlib.sha256(source).hexdigest():
            self.conn.write_bytes(paths.supervisor, source, 0o755)
        info = self.conn.stat(paths.log)
        offset = info.size if info else 0
        self._run(join(["python3", paths.supervisor, "start", "--pidfile", paths.pidfile, "--log", paths.log,
                        "--cwd", self.base, "--env-file", self.args["env_file"], "--", *argv]), f"start {server.label}")
        wait = {"url": url, "timeout": self.args["timeout"], "prompt": "the", "max_tokens": 4,
                "pidfile": paths.pidfile}
        answer = parse_json_line("the health wait")(
            self.conn.run(join(["python3", "-c", WAIT_SCRIPT, json.dumps(wait)]), timeout=self.args["timeout"] + 60))
        if not answer["ready"]:
            raise StepFailed(f"{server.label} did not answer: {answer['error']}",
                             stderr=self._log_slice(paths.log, offset).decode("utf-8", "replace")[-4000:])
        return url, paths.log, offset

    def stop(self, server: Server) -> None:
        if server.system == "ddtree":
            self._stop_ours(gather(self.conn, self.service_args(server)))
        else:
            self._stop_foreign()

    # -- cells
    def run_cell(self, server: Server, cell: Cell, url: str, log: tuple[str, int]) -> BenchResult:
        """Measure one cell on the host; its server log comes home first, so every complete cell
        (the result file is the commit point) has the log of its measurement beside it."""
        run_id = self.run_dir.name
        remote_dir = f"{self.base}/results/{run_id}"
        remote = f"{remote_dir}/{cell.cell_id}.json"
        self._run(join(["mkdir", "-p", "--", f"{remote_dir}/prompts"]), "results folder")
        prompts = self._prompts(cell.prompts, f"{remote_dir}/prompts")
        argv = ["env", f"PYTHONPATH={release_dir(self.base, self.release)}/site", f"{self.venv}/bin/python", "-m",
                "ops.bench.client", "--url", url, "--prompts", prompts, "--num-prompts", str(cell.num_prompts),
                "--concurrency", str(cell.concurrency), "--output-len", str(cell.output_len),
                "--temperature", f"{cell.temperature:g}", "--warmup", str(cell.warmup), "--system", server.system,
                "--mode", server.mode, "--target", self.args["target"], "--cell-id", cell.cell_id, "--out", remote]
        for flag, value in (("--budget", server.budget), ("--block-size", server.block_size),
                            ("--num-speculative-tokens", server.num_speculative_tokens)):
            if value is not None:
                argv += [flag, str(value)]
        if server.mode != "ar":
            argv += ["--drafter", self.args["drafter"]]
        result = self.conn.run(join(argv), timeout=self.args["cell_timeout"])
        if not result.ok:
            raise StepFailed(f"cell {cell.cell_id}: the client exited {result.exit_code}", command=result.command,
                             stderr=result.stderr or result.stdout)
        host_dir = self.run_dir / self.host
        host_dir.mkdir(parents=True, exist_ok=True)
        fetched = host_dir / f".{cell.cell_id}.fetched.json"
        self.conn.get_file(remote, fetched)
        try:
            measured = BenchResult.from_dict(json.loads(fetched.read_text()))
        except (ValueError, SchemaError) as exc:
            raise StepFailed(f"cell {cell.cell_id}: {remote} is not a result: {exc}") from None
        finally:
            fetched.unlink(missing_ok=True)
        measured.host, measured.run_id, measured.cell_id = self.host, run_id, cell.cell_id
        measured.prompt_set = prompt_set_name(cell.prompts)
        measured.hardware = Hardware(**self.hardware)
        self.fetch_log(server, *log)
        write_result(self.run_dir, measured)
        return measured

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
            raise StepFailed(f"prompt set {prompts!r}: no shipped set of that name and no file {local} "
                             f"(fix: one of {', '.join(shipped_sets())}, or a JSONL path beside the matrix)")
        remote = f"{remote_dir}/{local.name}"
        self.conn.write_bytes(remote, local.read_bytes(), 0o644)
        return remote

    def _dataset_prompts(self, prompts: str) -> str:
        """The dataset's prompt file on the host, fetched there unless present: the fetch renames a
        complete file into place, so one that exists is whole and is used as it is."""
        spec = parse_hf_spec(prompts)
        remote_dir = f"{self.base}/results/prompts"
        remote = f"{remote_dir}/{spec.name}.jsonl"
        if self.conn.stat(remote) is not None:
            return remote
        self._run(join(["mkdir", "-p", "--", remote_dir]), "prompts folder")
        result = self.conn.run(join(["env", f"PYTHONPATH={release_dir(self.base, self.release)}/site",
                                     f"{self.venv}/bin/python", "-m", "ops.bench.prompts", spec.text, remote]),
                               timeout=self.args["cell_timeout"])
        if not result.ok:
            said = (result.stderr or result.stdout).strip().splitlines() or [f"exited {result.exit_code}"]
            raise StepFailed(f"host {self.host}: prompt set {prompts}: {said[-1]}", command=result.command,
                             stderr=result.stderr)
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
            raise StepFailed(f"{what}: command exited {result.exit_code}", command=result.command,
                             stderr=result.stderr or result.stdout)
        return result

    # -- one server, all its cells
    def run_server(self, server: Server, cells: list[Cell]) -> list[BenchResult]:
        """Start, measure every cell, bring the log home, stop (unless ``stay``); failures are recorded."""
        done: list[BenchResult] = []
        self.progress.note(self.host, f"starting {server.label}")
        try:
            url, log, offset = self.start(server)
        except StepFailed as exc:
            self.failures.append(f"{exc}" + (f"\n{exc.stderr[-2000:]}" if exc.stderr else ""))  # names the server
            for cell in cells:
                self.progress.cell_started(self.host, cell.cell_id)
                self.progress.cell_finished(self.host, cell.cell_id, ok=False)
            return done
        try:
            for cell in cells:
                self.progress.cell_started(self.host, cell.cell_id)
                try:
                    done.append(self.run_cell(server, cell, url, (log, offset)))
                    self.progress.cell_finished(self.host, cell.cell_id)
                except StepFailed as exc:
                    self.failures.append(f"{cell.cell_id}: {exc}" + (f"\n{exc.stderr[-2000:]}" if exc.stderr else ""))
                    self.progress.cell_finished(self.host, cell.cell_id, ok=False)
        finally:
            if not server.stay and server.label not in self.reused:
                self.stop(server)
        self.measured += done
        return done


def render_argv(template: str, context: dict[str, Any], ctx: StepContext) -> list[str]:
    """A ``*.argv.j2`` template rendered to an argument vector: one argument per non-blank line."""
    text = render_template(template, context, ctx).decode("utf-8")
    argv = [line.strip() for line in text.splitlines() if line.strip()]
    if not argv:
        raise StepFailed(f"template {template} rendered no command line")
    return argv


def _session(conn: Connection, plan: Plan, args: dict[str, Any], ctx: StepContext) -> Session:
    return Session(conn=conn, args=args, ctx=ctx, release=plan.data["release"], hardware=plan.data["hardware"],
                   matrix_dir=Path(plan.data.get("matrix_dir") or ctx.playbook_dir),
                   progress=args["progress"] or BenchProgress(live=False))


def _host_facts(conn: Connection, args: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    layout = layout_fact(args["base"]).gather(conn)
    hardware = hardware_fact(f"{args['venv'] or args['base'] + '/venv'}/bin/python").gather(conn)
    return {"release": layout["current"], "hardware": hardware,
            "done": sorted(completed_cells(args["run_dir"], ctx.host.name))}


def _need_release(facts: dict[str, Any], args: dict[str, Any]) -> str:
    if facts["release"] is None:
        raise StepFailed(f"no release is deployed under {args['base']} (fix: run fab deploy first)")
    return facts["release"]


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
        done = set(facts["done"])
        changes = [ServerRun(f"bench {s.label}", server=s, cells=tuple(c for c in s.cells if c.cell_id not in done))
                   for s in matrix.servers if any(c.cell_id not in done for c in s.cells)]
        total = len(matrix.cells)
        data = {"release": facts["release"], "hardware": facts["hardware"], "matrix_dir": str(matrix.path.parent),
                "total": total, "done_before": total - sum(len(c.cells) for c in changes),
                "run_dir": args["run_dir"]}
        if not changes:
            return Plan.noop(f"all {total} cells of {matrix.path.name} are complete in {args['run_dir']}", **data)
        _need_release(facts, args)
        pending = sum(len(c.cells) for c in changes)
        return Plan.of(changes, f"run {pending} of {total} cells on {len(changes)} server(s)", **data, args=args)

    def apply(self, conn, plan, ctx):
        session = _session(conn, plan, plan.data["args"], ctx)
        session.progress.start(session.host, plan.data["total"], plan.data["done_before"])
        for change in plan.changes:
            session.run_server(change.server, list(change.cells))
        ran = len(session.measured)
        if session.failures:
            raise StepFailed(f"{len(session.failures)} failure(s), {ran} cell(s) measured (fix, then resume: "
                             f"fab bench --resume {session.run_dir.name}): "
                             + "; ".join(f.splitlines()[0] for f in session.failures),
                             stderr="\n".join(session.failures))
        return Applied(True, f"measured {ran} cell(s); {plan.data['done_before']} were done before; results in "
                       f"{session.run_dir / session.host}",
                       {"run_dir": str(session.run_dir), "measured": ran, "release": session.release})


# ---------------------------------------------------------------- tune
def peaked(speedups: list[float], patience: int, min_gain: float) -> bool:
    """Pure: the last ``patience`` points all sit below the best earlier one by more than ``min_gain``."""
    if len(speedups) <= patience:
        return False
    best = max(speedups[:-patience])
    return all(s < best * (1 - min_gain) for s in speedups[-patience:])


@register
class BenchTune(Step):
    name = "bench_tune"
    summary = "sweep the DDTree budget against ar, pick the best tokens/s, write it to <base>/run/" + TUNED_FILE
    args = arguments(
        budgets=Arg(int_list, default=[8, 16, 32, 64, 128, 256, 512], help="DDTree budgets, ascending"),
        vllm_dflash_tokens=Arg(int_list, default=[], help="also sweep vLLM DFlash num_speculative_tokens"),
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
        what = f"ar, then ddtree budgets {', '.join(map(str, args['budgets']))}"
        if args["vllm_dflash_tokens"]:
            what += f", vLLM DFlash k {', '.join(map(str, args['vllm_dflash_tokens']))}"
        return Plan.of([Run(f"sweep {what}", why="measure")], f"tune on release {release}: {what}",
                       release=release, hardware=facts["hardware"], args=args)

    def apply(self, conn, plan, ctx):
        args = plan.data["args"]
        session = _session(conn, plan, args, ctx)
        cell = Cell(cell_id="", prompts=args["prompts"], temperature=args["temperature"], concurrency=1,
                    output_len=args["output_len"], num_prompts=args["num_prompts"], warmup=args["warmup"])
        sweeps = [[_tune_server("ddtree", "ar", cell)]
                  + [_tune_server("ddtree", "ddtree", cell, budget=b) for b in args["budgets"]]]
        if args["vllm_dflash_tokens"]:
            sweeps.append([_tune_server("vllm", "ar", cell, port=8100)]
                          + [_tune_server("vllm", "dflash", cell, port=8100, num_speculative_tokens=k)
                             for k in args["vllm_dflash_tokens"]])
        session.progress.start(session.host, sum(len(s) for s in sweeps), 0)
        rows: list[dict[str, Any]] = []
        for sweep in sweeps:
            base_tps = None
            speedups: list[float] = []
            for server in sweep:
                results = session.run_server(server, list(server.cells))
                if not results:
                    continue
                r = results[0]
                if server.mode == "ar":
                    base_tps = r.output_throughput
                    continue
                speedup = r.output_throughput / base_tps if base_tps and r.output_throughput else 0.0
                speedups.append(speedup)
                rows.append({"system": r.system, "mode": r.mode, "budget": r.budget,
                             "num_speculative_tokens": r.num_speculative_tokens, "tokens_per_s": r.output_throughput,
                             "tau": r.tau, "speedup": speedup, "baseline_tokens_per_s": base_tps})
                if peaked(speedups, args["patience"], args["min_gain"]):
                    session.progress.note(session.host, f"speedup peaked; stopping the {server.system} sweep")
                    break
        ours = [r for r in rows if r["system"] == "ddtree" and r["tokens_per_s"]]
        if not ours:
            raise StepFailed("no DDTree budget was measured: " + "; ".join(f.splitlines()[0] for f in session.failures),
                             stderr="\n".join(session.failures))
        best = max(ours, key=lambda r: r["tokens_per_s"])
        chosen = {"mode": "ddtree", "budget": best["budget"]}
        record = {"serve": chosen, "tokens_per_s": best["tokens_per_s"], "speedup": best["speedup"],
                  "run_id": session.run_dir.name, "tuned_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "sweep": rows}
        path = f"{args['base']}/run/{TUNED_FILE}"
        conn.write_bytes(path, (json.dumps(record, indent=1) + "\n").encode(), 0o644)
        note = f"; {len(session.failures)} point(s) failed" if session.failures else ""
        return Applied(True, f"best budget {best['budget']}: {best['tokens_per_s']:.1f} tok/s, "
                       f"{best['speedup']:.2f}x over ar; written to {path}{note}",
                       {"serve": chosen, "release": plan.data["release"], "sweep": rows,
                        "run_dir": str(session.run_dir), "best": best})


def _tune_server(system: str, mode: str, cell: Cell, **settings: Any) -> Server:
    server = Server(label="", system=system, mode=mode, template=DEFAULT_TEMPLATES.get(system), **settings)
    probe = BenchResult(system=system, mode=mode, budget=server.budget,
                        num_speculative_tokens=server.num_speculative_tokens, prompt_set=prompt_set_name(cell.prompts),
                        temperature=cell.temperature, concurrency=1, output_len=cell.output_len)
    server.label = slug(f"tune-{system}-{mode}" + (f"-b{server.budget}" if server.budget else "")
                        + (f"-k{server.num_speculative_tokens}" if server.num_speculative_tokens else ""))
    server.cells = [replace(cell, cell_id="tune-" + cell_id_for(probe))]
    return server


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
        raise StepFailed(f"{TUNED_FILE} on the host is damaged ({exc}); fix: run fab tune again, or delete it") from None
    return {**record, "serve": serve}


@register
class TunedSettings(Step):
    name = "tuned_settings"
    summary = "read the serve settings fab tune chose (register it; {} when never tuned)"
    args = arguments(base=Arg(str, required=True, help="the host's base directory"))

    def probe(self, conn, args, ctx):
        return tuned_fact(f"{args['base']}/run/{TUNED_FILE}").gather(conn)

    def plan(self, facts, args, ctx):
        if not facts:
            return Plan.noop("never tuned: the inventory's serve settings apply", serve={})
        return Plan.noop(f"tuned {facts.get('tuned_at', '?')}: {facts['serve']}", serve=facts["serve"],
                         tuned_at=facts.get("tuned_at"))
