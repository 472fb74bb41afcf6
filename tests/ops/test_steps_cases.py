"""Step plans as data (pyinfra style): facts in -> the expected changes or the no-op reason out.

Each ``step_cases/<step>/*.yaml`` holds ``args``, host ``facts`` and either ``changes`` (``run:``,
``run[sudo]:`` or ``write: PATH mode M``), ``noop`` (the exact reason) or ``error``. A case that
changes something also gives ``second_facts``, the host after the change: planning again must be a
no-op, which is the second run changing nothing. ``sha256: WANTED`` stands for the checksum the
first plan wanted. The facts parsers are checked on captured command output beside the cases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.api.args import ArgError
from ops.api.changes import Plan, Run, StepFailed
from ops.api.context import StepContext
from ops.connection import CommandResult
from ops.hosts import Host
from ops.playbook import load_yaml, render
from ops.steps import REGISTRY, get_step
from ops.steps.facts import parse_facts

CASES = Path(__file__).parent / "step_cases"
CASE_FILES = sorted(CASES.glob("*/*.yaml"))


def make_host(**fields) -> Host:
    values = dict(
        name="gpu1",
        connection="ssh",
        address="10.0.0.5",
        port=22,
        user="ubuntu",
        key_file=None,
        base="/opt/specops",
        host_key_policy="strict",
        known_hosts=(),
        sudo=False,
        connect_timeout=10.0,
        vars={},
        groups=(),
    )
    values.update(fields)
    return Host(**values)


def describe(plan: Plan) -> list[str]:
    out = []
    for change in plan.changes:
        if isinstance(change, Run):
            out.append(f"run{'[sudo]' if change.sudo else ''}: {change.command}")
        else:
            out.append(f"write: {change.path} mode {change.mode}")
    return out


@pytest.mark.parametrize("case_file", CASE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_step_case(case_file: Path) -> None:
    case = load_yaml(case_file.read_text(), case_file)
    step = get_step(case_file.parent.name)()
    host = make_host(**case.get("host", {}))
    variables = {**host.template_vars(), **case.get("vars", {})}
    ctx = StepContext(
        host=host, playbook_dir=case_file.parent, templates_dir=case_file.parent, vars=variables
    )
    args = step.check_args(render(case["args"], variables))
    if "error" in case:
        with pytest.raises(StepFailed, match=case["error"]):
            step.plan(case["facts"], args, ctx)
        return
    plan = step.plan(case["facts"], args, ctx)
    if "noop" in case:
        assert not plan.will_change, describe(plan)
        assert plan.reason == case["noop"]
        return
    assert plan.will_change and plan.reason
    if "changes" in case:
        assert describe(plan) == case["changes"]
    else:
        assert len(plan.changes) == case["change_count"]
    for needle in case.get("diff_contains", []):
        assert needle in plan.diff
    if "second_facts" in case:
        second = dict(case["second_facts"])
        if second.get("sha256") == "WANTED":
            second["sha256"] = plan.data["sha256"]
        again = step.plan(second, args, ctx)
        assert not again.will_change, f"second run would change: {describe(again)}"
        assert again.reason


def test_every_step_has_cases() -> None:
    assert {p.parent.name for p in CASE_FILES} | {"facts"} >= set(REGISTRY) - _foreign_steps()


def _foreign_steps() -> set[str]:
    """Steps other helpers add in their own modules carry their own tests."""
    ours = {"files", "command", "python_env", "http", "facts"}
    return {name for name, cls in REGISTRY.items() if cls.__module__.rsplit(".", 1)[-1] not in ours}


@pytest.mark.parametrize("name", ["debian12_container", "ubuntu2404_blackwell"])
def test_facts_parser_on_captured_output(name: str) -> None:
    output = (CASES / "facts" / f"{name}.txt").read_text()
    expected = json.loads((CASES / "facts" / f"{name}.json").read_text())
    assert parse_facts(CommandResult("facts", 0, output, "")) == expected


def test_facts_step_is_read_only_noop() -> None:
    output = (CASES / "facts" / "ubuntu2404_blackwell.txt").read_text()
    facts = parse_facts(CommandResult("facts", 0, output, ""))
    plan = get_step("facts")().plan(facts, {}, None)
    assert not plan.will_change
    assert "2x NVIDIA RTX PRO 6000" in plan.reason and "systemd usable" in plan.reason
    assert plan.data["gpus"][0]["compute_cap"] == "12.0"


@pytest.mark.parametrize(
    ("step", "args", "message"),
    [
        ("directory", {"path": "/x", "mode": "rwx"}, "argument 'mode': expected an octal mode"),
        ("directory", {"mode": "0755"}, "argument 'path' is required"),
        ("http_wait", {"url": "http://x", "timeout": "soon"}, "argument 'timeout'"),
        ("pip_install", {"venv": "/v", "requirements": ["torch>=2"]}, "must be 'name==version'"),
        ("line_in_file", {"path": "/x", "line": "a", "regexp": "("}, "bad regular expression"),
        ("command", {"cmd": []}, "argument 'cmd'"),
    ],
)
def test_bad_arguments_name_the_argument(step: str, args: dict, message: str) -> None:
    with pytest.raises(ArgError, match=message):
        get_step(step)().check_args(args)


def test_rendered_strings_convert_to_declared_types() -> None:
    args = get_step("http_wait")().check_args({"url": "http://h", "timeout": "2.5", "status": "204"})
    assert args["timeout"] == 2.5 and args["status"] == 204 and args["interval"] == 0.5
