"""Python environment steps: ``python_venv`` and ``pip_install``.

``pip_install`` takes pinned requirements and probes the installed versions with
``importlib.metadata`` inside the venv (works even without pip), so a re-run installs nothing
and a changed pin installs only what differs.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from ops.api.args import Arg, arguments
from ops.api.changes import Fact, Plan, Run, StepFailed, check_result
from ops.api.context import StepContext
from ops.shell import join, quote
from ops.steps.base import Step, register

if TYPE_CHECKING:
    from ops.connection import CommandResult

_REQUIREMENT = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<extras>\[[A-Za-z0-9,._ -]*\])?\s*"
    r"(?:==\s*(?P<version>[A-Za-z0-9.+!_-]+))?\s*$"
)

_LIST_INSTALLED = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}))"
)


def normalize(name: str) -> str:
    """PEP 503 normalized project name (``Foo_Bar`` == ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(text: str) -> tuple[str, str, str | None]:
    """``name[extras]==version`` or a bare name -> (pip spec, normalized name, version or None)."""
    match = _REQUIREMENT.match(text.strip())
    if not match:
        raise ValueError(
            f"requirement {text!r} must be 'name==version' (or a bare name); "
            "ranges would make the probe guess"
        )
    spec = re.sub(r"\s+", "", text.strip())
    return spec, normalize(match["name"]), match["version"]


def parse_requirements_file(text: str) -> list[str]:
    """Requirement lines of a requirements file; comments and blank lines are skipped."""
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-"):
            raise ValueError(
                f"line {number}: pip options ({line.split()[0]}) are not supported; "
                "use the step's find_links / no_index arguments"
            )
        lines.append(line)
    return lines


def requirements_arg(value: Any) -> list[str] | str:
    """A list of pinned requirements (checked now) or a requirements file name (read per host)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value:
        for item in value:
            parse_requirement(str(item))
        return [str(v) for v in value]
    raise ValueError(f"expected a list of 'name==version' or a requirements file name, got {value!r}")


def venv_fact(path: str) -> Fact[dict[str, Any]]:
    """Whether ``path`` is a venv (its python runs) and its version; whether uv is available."""
    python = quote(f"{path}/bin/python")
    command = (
        f"if [ -x {python} ]; then {python} -c 'import sys; print(sys.version.split()[0])'; "
        "else echo missing; fi; command -v uv || true"
    )
    return Fact(command, parse_venv)


def parse_venv(result: CommandResult) -> dict[str, Any]:
    lines = result.stdout.splitlines()
    if not lines:
        raise StepFailed("cannot inspect the venv", command=result.command, stderr=result.stderr)
    exists = lines[0].strip() != "missing"
    return {
        "exists": exists,
        "version": lines[0].strip() if exists else None,
        "uv": lines[1].strip() if len(lines) > 1 and lines[1].strip() else None,
    }


def installed_fact(venv: str) -> Fact[dict[str, str]]:
    return Fact(join([f"{venv}/bin/python", "-c", _LIST_INSTALLED]), parse_installed)


def parse_installed(result: CommandResult) -> dict[str, str]:
    """{normalized name: version} from the venv's importlib.metadata listing."""
    check_result(result)
    return {normalize(name): version for name, version in json.loads(result.stdout).items()}


@register
class PythonVenv(Step):
    name = "python_venv"
    summary = "a Python virtual environment (uv when present, else python -m venv)"
    args = arguments(
        path=Arg(str, required=True, help="venv directory on the host"),
        python=Arg(str, default="python3", help="interpreter to create it with"),
    )

    def probe(self, conn, args, ctx):
        return venv_fact(args["path"]).gather(conn)

    def plan(self, facts, args, ctx):
        path, python = args["path"], args["python"]
        if facts["exists"]:
            return Plan.noop(f"venv exists (Python {facts['version']})", python=f"{path}/bin/python")
        if facts.get("uv"):
            command = join([facts["uv"], "venv", "--seed", "--python", python, path])
        else:
            command = join([python, "-m", "venv", path])
        return Plan.of([Run(command, why="missing")], f"create venv {path}", python=f"{path}/bin/python")


def _requirements(args: dict[str, Any], ctx: StepContext) -> list[tuple[str, str, str | None]]:
    reqs = args["requirements"]
    if isinstance(reqs, str):
        source = ctx.find_source(reqs)
        try:
            reqs = parse_requirements_file(source.read_text())
            return [parse_requirement(r) for r in reqs]
        except ValueError as exc:
            raise StepFailed(f"{source}: {exc}") from None
    return [parse_requirement(r) for r in reqs]


@register
class PipInstall(Step):
    name = "pip_install"
    summary = "pinned packages in a venv; only the ones that differ are installed"
    args = arguments(
        venv=Arg(str, required=True, help="venv directory on the host"),
        requirements=Arg(
            requirements_arg,
            required=True,
            help="list of 'name==version', or a requirements file beside the playbook",
        ),
        find_links=Arg(str, help="a directory or URL of wheels on the host (pip --find-links)"),
        no_index=Arg(bool, default=False, help="do not use the package index (offline hosts)"),
    )

    def probe(self, conn, args, ctx):
        facts = venv_fact(args["venv"]).gather(conn)
        facts["installed"] = installed_fact(args["venv"]).gather(conn) if facts["exists"] else {}
        return facts

    def plan(self, facts, args, ctx):
        installed = facts["installed"]
        missing, why = [], []
        for spec, name, version in _requirements(args, ctx):
            have = installed.get(name)
            if have is None or (version is not None and have != version):
                missing.append(spec)
                why.append(f"{name} {have or 'absent'} -> {version or 'any'}")
        if not missing:
            return Plan.noop(
                f"{len(installed)} packages installed; all requirements satisfied", installed=installed
            )
        python = f"{args['venv']}/bin/python"
        options = ["--no-index"] if args["no_index"] else []
        if args["find_links"]:
            options += ["--find-links", args["find_links"]]
        if facts.get("uv"):
            argv = [facts["uv"], "pip", "install", "--python", python, *options, *missing]
        else:
            argv = [
                python,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "-q",
                *options,
                *missing,
            ]
        return Plan.of(
            [Run(join(argv), why="; ".join(why))], "install " + ", ".join(why), installed=installed
        )
