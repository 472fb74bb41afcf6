"""The ``train_drafter`` step: run `python -m ddtree_runtime.train` on the host, with progress home.

The pipeline on the host is resumable stage by stage (curation, regeneration, extraction, training,
lint, evaluation), so this step only has to decide whether to run it and to watch it:

- probe: the run directory's ``request.json`` (what was asked last time), ``summary.json``
  (written last, when everything passed) and whether a run is alive (``train.pid``);
- plan: nothing when the same request already has a summary; else (re)start it, or re-attach to a
  run that is still going (a controller that was interrupted does not start a second one);
- apply: the run is detached from the SSH session (``setsid nohup``); the step polls its log,
  forwards new lines as progress and copies the log home, and on success brings the summary,
  evaluation, lint report, data manifest and the drafter itself to ``results/<run-id>/<host>/``.

One job over several hosts (``nodes``, the inventory's ``train_nodes``: the first is the rank-0
host): every host runs the step at once and starts torchrun with the c10d rendezvous at ``rdzv``
(the rank-0 host's address and a free port, as the others reach it), which the rank-0 host serves.
That host is the job's leader: it keeps the checkpoints and the drafter, and its results come home;
the others bring home their log and summary. A host that drops ends the job (its peers' collectives
fail; ``max_restarts`` lets torchrun restart workers that crash on a live host); rerunning the task
starts every host again and the job resumes from the leader's last checkpoint.
"""

from __future__ import annotations

import json
import posixpath
import time
from pathlib import Path
from typing import Any

from ops.api.args import Arg, arguments, str_list
from ops.api.changes import Applied, Fact, Plan, Run, StepFailed, Write
from ops.api.context import StepContext
from ops.shell import join, quote
from ops.steps.base import Step, register
from ops.steps.command import tail
from specops_files.store import LocalStore

HOME_FILES = (
    "summary.json",
    "eval.json",
    "lint.json",
    "cost.json",
    "train_log.jsonl",
    "data/manifest.json",
    "drafter/config.json",
    "drafter/model.safetensors",
)
WORKER_HOME_FILES = ("summary.json",)


def options_arg(value: Any) -> dict[str, Any]:
    """Extra `python -m ddtree_runtime.train` flags as a mapping: {steps: 2000, block-size: 16}."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of flag: value, got {value!r}")
    for key, v in value.items():
        if not isinstance(key, str) or not key.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"option name {key!r} is not a flag name like 'block-size'")
        if not isinstance(v, (str, int, float, bool, list)):
            raise ValueError(f"option {key}: expected a scalar or a list, got {v!r}")
    return dict(value)


def is_leader(args: dict[str, Any], host: str) -> bool:
    """The host that keeps the job's state: the first of ``nodes``, or the only host."""
    return not args["nodes"] or args["nodes"][0] == host


def train_argv(args: dict[str, Any], host: str) -> list[str]:
    """The command line on the host: torchrun when more than one process is asked for, with the
    c10d rendezvous when the job spans several hosts."""
    launcher, nodes = [args["python"], "-m"], args["nodes"]
    if len(nodes) > 1:
        launcher += [
            "torch.distributed.run",
            "--nnodes", str(len(nodes)),
            "--nproc-per-node", str(args["nproc"]),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", args["rdzv"],
            "--rdzv-id", "specops-" + posixpath.basename(args["out"].rstrip("/")),
            "--rdzv-conf", f"is_host={'true' if is_leader(args, host) else 'false'}",
            "--max-restarts", str(args["max_restarts"]),
            "-m",
        ]  # fmt: skip
    elif args["nproc"] > 1:
        launcher += ["torch.distributed.run", "--standalone", "--nproc_per_node", str(args["nproc"]), "-m"]
    argv = [*launcher, "ddtree_runtime.train", "--target", args["target"], "--out", args["out"]]
    for p in args["prompts"]:
        argv += ["--prompts", p]
    if len(nodes) > 1 and is_leader(args, host):
        argv.append("--leader")
    for key, value in args["options"].items():
        flag = "--" + key.replace("_", "-")
        for v in value if isinstance(value, list) else [value]:
            if v is True:
                argv.append(flag)
            elif v is False:
                argv.append("--no-" + flag[2:])
            else:
                argv += [flag, str(v)]
    return argv


def request_of(args: dict[str, Any], host: str) -> dict[str, Any]:
    return {"argv": train_argv(args, host), "site": args["site"]}


