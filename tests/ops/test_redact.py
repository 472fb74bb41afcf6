"""Secrets: the Redactor, redaction of everything a connection returns or logs, and sudo passwords
that travel on stdin (checked in the live process table), never on argv."""

from __future__ import annotations

import contextlib
import logging
import os
import textwrap
import threading
from pathlib import Path

import pytest

from ops.connection import connect
from ops.connection.base import sudo_wrap
from ops.inventory import load_inventory
from ops.playbook import load_playbook
from ops.redact import MASK, Redactor
from ops.runner import run_playbook

TOKEN = "hf_TESTtoken0123456789abcdef"
PASSWORD = "correct horse battery staple"


def test_redactor_masks_longest_first_and_multiline_secrets():
    redactor = Redactor(["abcd1234"])
    redactor.add("abcd1234-longer")
    redactor.add("-----BEGIN KEY-----\nline-one-of-key\nline-two-of-key\n-----END KEY-----\n")
    text = "a abcd1234-longer b abcd1234 c line-two-of-key d"
    assert redactor.redact(text) == f"a {MASK} b {MASK} c {MASK} d"
    assert redactor.redact("nothing here") == "nothing here"
    with pytest.raises(ValueError):
        redactor.add("ab")
    with pytest.raises(TypeError):
        redactor.add(b"bytes-secret")


