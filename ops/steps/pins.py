"""The ``pinned_packages`` step: install the profile's pin set from ``playbooks/pins.yaml``.

Unlike ``pip_install`` (plain ``name==version`` lists), this knows the profile's CUDA build and its
package index, accepts git refs (a vLLM pull-request branch), and compares the installed git ref
from ``direct_url.json``, so a re-run installs nothing and a changed pin installs only what differs.
"""

from __future__ import annotations

from typing import Any

from ops.api.args import Arg, arguments
from ops.api.changes import Plan, Run, StepFailed
from ops.gpu.gather import gather_env
from ops.gpu.pins import Requirement, check_installed
from ops.shell import join
from ops.steps.base import Step, register
from ops.steps.gpu import pins_for, profile_arg, venv_path

INSTALL_TIMEOUT_S = 3 * 3600.0


def install_argv(python: str, uv: str | None, index: str | None, specs: list[str]) -> list[str]:
    """uv when present (fast, resolves the whole set), else the venv's pip."""
    if uv:
        index_args = ["--extra-index-url", index, "--index-strategy", "unsafe-best-match"] if index else []
        return [uv, "pip", "install", "--python", python, *index_args, *specs]
    index_args = ["--extra-index-url", index] if index else []
    return [
        python,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "-q",
        *index_args,
        *specs,
    ]


def plan_install(
    reqs: tuple[Requirement, ...], packages: dict[str, Any], python: str, uv: str | None, index: str | None
) -> Plan:
    """Pure: the install command for the pins that the installed packages do not satisfy."""
    todo = [(req, why) for req in reqs if (why := check_installed(req, packages)) is not None]
    if not todo:
        pinned = ", ".join(f"{r.name} {packages[r.name]['version']}" for r in reqs)
        return Plan.noop(f"all {len(reqs)} pins installed: {pinned}")
    argv = install_argv(python, uv, index, [req.spec for req, _ in todo])
    reasons = "; ".join(why for _, why in todo)
    return Plan.of([Run(join(argv), timeout=INSTALL_TIMEOUT_S, why=reasons)], f"install {reasons}")


@register
class PinnedPackages(Step):
    name = "pinned_packages"
    summary = "the profile's pinned torch/triton/vllm set (CUDA index, git refs), only what differs"
    args = arguments(
        profile=Arg(profile_arg, required=True, help="blackwell | hopper | cpu"),
        pins=Arg(str, default="pins.yaml", help="the pins file, beside the playbook"),
        pins_set=Arg(str, help="which requirement set of the profile (default: its first)"),
        venv=Arg(str, help="venv directory on the host (default <base>/venv)"),
    )

    def probe(self, conn, args, ctx):
        env = gather_env(conn, venv_path(args, ctx))
        uv = conn.run("command -v uv || true", timeout=30).stdout.strip() or None
        return {"packages": (env or {}).get("packages", {}), "venv_exists": env is not None, "uv": uv}

    def plan(self, facts, args, ctx):
        pins = pins_for(args, ctx, args["profile"])
        try:
            reqs = pins.requirements(args["pins_set"])
        except ValueError as exc:
            raise StepFailed(
                f"{exc} (fix: set the host's pins_set to a set of playbooks/{args['pins']})"
            ) from None
        python = f"{venv_path(args, ctx)}/bin/python"
        return plan_install(reqs, facts["packages"], python, facts["uv"], pins.index)