def check_job(args: dict[str, Any], host: str) -> None:
    """A multi-host job names this host and says where its rendezvous is."""
    nodes = args["nodes"]
    if nodes and host not in nodes:
        raise StepFailed(
            f"host {host} runs train-drafter but train_nodes [{', '.join(nodes)}] does not name it "
            "(fix: add it to train_nodes, or set train_nodes only on the job's group)"
        )
    if len(nodes) > 1 and ":" not in args["rdzv"]:
        raise StepFailed(
            f"train_nodes [{', '.join(nodes)}] is one job over {len(nodes)} hosts but train_rdzv is "
            f"{args['rdzv'] or 'not set'} (fix: train_rdzv: ADDRESS:PORT of {nodes[0]} as the other "
            "hosts reach it, with a free port)"
        )


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None


def alive_test(out: str) -> str:
    """A shell test that holds while the run in `out` lives: no exit code yet, and the pid in
    train.pid runs a command naming the run directory. `kill -0` alone is fooled by a zombie the
    init process has not reaped yet and by a pid the kernel has given to another process."""
    q = quote(out)
    return (
        f"[ ! -e {q}/exit_code ] && p=$(cat {q}/train.pid 2>/dev/null) && "
        f'grep -qF -- {q} "/proc/$p/cmdline" 2>/dev/null'
    )


def run_state_fact(out: str) -> Fact[dict[str, Any]]:
    """request.json, summary.json and whether the run is alive, in one round trip."""
    q = quote(out)
    command = (
        f"cat {q}/request.json 2>/dev/null; echo; echo '--specops--'; cat {q}/summary.json 2>/dev/null; echo; "
        f"echo '--specops--'; {alive_test(out)} && echo alive"
    )
    return Fact(command, lambda r: parse_run_state(r.stdout))


def parse_run_state(stdout: str) -> dict[str, Any]:
    parts = stdout.split("--specops--\n")
    parts += [""] * (3 - len(parts))
    return {
        "request": _json_or_none(parts[0]),
        "summary": _json_or_none(parts[1]),
        "alive": parts[2].strip() == "alive",
    }