def fake_sudo(folder: Path) -> Path:
    """A stand-in sudo (the test machines have none) that behaves like `sudo -S` on stdin and records
    its argv, its own /proc cmdline and its parent's, and the password line it read."""
    bindir = folder / "bin"
    bindir.mkdir(parents=True)
    script = bindir / "sudo"
    script.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        log={folder}
        printf '%s\\n' "$@" > "$log/argv"
        tr '\\0' '\\n' < /proc/$$/cmdline > "$log/cmdline"
        tr '\\0' '\\n' < /proc/$PPID/cmdline > "$log/parent_cmdline"
        case " $* " in *" -S "*) IFS= read -r pw; printf '%s' "$pw" > "$log/stdin_password";; esac
        while [ "$1" != "--" ]; do shift; done
        shift
        exec "$@"
        """)
    )
    script.chmod(0o755)
    return bindir


def secret_file(tmp_path: Path, value: str) -> Path:
    path = tmp_path / "sudo_password"
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def assert_password_went_on_stdin(folder: Path, command: str) -> None:
    argv = (folder / "argv").read_text().splitlines()
    assert argv == ["-k", "-S", "-p", "", "--", "/bin/sh", "-c", command]
    assert (folder / "stdin_password").read_text() == PASSWORD
    for name in ("argv", "cmdline", "parent_cmdline"):
        assert PASSWORD not in (folder / name).read_text()
    assert (folder / "cmdline").read_text().splitlines()[-1] == command  # the live process, not a guess


@pytest.fixture
def sudo_host(sshd_hosts, make_inventory, tmp_path):
    """An sshd host whose PATH finds the recording sudo first, with sudo: true and a password secret."""
    folder = tmp_path / "sudo-log"
    bindir = fake_sudo(folder)
    (h1,) = sshd_hosts(1, env={"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin"})
    password = secret_file(tmp_path, PASSWORD)
    path = make_inventory(
        [h1], host_fields={"h1": {"sudo": True, "secrets": {"sudo_password": {"file": str(password)}}}}
    )
    return load_inventory(path).hosts["h1"], folder


def test_sudo_password_travels_on_stdin_over_ssh(sudo_host):
    host, folder = sudo_host
    with connect(host) as conn:
        result = conn.run("cat; id -u", sudo=True, stdin="payload\n")
    assert result.ok and result.stdout == f"payload\n{os.getuid()}\n"
    assert PASSWORD not in result.command and result.command == "cat; id -u"
    assert_password_went_on_stdin(folder, "cat; id -u")


def test_sudo_without_a_password_uses_non_interactive_sudo(sshd_hosts, make_inventory, tmp_path):
    folder = tmp_path / "sudo-log"
    bindir = fake_sudo(folder)
    (h1,) = sshd_hosts(1, env={"PATH": f"{bindir}:/usr/bin:/bin"})
    host = load_inventory(make_inventory([h1], host_fields={"h1": {"sudo": True}})).hosts["h1"]
    with connect(host) as conn:
        assert conn.run("echo hi", sudo=True).stdout == "hi\n"
        assert (folder / "argv").read_text().splitlines() == ["-n", "--", "/bin/sh", "-c", "echo hi"]
        (folder / "argv").unlink()
        assert conn.run("echo plain").ok  # sudo=False never goes through sudo
        assert not (folder / "argv").exists()


def test_sudo_false_host_runs_privileged_commands_directly(sshd_hosts, make_inventory, tmp_path):
    folder = tmp_path / "sudo-log"
    bindir = fake_sudo(folder)
    (h1,) = sshd_hosts(1, env={"PATH": f"{bindir}:/usr/bin:/bin"})
    with connect(load_inventory(make_inventory([h1])).hosts["h1"]) as conn:
        assert conn.run("echo direct", sudo=True).stdout == "direct\n"
    assert not (folder / "argv").exists()


def test_sudo_password_travels_on_stdin_locally(make_inventory, tmp_path, monkeypatch):
    folder = tmp_path / "sudo-log"
    monkeypatch.setenv("PATH", f"{fake_sudo(folder)}:{os.environ['PATH']}")
    path = make_inventory([], local=True, host_fields={})
    text = path.read_text().replace(
        "    connection: local\n",
        "    connection: local\n    sudo: true\n"
        f"    secrets: {{sudo_password: {{file: {secret_file(tmp_path, PASSWORD)}}}}}\n",
    )
    path.write_text(text)
    with connect(load_inventory(path).hosts["local"]) as conn:
        assert conn.run("cat", sudo=True, stdin="rest").stdout == "rest"
    assert_password_went_on_stdin(folder, "cat")


def test_sudo_wrap_quotes_through_the_shell_module():
    assert sudo_wrap("echo 'a b'", None) == "sudo -n -- /bin/sh -c 'echo '\"'\"'a b'\"'\"''"
    assert sudo_wrap("x", "pw").startswith("sudo -k -S -p '' -- ")
    assert "pw" not in sudo_wrap("x", "pw")


@pytest.mark.parametrize("kind", ["ssh", "local"])
def test_secret_never_appears_in_returned_output_or_logs(
    kind, sshd_hosts, make_inventory, monkeypatch, caplog
):
    monkeypatch.setenv("SPECOPS_TEST_TOKEN", TOKEN)
    secrets = {"secrets": {"HF_TOKEN": {"env": "SPECOPS_TEST_TOKEN"}}}
    if kind == "ssh":
        (h1,) = sshd_hosts(1)
        host = load_inventory(make_inventory([h1], host_fields={"h1": secrets})).hosts["h1"]
        base = str(h1.base)
    else:
        path = make_inventory([], local=True)
        path.write_text(
            path.read_text().replace(
                "    connection: local\n",
                "    connection: local\n    secrets: {HF_TOKEN: {env: SPECOPS_TEST_TOKEN}}\n",
            )
        )
        host = load_inventory(path).hosts["local"]
        base = host.base
        os.makedirs(base)
    caplog.set_level(logging.DEBUG, logger="specops.connection")
    with connect(host) as conn:
        conn.write_bytes(f"{base}/app.env", f"HF_TOKEN={TOKEN}\n".encode(), mode=0o600)
        shown = conn.run(["cat", f"{base}/app.env"])  # the command never saw the value, the output has it
        echoed = conn.run(f"echo {TOKEN}; echo {TOKEN} >&2")
        assert conn.read_bytes(f"{base}/app.env") == f"HF_TOKEN={TOKEN}\n".encode()  # data is not altered
    assert shown.stdout == f"HF_TOKEN={MASK}\n"
    for result in (shown, echoed):
        for text in (result.command, result.stdout, result.stderr):
            assert TOKEN not in text
    assert echoed.command == f"echo {MASK}; echo {MASK} >&2" and echoed.stderr == f"{MASK}\n"
    assert TOKEN not in caplog.text and MASK in caplog.text


def test_a_secret_is_redacted_in_the_forms_its_parts_take(tmp_path, monkeypatch, capsys):
    """Issue 27, item 3: a value with quotes, split by the shell quoting of a command line, is still
    masked in the terminal, run.log and summary.json (as are its JSON and URL forms)."""
    value = 'it\'s-a-s3cret "key"\\x'
    monkeypatch.setenv("SPECOPS_TEST_API_KEY", value)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        f"hosts:\n  local:\n    connection: local\n    base: {tmp_path / 'base'}\n"
        "    secrets: {API_KEY: {env: SPECOPS_TEST_API_KEY}}\n"
    )
    book = tmp_path / "leak.yaml"
    book.write_text(
        "name: leak\nsteps:\n  - step: command\n"
        "    args: {cmd: [sh, -c, 'echo \"$0\" >&2; exit 3', '{{ secrets.API_KEY }}']}\n"
    )
    result = run_playbook(
        load_playbook(book), load_inventory(inventory).select(None), results_root=tmp_path / "r", live=False
    )
    assert result.hosts["local"].steps[0].status == "failed"
    shown = capsys.readouterr().out
    stored = (result.run_dir / "run.log").read_text() + (result.run_dir / "summary.json").read_text()
    forms = (value, "s3cret", 's3cret \\"key\\"')  # raw, a part between shell quotes, JSON-escaped
    for form in forms:
        assert form not in shown and form not in stored, form
    assert "command: sh -c" in shown and MASK in shown
    redactor = Redactor([value])
    assert redactor.redact("q=it%27s-a-s3cret%20%22key%22%5Cx") == f"q={MASK}"


def test_temp_files_are_private_from_their_first_byte(sshd_hosts, make_inventory):
    """Issue 27, item 3: the temp file a write goes through is 0600 (and new) while the bytes arrive,
    not 0644 until the final chmod."""
    (h1,) = sshd_hosts(1)
    conn = connect(load_inventory(make_inventory([h1])).hosts["h1"])
    modes: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for entry in os.scandir(h1.base):
                if entry.name.startswith(".secret.env.specops-"):
                    with contextlib.suppress(FileNotFoundError):
                        modes.add(entry.stat().st_mode & 0o777)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(3):
            conn.write_bytes(str(h1.base / "secret.env"), b"HF_TOKEN=hf_x\n" * 600_000, 0o600)
    finally:
        done.set()
        watcher.join()
        conn.close()
    assert modes == {0o600}
