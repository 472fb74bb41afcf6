"""Connections over real sshd daemons and the local backend: the same behaviour on both."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ops.connection import connect
from ops.connection.ssh import SshConnection
from ops.errors import HostUnreachable
from ops.inventory import load_inventory
from ops.shell import join
from tests.sshd import keygen


@pytest.fixture(params=["ssh", "local"])
def backend(request, sshd_hosts, make_inventory, tmp_path):
    """(connection, base directory) for an sshd host and for the local host."""
    if request.param == "ssh":
        (h1,) = sshd_hosts(1)
        host = load_inventory(make_inventory([h1])).hosts["h1"]
        base = h1.base
    else:
        host = load_inventory(make_inventory([], local=True)).hosts["local"]
        base = Path(host.base)
        base.mkdir(parents=True)
    conn = connect(host)
    yield conn, base
    conn.close()


def test_run_exit_codes_streams_stdin_and_quoting(backend):
    conn, _ = backend
    result = conn.run("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr, result.ok) == (3, "out\n", "err\n", False)
    assert conn.run(["cat"], stdin="line one\nline two").stdout == "line one\nline two"
    tricky = 'it\'s a $HOME `x` "quoted" ; rm -rf /'
    result = conn.run(["printf", "%s", tricky])
    assert result.ok and result.stdout == tricky
    assert result.command == join(["printf", "%s", tricky])
    assert conn.run("pwd").stdout.strip() == str(Path.home())  # both start in the login directory
    # Large output on both streams at once must not deadlock on a full window or pipe.
    big = conn.run("head -c 3000000 /dev/zero | tr '\\0' e >&2; head -c 2000000 /dev/zero | tr '\\0' o")
    assert big.ok and len(big.stderr) == 3000000 and len(big.stdout) == 2000000


def test_run_timeout_returns_124(backend):
    conn, _ = backend
    result = conn.run("echo started; sleep 30", timeout=0.5)
    assert result.exit_code == 124 and "started" in result.stdout and "timed out" in result.stderr


def test_files_ranged_read_atomic_write_put_get_stat_listdir(backend, tmp_path):
    conn, base = backend
    target = f"{base}/data.bin"
    conn.write_bytes(target, bytes(range(256)) * 4)
    assert conn.stat(target).mode == 0o644 and conn.stat(target).size == 1024
    assert conn.read_bytes(target, 10, 5) == bytes(range(10, 15))
    assert conn.read_bytes(target, 1020) == bytes(range(252, 256))
    assert conn.read_bytes(target, 2000, 10) == b""
    assert conn.read_bytes(target) == bytes(range(256)) * 4
    with pytest.raises(ValueError):
        conn.read_bytes(target, -1)

    conn.write_bytes(target, b"secret bits", mode=0o600)
    conn.write_bytes(target, b"new contents")  # an existing file keeps its mode
    st = conn.stat(target)
    assert (st.mode, st.size, st.is_dir) == (0o600, 12, False)
    assert conn.stat(str(base)).is_dir and conn.stat(f"{base}/nope") is None
    with pytest.raises(FileNotFoundError):
        conn.read_bytes(f"{base}/nope")
    with pytest.raises(OSError):
        conn.write_bytes(f"{base}/no/such/dir/file", b"x")

    local = tmp_path / "script.sh"
    local.write_bytes(b"#!/bin/sh\necho hi\n")
    local.chmod(0o755)
    conn.put_file(local, f"{base}/script.sh")
    assert conn.stat(f"{base}/script.sh").mode == 0o755
    assert conn.run([f"{base}/script.sh"]).stdout == "hi\n"
    conn.put_file(local, f"{base}/script.sh", mode=0o700)
    assert conn.stat(f"{base}/script.sh").mode == 0o700

    back = tmp_path / "back.bin"
    conn.get_file(target, back)
    assert back.read_bytes() == b"new contents"
    assert conn.listdir(str(base)) == ["data.bin", "script.sh"]  # no temp files left behind
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.timeout(60)
def test_ranged_read_seeks_instead_of_reading_the_file(backend):
    """A 64 GiB sparse file: reading it whole would never finish; the header and tail come back at once."""
    conn, base = backend
    path = f"{base}/model.safetensors"
    conn.run(["truncate", "-s", str(64 << 30), path])
    assert conn.run(f"printf HEADER | dd of={path} conv=notrunc status=none").ok
    assert conn.run(f"printf TAIL | dd of={path} bs=1 seek={(64 << 30) - 4} conv=notrunc status=none").ok
    assert conn.read_bytes(path, 0, 6) == b"HEADER"
    assert conn.read_bytes(path, (64 << 30) - 4) == b"TAIL"


def test_close_is_safe_twice_and_reopens_lazily(backend):
    conn, _ = backend
    with conn as same:
        assert same.run("true").ok
    conn.close()
    conn.close()
    assert conn.run("echo again").stdout == "again\n"


def test_ssh_connection_is_lazy_and_unreachable_host_fails_quickly_by_name(sshd_hosts, make_inventory):
    h1, h2 = sshd_hosts(2)
    inv = load_inventory(make_inventory([h1, h2]))
    h2.stop()
    conn = connect(inv.hosts["h2"])  # nothing opens yet, so this cannot fail
    assert isinstance(conn, SshConnection)
    with pytest.raises(HostUnreachable) as exc:
        conn.run("true")
    assert exc.value.host == "h2"
    assert str(exc.value).startswith("host 'h2' unreachable: cannot connect to 127.0.0.3:")
    assert "refused" in str(exc.value).lower() and "\n" not in str(exc.value)
    with connect(inv.hosts["h1"]) as other:
        assert other.run("echo up").stdout == "up\n"


def test_connect_retries_until_the_daemon_is_back(sshd_hosts, make_inventory):
    (h1,) = sshd_hosts(1)
    host = load_inventory(make_inventory([h1])).hosts["h1"]
    h1.stop()
    starter = threading.Timer(0.05, h1.start)
    starter.start()
    try:
        with connect(host) as conn:
            assert conn.run("echo back").stdout == "back\n"
    finally:
        starter.join()


def test_host_going_down_mid_command_raises_host_unreachable(sshd_hosts, make_inventory):
    (h1,) = sshd_hosts(1)
    host = load_inventory(make_inventory([h1])).hosts["h1"]
    conn = connect(host)
    marker = h1.base / "started"
    outcome: list[BaseException | object] = []

    def long_command() -> None:
        try:
            outcome.append(conn.run(f"touch {marker}; sleep 30"))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=long_command)
    worker.start()
    while not marker.exists() and worker.is_alive():  # until the remote command runs
        time.sleep(0.01)
    h1.stop()
    worker.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], HostUnreachable), outcome
    assert "h1" in str(outcome[0]) and "lost" in str(outcome[0])
    conn.close()


def test_command_killed_by_a_signal_is_a_failed_command_not_a_lost_host(sshd_hosts, make_inventory):
    (h1,) = sshd_hosts(1)
    with connect(load_inventory(make_inventory([h1])).hosts["h1"]) as conn:
        result = conn.run("echo partial; kill -9 $$")
        assert not result.ok and "partial" in result.stdout
        assert conn.run("echo still").stdout == "still\n"


def test_wrong_key_is_an_authentication_error_without_retries(sshd_hosts, make_inventory, tmp_path):
    (h1,) = sshd_hosts(1)
    other_key = tmp_path / "other_key"
    keygen(other_key)
    inv = load_inventory(make_inventory([h1], host_fields={"h1": {"key_file": str(other_key)}}))
    with pytest.raises(HostUnreachable, match=r"authentication as .* refused"):
        connect(inv.hosts["h1"]).run("true")