@register
class TrainDrafter(Step):
    name = "train_drafter"
    summary = "train a DFlash drafter on the host (resumable), bringing progress and results home"
    args = arguments(
        python=Arg(str, required=True, help="host python with torch and the runtime's dependencies"),
        site=Arg(str, required=True, help="folder that provides ddtree_runtime on the host"),
        target=Arg(str, required=True, help="target checkpoint directory on the host"),
        prompts=Arg(str_list, required=True, help="prompt files on the host, or HF dataset names"),
        out=Arg(str, required=True, help="run directory on the host"),
        options=Arg(options_arg, default={}, help="more flags for python -m ddtree_runtime.train"),
        nproc=Arg(int, default=1, help="processes (GPUs) per host for torchrun"),
        nodes=Arg(str_list, default=[], help="the job's hosts when it spans several; the first is rank 0"),
        rdzv=Arg(str, default="", help="ADDRESS:PORT of the c10d rendezvous on the first of nodes"),
        max_restarts=Arg(int, default=0, help="torchrun's restarts of a failed worker group"),
        timeout=Arg(float, default=7 * 24 * 3600.0, help="seconds before the step gives up waiting"),
        poll=Arg(float, default=5.0, help="seconds between log polls"),
    )

    def probe(self, conn, args, ctx):
        return run_state_fact(args["out"]).gather(conn)

    def plan(self, facts, args, ctx):
        check_job(args, ctx.host.name)
        request = request_of(args, ctx.host.name)
        drafter = posixpath.join(args["out"], "drafter")
        if facts["request"] == request and facts["summary"]:
            tau = (facts["summary"].get("eval") or {}).get("tau")
            return Plan.noop(
                f"drafter trained and evaluated in {args['out']} (tau {tau})",
                drafter=drafter,
                summary=facts["summary"],
            )
        if facts["alive"] and facts["request"] == request:
            return Plan.of(
                [Run("true", why="a run is still going: attach to it")], "attach", drafter=drafter, args=args
            )
        if facts["alive"]:
            raise StepFailed(
                f"{args['out']}: another training run is still going with other settings "
                "(fix: wait for it, stop it (train.pid), or pick another out directory)"
            )
        body = json.dumps(request, indent=2).encode() + b"\n"
        out = quote(args["out"])
        script = (
            f"cd {out} && env PYTHONPATH={quote(args['site'])} OMP_NUM_THREADS=${{OMP_NUM_THREADS:-1}} "
            f"{join(request['argv'])} >> train.log 2>&1; echo $? > exit_code"
        )
        # the pid is written before the command returns, so the first poll can tell a live run
        start = (
            f"mkdir -p {out} && rm -f {out}/exit_code && "
            f"{{ setsid nohup sh -c {quote(script)} > /dev/null 2>&1 < /dev/null & echo $! > {out}/train.pid; }}"
        )
        why = "resume the run" if facts["request"] == request else "new training request"
        return Plan.of(
            [Write(posixpath.join(args["out"], "request.json"), body, why=why), Run(start, why=why)],
            why,
            drafter=drafter,
            args=args,
        )

    def apply(self, conn, plan, ctx):
        args = plan.data["args"]
        for change in plan.changes:
            if isinstance(change, Write):
                conn.run(f"mkdir -p {quote(posixpath.dirname(change.path))}")
                conn.write_bytes(change.path, change.data)
            elif change.command != "true":
                result = conn.run(change.command)
                if not result.ok:
                    raise StepFailed(
                        f"cannot start the training run: exited {result.exit_code}",
                        command=result.command,
                        stderr=result.stderr,
                    )
        home = ctx.run_dir / ctx.host.name if ctx.run_dir is not None else None
        exit_code, log = self._watch(conn, args, ctx, home)
        if exit_code != 0:
            raise StepFailed(
                f"training run exited {exit_code} (the log is {args['out']}/train.log; rerun to resume)",
                stderr=tail(log, 30),
            )
        leader = is_leader(args, ctx.host.name)
        if args["options"].get("estimate"):  # the cost and nothing else
            cost = json.loads(conn.read_bytes(posixpath.join(args["out"], "cost.json"))) if leader else {}
            if home is not None and leader:
                LocalStore().write_bytes(
                    str(home / "cost.json"), (json.dumps(cost, indent=2) + "\n").encode()
                )
            hours = ", ".join(f"{k} {v:.2f} h" for k, v in cost.get("hours", {}).items())
            return Applied(True, f"estimate only: {hours or 'see the rank-0 host'}", {"cost": cost})
        summary = json.loads(conn.read_bytes(posixpath.join(args["out"], "summary.json")))
        if home is not None:
            store = LocalStore()
            for rel in HOME_FILES if leader else WORKER_HOME_FILES:
                path = posixpath.join(args["out"], rel)
                if conn.stat(path) is None:  # no curve when training was done already
                    continue
                (home / rel).parent.mkdir(parents=True, exist_ok=True)
                store.write_bytes(str(home / rel), conn.read_bytes(path))
        tau = (summary.get("eval") or {}).get("tau")
        data = {"drafter": plan.data["drafter"], "summary": summary}
        where = plan.data["drafter"] if leader else f"{args['nodes'][0]}:{plan.data['drafter']}"
        return Applied(True, f"drafter in {where} (tau {tau})", data)

    @staticmethod
    def _alive(conn, out: str) -> bool:
        """Whether the run in `out` lives, a dead verdict confirmed a second later: on a loaded
        2-core machine a first poll once found neither the exit code nor the live pid of a run
        that went on for another 12 s, and the step gave it up."""
        if conn.run(alive_test(out)).ok:
            return True
        time.sleep(1.0)
        return conn.run(alive_test(out)).ok

    def _watch(self, conn, args: dict[str, Any], ctx: StepContext, home: Path | None) -> tuple[int, str]:
        """Poll the log until exit_code appears; new lines go to the progress display and home."""
        log_path, code_path = (
            posixpath.join(args["out"], "train.log"),
            posixpath.join(args["out"], "exit_code"),
        )
        deadline, offset, text, delay = time.monotonic() + args["timeout"], 0, "", 0.25
        while True:
            done = conn.stat(code_path) is not None
            if not done and not self._alive(conn, args["out"]):
                done = conn.stat(code_path) is not None  # it may have ended between the two looks
                if not done:
                    raise StepFailed(
                        "the training run stopped without an exit code (killed, or the host went down; "
                        f"rerun to resume from the last checkpoint; the log is {log_path})",
                        stderr=tail(text, 30),
                    )
            info = conn.stat(log_path)
            if info is not None and info.size > offset:
                raw_chunk = conn.read_bytes(log_path, offset)
                offset += len(raw_chunk)
                chunk = raw_chunk.decode("utf-8", errors="replace")
                text += chunk
                if ctx.progress is not None:
                    for line in chunk.splitlines()[-3:]:
                        ctx.progress.note(ctx.host.name, line.strip())
                if home is not None:
                    home.mkdir(parents=True, exist_ok=True)
                    with (home / "train.log").open("a", encoding="utf-8") as fh:
                        fh.write(chunk)
            if done:
                raw = conn.read_bytes(code_path).decode().strip()
                return (int(raw) if raw.lstrip("-").isdigit() else 1), text
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"training still running after {args['timeout']:.0f} s (it goes on on the host; "
                    "rerun fab train-drafter to attach)",
                    stderr=tail(text, 30),
                )
            time.sleep(delay)
            delay = min(args["poll"], 2 * delay)  # short runs end soon after they finish
