"""Host-key policy for SSH hosts: known_hosts files, ``strict`` and ``accept-new``.

Fabric sets Paramiko's AutoAddPolicy and never loads known_hosts (FIELD-NOTES), which would trust
any machine that answers. `prepare_client` loads the host's known_hosts files into the client and
installs `KnownHostsPolicy` BEFORE the client opens:

- a key that is known and matches: accepted;
- a key that differs from a recorded one: Paramiko raises BadHostKeyException, which we turn into
  `HostKeyError` under every policy (see `changed_key_error`);
- an unknown key: refused under ``strict`` with the exact ``ssh-keyscan`` line to accept it, and
  recorded in the first writable known_hosts file of the host under ``accept-new``.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
from pathlib import Path

import paramiko

from ops.errors import HostKeyError
from ops.hosts import Host
from ops.shell import quote

_KEYSCAN_TYPES = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "rsa-sha2-256": "rsa", "rsa-sha2-512": "rsa"}


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint, the form `ssh-keygen -lf` and `ssh` print."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    """The host pattern OpenSSH and Paramiko use: bare for port 22, ``[addr]:port`` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


def keyscan_command(host: Host, key: paramiko.PKey, target: str) -> str:
    """The command a user runs to record the key after checking its fingerprint."""
    kind = _KEYSCAN_TYPES.get(
        key.get_name(), "ecdsa" if key.get_name().startswith("ecdsa") else key.get_name()
    )
    port = f"-p {host.port} " if host.port != 22 else ""
    return f"ssh-keyscan {port}-t {kind} {quote(host.address or '')} >> {quote(target)}"


def writable_known_hosts(host: Host) -> str | None:
    """The first known_hosts file of the host that exists writable or can be created."""
    for name in host.known_hosts:
        path = Path(name)
        if path.exists():
            if os.access(path, os.W_OK):
                return name
            continue
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if os.access(parent, os.W_OK):
            return name
    return None


def load_known_hosts(client: paramiko.SSHClient, host: Host) -> None:
    """Load every existing known_hosts file of the host (hashed entries included)."""
    keys = client.get_host_keys()
    for name in host.known_hosts:
        if os.path.isfile(name):
            keys.load(name)


def record_key(path: str, hostname: str, key: paramiko.PKey) -> None:
    """Append one known_hosts line, under a file lock (several hosts may be added in parallel)."""
    target = Path(path)
    if not target.parent.exists():
        target.parent.mkdir(parents=True, mode=0o700)
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Decides about keys that no known_hosts file of the host mentions."""

    def __init__(self, host: Host):
        self.host = host

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        target = writable_known_hosts(self.host)
        if self.host.host_key_policy == "accept-new" and target is not None:
            record_key(target, hostname, key)
            client.get_host_keys().add(hostname, key.get_name(), key)
            return
        files = ", ".join(self.host.known_hosts)
        message = f"unknown host key for {hostname} ({key.get_name()} {fingerprint(key)}), not in {files}"
        if self.host.host_key_policy == "accept-new":
            raise HostKeyError(
                self.host.name,
                message + "; no known_hosts file is writable",
                f"make one of them writable: {files}",
            )
        raise HostKeyError(
            self.host.name,
            message,
            f"check the fingerprint with the host's owner, then run "
            f"`{keyscan_command(self.host, key, target or self.host.known_hosts[0])}`, "
            f"or set host_key_policy: accept-new for host '{self.host.name}'",
        )


def prepare_client(client: paramiko.SSHClient, host: Host) -> None:
    """Install our known_hosts and policy on a client that has not opened yet."""
    load_known_hosts(client, host)
    client.set_missing_host_key_policy(KnownHostsPolicy(host))


def changed_key_error(host: Host, exc: paramiko.BadHostKeyException) -> HostKeyError:
    """A key that differs from the recorded one is refused under every policy."""
    name = known_hosts_name(host.address or exc.hostname, host.port)
    return HostKeyError(
        host.name,
        f"host key for {name} CHANGED: the host offers {exc.key.get_name()} {fingerprint(exc.key)}, "
        f"known_hosts has {exc.expected_key.get_name()} {fingerprint(exc.expected_key)}; refusing to "
        f"connect (this is what a man-in-the-middle looks like)",
        f"if the host was reinstalled on purpose, remove the old entry with "
        f"`ssh-keygen -R {quote(name)} -f FILE` for the file among {', '.join(host.known_hosts)} "
        f"that holds it, then reconnect",
    )
