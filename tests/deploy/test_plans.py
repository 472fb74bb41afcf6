"""Deploy steps' plans as data: host facts in, the commands (or the no-op reason) out, and a
second plan on the host as the first one leaves it changes nothing. The systemd backend is
covered here only: this machine's PID 1 is not systemd (the supervisor runs for real in the
end-to-end tests)."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import pytest

from ops.api.args import ArgError
from ops.api.changes import Plan, Run, StepFailed, Write
from ops.api.context import StepContext
from ops.connection import CommandResult
from ops.hosts import Host
from ops.service.backends import Preflight, Wait
from ops.service.metrics import status_metrics as parse_metrics
from ops.service.releases import parse_layout
from ops.steps import get_step
from ops.steps.release import releases_to_prune
from ops.wheel import REPO_ROOT

BASE = "/opt/specops"
ENV_SHA = "e" * 64
A, B, C = "0.1.0+gaaaaaaa", "0.1.0+gbbbbbbb", "0.1.0+gccccccc"


def context(**variables: Any) -> StepContext:
    host = Host(
        name="gpu1",
        connection="ssh",
        address="10.0.0.5",
        port=22,
        user="ubuntu",
        key_file=None,
        base=BASE,
        host_key_policy="strict",
        known_hosts=(),
        sudo=False,
        connect_timeout=10.0,
        vars={},
        groups=(),
    )
    return StepContext(
        host=host,
        playbook_dir=REPO_ROOT / "playbooks",
        templates_dir=REPO_ROOT / "templates",
        vars={**host.template_vars(), "profile": "blackwell", **variables},
    )


def describe(plan: Plan) -> list[str]:
    out = []
    for change in plan.changes:
        kind = "wait" if isinstance(change, Wait) else "preflight" if isinstance(change, Preflight) else "run"
        out.append(
            f"{kind}: {change.command}" if isinstance(change, Run) else f"write: {change.path} {change.mode}"
        )
    return out


def service_args(**overrides: Any) -> dict[str, Any]:
    raw = {
        "base": BASE,
        "release": B,
        "venv": f"{BASE}/venv",
        "target": "/m/target",
        "drafter": "/m/drafter",
        "env_file": f"{BASE}/run/specops-ddtree.env",
        "serve": {"port": 8011, "budget": 32},
        **overrides,
    }
    return get_step("service")().check_args(raw)


def facts(
    current: str | None = A,
    previous: str | None = None,
    *,
    systemd: bool = False,
    process: dict | None = None,
    state: dict | None = None,
    health: int | None = None,
) -> dict[str, Any]:
    unit_dir = "/etc/systemd/system"
    return {
        "layout": {"current": current, "previous": previous, "releases": {A: 1, B: 2, C: 3}},
        "service": {
            "systemd": {
                "usable": systemd,
                "scope": "system",
                "uid": 0,
                "unit_sha": None,
                "unit_path": f"{unit_dir}/specops-ddtree.service",
                "process": process if systemd else None,
            },
            "supervisor_process": None if systemd else process,
            "state": state,
            "env_sha": ENV_SHA,
            "supervisor_sha": None,
            "log_size": 10,
            "health": health,
            "metrics": None,
        },
    }


def host_after(plan: Plan, before: dict[str, Any], *, systemd: bool = False) -> dict[str, Any]:
    """The facts a host shows after ``plan`` ran and the server answered."""
    state = next(
        json.loads(c.data) for c in plan.changes if isinstance(c, Write) and c.path.endswith(".state")
    )
    after = json.loads(json.dumps(before))
    after["layout"]["current"], after["layout"]["previous"] = plan.data["release"], plan.data["previous"]
    service = after["service"]
    service.update(
        state=state, health=200, supervisor_sha=None if systemd else _sha_of(plan, "supervisor.py")
    )
    running = {"pid": 4242, "uptime_s": 3.0, "cwd": f"{BASE}/releases/{plan.data['release']}"}
    if systemd:
        service["systemd"].update(process=running, unit_sha=_sha_of(plan, ".service"))
    else:
        service["supervisor_process"] = running
    return after


def _sha_of(plan: Plan, suffix: str) -> str:
    return next(
        hashlib.sha256(c.data).hexdigest()
        for c in plan.changes
        if isinstance(c, Write) and c.path.endswith(suffix)
    )


def test_systemd_deploy_writes_the_unit_switches_restarts_waits_then_changes_nothing():
    step, args, ctx = get_step("service")(), service_args(), context()
    first = step.plan(facts(current=A, systemd=True), args, ctx)
    lines = describe(first)
    assert lines[0] == "write: /etc/systemd/system/specops-ddtree.service 0644"
    assert lines[1:3] == ["run: systemctl daemon-reload", "run: systemctl enable specops-ddtree.service"]
    assert lines[3].startswith(
        "preflight: cd /opt/specops/releases/0.1.0+gbbbbbbb && env "
        "PYTHONPATH=/opt/specops/releases/0.1.0+gbbbbbbb/site /opt/specops/venv/bin/python "
        "-m ddtree_runtime serve --help"
    )
    assert (
        lines[4] == "run: ln -sfn releases/0.1.0+gaaaaaaa /opt/specops/.previous.tmp && "
        "mv -T /opt/specops/.previous.tmp /opt/specops/previous"
    )
    assert lines[5].endswith("mv -T /opt/specops/.current.tmp /opt/specops/current")
    assert lines[6] == "run: systemctl restart specops-ddtree.service"
    assert lines[7].startswith("wait: python3 -c ")
    assert lines[8].startswith(  # the env file this start answered with, kept for the rollbacks
        "run: umask 077 && mkdir -p /opt/specops/run/specops-ddtree.proven && cp -- "
        "/opt/specops/run/specops-ddtree.env /opt/specops/run/specops-ddtree.proven/0.1.0+gbbbbbbb.env.tmp"
    )
    assert lines[9] == "write: /opt/specops/run/specops-ddtree.state 0644"
    unit = first.changes[0].data.decode()
    assert "WorkingDirectory=/opt/specops/releases/0.1.0+gbbbbbbb\n" in unit
    assert 'Environment="PYTHONPATH=/opt/specops/releases/0.1.0+gbbbbbbb/site"' in unit
    assert "EnvironmentFile=/opt/specops/run/specops-ddtree.env\n" in unit
    assert "LimitNOFILE=65536\n" in unit  # a thousand client connections need more than 1024 files
    assert "--device cuda --env-file /opt/specops/run/specops-ddtree.env" in unit  # the host picks the dtype
    assert (
        "WantedBy=multi-user.target" in unit
        and "StandardOutput=append:/opt/specops/logs/specops-ddtree.log" in unit
    )
    assert first.data["rollback_to"] == A and first.data["previous"] == A

    second = step.plan(host_after(first, facts(current=A, systemd=True), systemd=True), args, ctx)
    assert not second.will_change
    assert (
        second.reason == f"release {B} running (pid 4242, up 3s), /health 200" and second.data["pid"] == 4242
    )


def test_supervisor_restarts_only_when_something_changed():
    step, args, ctx = (
        get_step("service")(),
        service_args(serve={"port": 8011, "dtype": "float32"}),
        context(profile="cpu"),
    )
    first = step.plan(facts(current=None), args, ctx)
    lines = describe(first)
    assert lines[0] == "write: /opt/specops/bin/specops-supervisor.py 0755"
    assert lines[1] == "run: rm -f -- /opt/specops/previous"  # nothing ran before: no start check either
    assert lines[3].startswith("run: python3 /opt/specops/bin/specops-supervisor.py stop --pidfile")
    start = lines[4]
    assert start.startswith(
        "run: python3 /opt/specops/bin/specops-supervisor.py start --pidfile "
        "/opt/specops/run/specops-ddtree.pid --log /opt/specops/logs/specops-ddtree.log --cwd "
        "/opt/specops/releases/0.1.0+gbbbbbbb --env-file /opt/specops/run/specops-ddtree.env"
    )
    assert "--device cpu --env-file /opt/specops/run/specops-ddtree.env --dtype float32" in start
    assert "--port 8011 " in start
    assert first.data["rollback_to"] is None

    running = host_after(first, facts(current=None))
    assert not step.plan(running, args, ctx).will_change
    env_changed = json.loads(json.dumps(running))
    env_changed["service"]["env_sha"] = "f" * 64
    plan = step.plan(env_changed, args, ctx)
    assert "release, environment file or unit changed" in plan.reason
    assert not any(isinstance(c, Preflight) for c in plan.changes)  # same release: no start check
    cut = json.loads(json.dumps(running))  # a cut link left `current` on C, unproven: A answered last
    cut["layout"]["current"], cut["service"]["state"]["release"] = C, A
    plan = step.plan(cut, service_args(release=C), ctx)
    assert plan.data["rollback_to"] == A and isinstance(plan.changes[0], Preflight)
    unhealthy = json.loads(json.dumps(running))
    unhealthy["service"]["health"] = 503
    assert "running but /health answers 503" in step.plan(unhealthy, args, ctx).reason
    dead = json.loads(json.dumps(running))
    dead["service"]["supervisor_process"] = None
    assert "not running" in step.plan(dead, args, ctx).reason


def test_rollback_swaps_current_and_previous_and_needs_a_previous_release():
    step, ctx = get_step("service")(), context()
    args = service_args(release="previous")
    plan = step.plan(facts(current=B, previous=A), args, ctx)
    assert plan.data["release"] == A and plan.data["previous"] == B and plan.data["rollback_to"] == B
    with pytest.raises(StepFailed, match="no previous release under /opt/specops"):
        step.plan(facts(current=B, previous=None), args, ctx)
    with pytest.raises(StepFailed, match=r"release 0\.1\.0\+gddddddd is not complete"):
        step.plan(facts(), service_args(release="0.1.0+gddddddd"), ctx)
    ctx.check = True  # under --check the release step only planned the upload
    assert step.plan(facts(), service_args(release="0.1.0+gddddddd"), ctx).will_change


def test_rollbacks_restore_the_settings_and_env_file_a_release_answered_with():
    """Issue 27, item 1: `fab rollback` and the automatic rollback run a release with what it last
    answered with (args from the state, the env file from its kept copy), not the newer settings."""
    step, ctx = get_step("service")(), context(profile="cpu")
    old_env = "a" * 64
    answered = service_args(release=A, serve={"port": 8022})
    before = facts(current=B, previous=A)
    before["service"]["state"] = {
        "release": B,
        "fingerprint": "f" * 64,
        "args": service_args(),
        "proven": {
            A: {"args": answered, "env_sha": old_env},
            B: {"args": service_args(), "env_sha": ENV_SHA},
        },
    }
    before["service"]["proven_env"] = {A: old_env, B: ENV_SHA}
    plan = step.plan(before, service_args(release="previous"), ctx)
    lines = describe(plan)
    restore = next(i for i, line in enumerate(lines) if "specops-ddtree.env.specops-restore" in line)
    assert lines[restore] == (
        "run: umask 077 && cp -- /opt/specops/run/specops-ddtree.proven/0.1.0+gaaaaaaa.env "
        "/opt/specops/run/specops-ddtree.env.specops-restore && mv -f -- "
        "/opt/specops/run/specops-ddtree.env.specops-restore /opt/specops/run/specops-ddtree.env"
    )
    assert restore == plan.data["first_disruptive"]  # after the checks, before the switch
    assert "--port 8022 " in next(line for line in lines if " start --pidfile" in line)
    state = json.loads(plan.changes[-1].data)
    assert state["args"]["serve"] == {"port": 8022} and set(state["proven"]) == {A, B}
    assert state["proven"][A]["env_sha"] == old_env

    before["service"]["proven_env"] = {}  # no kept copy: the args still go back, the env file stays
    assert not any(
        "specops-restore" in line
        for line in describe(step.plan(before, service_args(release="previous"), ctx))
    )
    deploy = step.plan(before, service_args(release=A), ctx)  # a deploy uses what it is given
    assert not any("specops-restore" in line for line in describe(deploy))
    assert "--port 8011 " in next(line for line in describe(deploy) if " start --pidfile" in line)


def test_systemd_asked_for_where_it_is_not_usable_is_refused():
    with pytest.raises(StepFailed, match="set service_backend: supervisor"):
        get_step("service")().plan(facts(), service_args(backend="systemd"), context())


@pytest.mark.parametrize(
    ("serve", "message"),
    [
        ({"prot": 1}, "unknown serve key 'prot'"),
        ({"port": "http"}, "serve.port: expected int"),
        ({"port": 70000}, "serve.port: expected 1-65535"),
        ({"mode": "beam"}, "serve.mode: expected one of ar, dflash, ddtree"),
        ({"dtype": "bf16"}, "serve.dtype: expected one of float32, bfloat16, float16, got 'bf16'"),
        ({"device": "tpu"}, "serve.device: expected one of cpu, cuda, got 'tpu'"),
    ],
)
def test_bad_serve_vars_name_the_key(serve, message):
    with pytest.raises(ArgError, match=message):
        service_args(serve=serve)


def release_facts(state: str, partial: str | None = None) -> dict[str, Any]:
    return {
        "state": state,
        "installed_sha256": "1" * 64 if state == "complete" else None,
        "partial_sha256": partial,
        "release": B,
        "wheel": str(REPO_ROOT / "pyproject.toml"),
        "sha256": "2" * 64,
    }


def test_release_uploads_by_checksum_and_renames_into_place_when_complete():
    step, ctx = get_step("release")(), context()
    args = step.check_args({"base": BASE, "python": f"{BASE}/venv/bin/python"})
    fresh = describe(step.plan(release_facts("missing"), args, ctx))
    partial = f"{BASE}/releases/.partial-{B}"
    assert fresh[0] == f"run: mkdir -p -- {partial}" and fresh[1] == f"write: {partial}/pyproject.toml 0644"
    assert fresh[2].endswith(f"> {partial}/COMPLETE && mv -T -- {partial} {BASE}/releases/{B}")
    assert f"{BASE}/venv/bin/python -m zipfile -e {partial}/pyproject.toml {partial}/site" in fresh[2]
    resumed = step.plan(release_facts("missing", partial="2" * 64), args, ctx)
    assert not any(isinstance(c, Write) for c in resumed.changes) and "already uploaded" in resumed.reason
    leftover = describe(step.plan(release_facts("incomplete"), args, ctx))
    assert f"rm -rf -- {BASE}/releases/{B} && mv -T" in leftover[-1]
    done = step.plan(release_facts("complete"), args, ctx)
    assert not done.will_change and done.reason == f"release {B} is installed (wheel sha256 111111111111)"


def test_prune_keeps_the_newest_and_always_current_and_previous():
    layout = {"current": "r1", "previous": "r2", "releases": {f"r{i}": i for i in range(1, 9)}}
    assert releases_to_prune(layout, 5) == ["r5", "r4", "r3"]  # r1, r2 + the 3 newest
    assert releases_to_prune(layout, 1) == ["r8", "r7", "r6", "r5", "r4", "r3"]
    step = get_step("release_prune")()
    args = step.check_args({"base": BASE, "keep": "3"})
    assert describe(step.plan(layout, args, context()))[0] == (  # and the env file it answered with
        f"run: rm -rf -- {BASE}/releases/r7 {BASE}/run/specops-ddtree.proven/r7.env"
    )
    assert not step.plan({**layout, "releases": {"r1": 1, "r2": 2}}, args, context()).will_change
    with pytest.raises(ArgError, match="whole number >= 1"):
        step.check_args({"base": BASE, "keep": 0})


def test_layout_parser_reads_links_and_complete_releases():
    out = f"current=releases/{B}\nprevious=\nrelease=170 {A}\nrelease=180 {B}\n"
    assert parse_layout(CommandResult("layout", 0, out, "")) == {
        "current": B,
        "previous": None,
        "releases": {A: 170, B: 180},
    }


def test_runtime_venv_names_the_current_release_and_shared_site_packages():
    step, ctx = get_step("runtime_venv")(), context()
    args = step.check_args(
        {"path": f"{BASE}/venv", "release_site": f"{BASE}/current/site", "site_packages": ["/srv/shared"]}
    )
    fresh = describe(step.plan({"exists": False}, args, ctx))
    assert fresh[0] == f"run: python3 -m venv {BASE}/venv" and "specops.pth" in fresh[1]
    pth = f"{BASE}/current/site\n/srv/shared\n"
    assert not step.plan({"exists": True, "version": "3.12", "pth": pth}, args, ctx).will_change
    shared = step.check_args(
        {"path": f"{BASE}/venv", "release_site": f"{BASE}/current/site", "site_packages": "controller"}
    )
    assert describe(step.plan({"exists": False}, shared, ctx))[0].startswith(
        f"run: {sys.executable} -m venv --without-pip"
    )
    with pytest.raises(StepFailed, match="drop 'controller' from venv_site_packages"):
        step.plan({"exists": True, "version": "2.7", "pth": None}, shared, ctx)


def test_metrics_parser_sums_the_counters_status_shows():
    text = """# HELP vllm:spec_decode_num_drafts_total Drafts.
vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 10
vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} 50
vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 25
vllm:request_success_total{model_name="m",engine="0",finished_reason="stop"} 3
vllm:request_success_total{model_name="m",engine="0",finished_reason="length"} 4
vllm:num_requests_waiting{model_name="m",engine="0"} 0
"""
    assert parse_metrics(text) == {
        "drafts": 10,
        "draft_tokens": 50,
        "accepted_tokens": 25,
        "requests": 7,
        "waiting": 0,
        "mean_acceptance_length": 3.5,
    }


def test_demo_checkpoints_are_generated_once_on_the_host():
    step = get_step("demo_checkpoints")()
    args = step.check_args(
        {
            "dir": f"{BASE}/models/demo",
            "python": f"{BASE}/venv/bin/python",
            "site": f"{BASE}/releases/{B}/site",
        }
    )
    plan = step.plan({"done": False}, args, context())
    assert describe(plan) == [
        f"run: env PYTHONPATH={BASE}/releases/{B}/site {BASE}/venv/bin/python -c "
        "'import sys; from ddtree_runtime.tiny import write_tiny_pair; "
        f"write_tiny_pair(sys.argv[1])' {BASE}/models/demo"
    ]
    again = step.plan({"done": True}, args, context())
    assert not again.will_change and again.data["target"] == f"{BASE}/models/demo/target"
