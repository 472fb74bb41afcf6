"""Host-key policy against real sshd daemons: strict refuses unknown keys, accept-new records them,
a changed key is refused under every policy."""

from __future__ import annotations

import re
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from ops.connection import connect
from ops.errors import HostKeyError
from ops.inventory import load_inventory


def known_hosts_of(inventory: Path) -> Path:
    return inventory.parent / "known_hosts"


def test_known_key_connects_under_strict(sshd_hosts, make_inventory):
    (h1,) = sshd_hosts(1)
    with connect(load_inventory(make_inventory([h1])).hosts["h1"]) as conn:
        assert conn.run("echo ok").stdout == "ok\n"


def test_unknown_key_is_refused_under_strict_with_the_command_that_accepts_it(sshd_hosts, make_inventory):
    (h1,) = sshd_hosts(1)
    path = make_inventory([h1], known=False)
    host = load_inventory(path).hosts["h1"]
    with pytest.raises(HostKeyError) as exc:
        connect(host).run("true")
    message = str(exc.value)
    assert message.startswith(f"host 'h1': unknown host key for [127.0.0.2]:{h1.port} (ssh-ed25519 SHA256:")
    assert "host_key_policy: accept-new" in message and "\n" not in message
    assert known_hosts_of(path).read_text() == ""  # nothing was trusted
    # The fix the message gives works as written.
    command = re.search(r"`(ssh-keyscan [^`]*)`", message).group(1)
    assert command == f"ssh-keyscan -p {h1.port} -t ed25519 127.0.0.2 >> {known_hosts_of(path)}"
    subprocess.run(command, shell=True, check=True, capture_output=True)
    with connect(host) as conn:
        assert conn.run("echo trusted").stdout == "trusted\n"


def test_fingerprint_in_the_message_is_the_one_ssh_keygen_prints(sshd_hosts, make_inventory):
    (h1,) = sshd_hosts(1)
    host = load_inventory(make_inventory([h1], known=False)).hosts["h1"]
    with pytest.raises(HostKeyError) as exc:
        connect(host).run("true")
    listed = subprocess.run(
        ["ssh-keygen", "-lf", f"{h1.host_key_path}.pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert listed.startswith("SHA256:") and listed in str(exc.value)


def test_accept_new_records_the_key_and_the_next_connect_trusts_it(sshd_hosts, make_inventory):
    hosts = sshd_hosts(3)
    path = make_inventory(hosts, host_key_policy="accept-new", known=False)
    inv = load_inventory(path)

    def first_contact(name: str) -> str:
        with connect(inv.hosts[name]) as conn:
            return conn.run("echo hello").stdout

    with ThreadPoolExecutor(3) as pool:  # concurrent appends to one known_hosts file
        assert list(pool.map(first_contact, ["h1", "h2", "h3"])) == ["hello\n"] * 3
    recorded = sorted(known_hosts_of(path).read_text().splitlines())
    assert recorded == sorted(h.known_hosts_line for h in hosts)
    # Now the same hosts pass under strict, from the recorded file alone.
    strict = yaml.safe_load(path.read_text())
    strict["defaults"]["host_key_policy"] = "strict"
    path.write_text(yaml.safe_dump(strict))
    with connect(load_inventory(path).hosts["h2"]) as conn:
        assert conn.run("echo again").stdout == "again\n"
    assert len(known_hosts_of(path).read_text().splitlines()) == 3  # nothing added twice


def test_accept_new_creates_a_missing_project_file_private(sshd_hosts, make_inventory, tmp_path):
    (h1,) = sshd_hosts(1)
    target = tmp_path / "fresh" / "dir" / "known_hosts"
    path = make_inventory([h1], host_key_policy="accept-new", defaults={"known_hosts": [str(target)]})
    with connect(load_inventory(path).hosts["h1"]) as conn:
        assert conn.run("true").ok
    assert target.read_text() == h1.known_hosts_line + "\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
def test_changed_key_is_refused_under_every_policy(sshd_hosts, make_inventory, policy):
    (h1,) = sshd_hosts(1)
    path = make_inventory([h1], host_key_policy=policy)
    before = known_hosts_of(path).read_text()
    host = load_inventory(path).hosts["h1"]
    with connect(host) as conn:
        assert conn.run("true").ok
    h1.rekey()
    with pytest.raises(HostKeyError) as exc:
        connect(host).run("true")
    message = str(exc.value)
    assert f"host key for [127.0.0.2]:{h1.port} CHANGED" in message
    assert "ssh-keygen -R" in message and "\n" not in message
    assert known_hosts_of(path).read_text() == before  # the old key stays; nothing new was trusted


def test_hashed_known_hosts_entries_are_understood(sshd_hosts, make_inventory):
    (h1,) = sshd_hosts(1)
    path = make_inventory([h1])
    subprocess.run(["ssh-keygen", "-H", "-f", str(known_hosts_of(path))], check=True, capture_output=True)
    assert known_hosts_of(path).read_text().startswith("|1|")
    with connect(load_inventory(path).hosts["h1"]) as conn:
        assert conn.run("echo hashed").stdout == "hashed\n"


def test_known_hosts_files_are_all_consulted(sshd_hosts, make_inventory, tmp_path):
    h1, h2 = sshd_hosts(2)
    first, second = tmp_path / "kh1", tmp_path / "kh2"
    first.write_text(h1.known_hosts_line + "\n")
    second.write_text(h2.known_hosts_line + "\n")
    path = make_inventory([h1, h2], defaults={"known_hosts": [str(first), str(second)]})
    inv = load_inventory(path)
    for name in ("h1", "h2"):
        with connect(inv.hosts[name]) as conn:
            assert conn.run("true").ok
