"""The ``demo_checkpoints`` step: the tiny target/drafter pair, written on the host.

``fab deploy`` against a host with no ``target``/``drafter`` (the local demo host) serves the tiny
pair of ``ddtree_runtime.tiny``: a real Qwen3 target and a DFlash drafter fitted to it, small
enough to load and answer on a CPU in seconds. It is generated on the host by the release's own
code (no download), and ``DONE``, written last by the generator, is the completeness probe: an
interrupted generation is simply run again.

With ``source`` (a controller folder holding ``target/`` and ``drafter/``, e.g. the committed
``demo_pair/``: a stdlib-trained LM and its trained drafter, on which speculation pays on a CPU),
those files are uploaded instead, and ``DONE`` holds their checksum, so a changed pair is
uploaded again and an unchanged one is left alone.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ops.api.args import Arg, arguments
from ops.api.changes import Fact, Plan, Run, StepFailed, Write
from ops.api.context import StepContext
from ops.shell import join, quote
from ops.steps.base import Step, register

_WRITE = "import sys; from ddtree_runtime.tiny import write_tiny_pair; write_tiny_pair(sys.argv[1])"


@register
class DemoCheckpoints(Step):
    name = "demo_checkpoints"
    summary = "the tiny demo target/drafter pair under dir/{target,drafter}, generated on the host"
    args = arguments(
        dir=Arg(str, required=True, help="folder on the host; target/ and drafter/ go inside"),
        python=Arg(str, required=True, help="host python with torch (the venv's)"),
        site=Arg(str, required=True, help="release site folder that provides ddtree_runtime"),
        timeout=Arg(float, default=600.0, help="seconds for the generation (fitting the drafter)"),
        source=Arg(
            str,
            help="controller folder with target/ and drafter/ to upload instead (relative: to "
            "the playbook's folder)",
        ),
    )

    def probe(self, conn, args, ctx):
        done = Fact(
            f"cat {quote(args['dir'] + '/DONE')} 2>/dev/null || true", lambda r: r.stdout.strip() or None
        )
        marker = done.gather(conn)
        return {"done": marker is not None, "marker": marker}

    def plan(self, facts, args, ctx):
        pair = {"target": f"{args['dir']}/target", "drafter": f"{args['dir']}/drafter"}
        if args["source"]:
            return _upload_plan(facts, args, ctx, pair)
        if facts["done"]:
            return Plan.noop(f"demo pair complete in {args['dir']}", **pair)
        command = join(["env", f"PYTHONPATH={args['site']}", args["python"], "-c", _WRITE, args["dir"]])
        return Plan.of(
            [Run(command, timeout=args["timeout"], why="no DONE marker")],
            f"generate the demo pair in {args['dir']}",
            **pair,
        )


def _source_files(source: Path) -> list[Path]:
    files = sorted(p for sub in ("target", "drafter") for p in (source / sub).rglob("*") if p.is_file())
    if not files:
        raise StepFailed(
            f"{source}: no target/ or drafter/ files (fix: run demo_pair/build.py, or drop 'source')"
        )
    return files


def _upload_plan(facts: dict, args: dict, ctx: StepContext, pair: dict[str, str]) -> Plan:
    source = Path(args["source"])
    source = source if source.is_absolute() else (ctx.playbook_dir / source).resolve()
    files = _source_files(source)
    digest = hashlib.sha256()
    for f in files:
        digest.update(
            f"{f.relative_to(source).as_posix()}\0".encode() + hashlib.sha256(f.read_bytes()).digest()
        )
    marker = f"source {digest.hexdigest()}"
    if facts.get("marker") == marker:
        return Plan.noop(f"demo pair from {source.name}/ is in place in {args['dir']}", **pair)
    dirs = sorted({f"{args['dir']}/{f.parent.relative_to(source).as_posix()}" for f in files})
    changes: list[Run | Write] = [Run(join(["mkdir", "-p", *dirs]), why="checkpoint folders")]
    changes += [
        Write(f"{args['dir']}/{f.relative_to(source).as_posix()}", f.read_bytes(), "0644") for f in files
    ]
    changes.append(Write(f"{args['dir']}/DONE", (marker + "\n").encode(), "0644", why="written last"))
    return Plan.of(changes, f"upload the demo pair from {source} ({len(files)} files)", **pair)
