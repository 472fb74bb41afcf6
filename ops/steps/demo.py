"""The ``demo_checkpoints`` step: the tiny target/drafter pair, written on the host.

``fab deploy`` against a host with no ``target``/``drafter`` (the local demo host) serves the tiny
pair of ``ddtree_runtime.tiny``: a real Qwen3 target and a DFlash drafter fitted to it, small
enough to load and answer on a CPU in seconds. It is generated on the host by the release's own
code (no download), and ``DONE``, written last by the generator, is the completeness probe: an
interrupted generation is simply run again.
"""

from __future__ import annotations

from ops.shell import join
from ops.steps.base import Arg, Plan, Run, Step, arguments, register
from ops.steps.command import exists_fact

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
    )

    def probe(self, conn, args, ctx):
        return {"done": exists_fact(f"{args['dir']}/DONE").gather(conn)}

    def plan(self, facts, args, ctx):
        pair = {"target": f"{args['dir']}/target", "drafter": f"{args['dir']}/drafter"}
        if facts["done"]:
            return Plan.noop(f"demo pair complete in {args['dir']}", **pair)
        command = join(["env", f"PYTHONPATH={args['site']}", args["python"], "-c", _WRITE, args["dir"]])
        return Plan.of(
            [Run(command, timeout=args["timeout"], why="no DONE marker")],
            f"generate the demo pair in {args['dir']}",
            **pair,
        )
