"""Runner semantics on the local connection (fast): retries, ignore_errors, register + when, tags,
per-host errors naming step/host/variable, an unreachable host failing alone, the live display."""

from __future__ import annotations

import io
import json
import socket
import textwrap
from pathlib import Path

import pytest
import yaml

from ops.errors import SpecopsError
from ops.inventory import load_inventory
from ops.playbook import load_playbook
from ops.results import RunResult
from ops.runner import run_playbook


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    with socket.socket() as s:  # a port nobody listens on: connecting is refused at once
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    data = {
        "hosts": {
            "local": {"connection": "local", "base": str(tmp_path / "base"), "vars": {"profile": "cpu"}},
            "dead": {
                "address": "127.0.0.1",
                "port": dead_port,
                "connect_timeout": 1,
                "known_hosts": [str(tmp_path / "known_hosts")],
            },
        }
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(tmp_path: Path, inventory: Path, text: str, limit: str | None = "local", **options) -> RunResult:
    book = tmp_path / "book.yaml"
    book.write_text(textwrap.dedent(text))
    hosts = load_inventory(inventory).select(limit)
    options.setdefault("live", False)
    return run_playbook(load_playbook(book), hosts, results_root=tmp_path / "results", **options)


def steps(result: RunResult, host: str = "local") -> list[tuple[str, str]]:
    return [(s.status, s.message) for s in result.hosts[host].steps]


def test_retries_then_success(tmp_path: Path, inventory: Path) -> None:
    result = run(
        tmp_path,
        inventory,
        f"""\
        name: retry
        steps:
          - step: command
            args: {{cmd: "test -e {tmp_path}/second || {{ touch {tmp_path}/second; exit 1; }}"}}
            retries: 1
    """,
    )
    assert result.ok and steps(result)[0][0] == "changed"
    log = (result.run_dir / "run.log").read_text()
    assert "retry 1/1 of 'command': command exited 1" in log


def test_ignore_errors_register_when(tmp_path: Path, inventory: Path) -> None:
    result = run(
        tmp_path,
        inventory,
        """\
        name: flow
        steps:
          - name: probe a thing
            step: command
            args: {cmd: "echo nope >&2; exit 4"}
            register: probe
            ignore_errors: true
          - name: only when the probe failed
            step: command
            args: {cmd: "echo fallback"}
            when: "{{ probe.status == 'failed' and 'nope' in probe.stderr }}"
            register: fallback
          - name: never
            step: command
            args: {cmd: "exit 1"}
            when: "{{ fallback.stdout.strip() != 'fallback' }}"
    """,
    )
    assert result.ok and result.hosts["local"].status == "changed"
    (s1, m1), (s2, _), (s3, m3) = steps(result)
    assert (s1, s2, s3) == ("failed", "changed", "skipped")
    assert m1.endswith("(ignored: ignore_errors)") and m1.startswith("command exited 4")
    assert "(not idempotent)" in steps(result)[1][1]
    assert m3.startswith("when is false")
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["hosts"]["local"]["status"] == "changed" and summary["failed"] == 0


def test_tags_select_steps(tmp_path: Path, inventory: Path) -> None:
    result = run(
        tmp_path,
        inventory,
        """\
        name: tagged
        steps:
          - step: directory
            args: {path: "{{ base }}/a"}
            tags: [layout]
          - step: directory
            args: {path: "{{ base }}/b"}
    """,
        tags={"layout"},
    )
    assert [s for s, _ in steps(result)] == ["changed", "skipped"]
    assert not (tmp_path / "base" / "b").exists()


def test_undefined_variable_names_step_host_and_variable(tmp_path: Path, inventory: Path) -> None:
    result = run(
        tmp_path,
        inventory,
        """\
        name: undefined
        steps:
          - name: model dir
            step: directory
            args: {path: "{{ model_root }}/m"}
          - step: facts
    """,
    )
    assert not result.ok and result.failed == 1
    status, message = steps(result)[0]
    assert status == "failed"
    assert message == "step 'model dir' on host 'local': undefined variable: 'model_root' is undefined"
    assert steps(result)[1] == ("skipped", "not run: an earlier step failed")


def test_unreachable_host_fails_alone(tmp_path: Path, inventory: Path, capsys) -> None:
    result = run(
        tmp_path,
        inventory,
        """\
        name: two
        steps:
          - step: directory
            args: {path: "{{ base }}/x"}
          - step: facts
    """,
        limit=None,
    )
    assert result.failed == 1 and result.hosts["local"].status == "changed"
    assert result.hosts["dead"].status == "failed"
    assert "unreachable" in result.hosts["dead"].steps[0].message
    out = capsys.readouterr().out
    assert "FAILED dead / directory (directory): host 'dead' unreachable" in out
    assert out.rstrip().endswith(f"2 host(s): 1 changed, 1 failed; summary {result.run_dir / 'summary.json'}")


def test_check_mode_shows_diff_and_writes_nothing(tmp_path: Path, inventory: Path, capsys) -> None:
    (tmp_path / "conf.j2").write_text("profile={{ profile }}\n")
    text = """\
        name: conf
        steps:
          - step: directory
            args: {path: "{{ base }}"}
          - step: template
            args: {src: conf.j2, dest: "{{ base }}/conf"}
    """
    checked = run(tmp_path, inventory, text, check=True)
    assert not (tmp_path / "base").exists() and checked.changed == 1
    out = capsys.readouterr().out
    assert "local | changed [2/2] template: create" in out and "local |     +profile=cpu" in out
    run(tmp_path, inventory, text)
    (tmp_path / "base" / "conf").write_text("profile=gpu\n")
    run(tmp_path, inventory, text, check=True)
    out = capsys.readouterr().out
    assert "-profile=gpu" in out and "+profile=cpu" in out
    assert (tmp_path / "base" / "conf").read_text() == "profile=gpu\n"


def test_live_display_and_latest_symlink(tmp_path: Path, inventory: Path) -> None:
    first = run(tmp_path, inventory, "name: a\nsteps:\n  - step: facts\n", live=True)
    second = run(tmp_path, inventory, "name: b\nsteps:\n  - step: facts\n", live=True)
    latest = tmp_path / "results" / "latest"
    assert latest.is_symlink() and latest.resolve() == second.run_dir.resolve() != first.run_dir.resolve()
    assert not list((tmp_path / "results").glob(".latest-*"))


def test_bad_forks_and_no_hosts(tmp_path: Path, inventory: Path) -> None:
    book = tmp_path / "b.yaml"
    book.write_text("name: b\nsteps:\n  - step: facts\n")
    hosts = load_inventory(inventory).select("local")
    with pytest.raises(SpecopsError, match="--forks must be at least 1"):
        run_playbook(load_playbook(book), hosts, forks=0, results_root=tmp_path)
    with pytest.raises(SpecopsError, match="no hosts selected"):
        run_playbook(load_playbook(book), [], results_root=tmp_path)


def test_output_stream_is_host_prefixed(tmp_path: Path, inventory: Path) -> None:
    from ops.output import Reporter
    from ops.redact import Redactor

    book = tmp_path / "b.yaml"
    book.write_text("name: b\nsteps:\n  - step: facts\n")
    stream = io.StringIO()
    reporter = Reporter(
        load_playbook(book),
        ["local", "a-long-host"],
        check=False,
        log_path=tmp_path / "log",
        redactor=Redactor(["s3cr3t-value"]),
        live=False,
        stream=stream,
    )
    with reporter:
        reporter.note("token s3cr3t-value")
    assert stream.getvalue() == "token ********\n"
    assert "s3cr3t-value" not in (tmp_path / "log").read_text()
