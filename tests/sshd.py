"""pytest plugin: real OpenSSH daemons on 127.0.0.2, 127.0.0.3, ... for end-to-end tests.

Each `SshdHost` has its own ed25519 host key, sshd_config, authorized_keys (the session's client
key), base directory and log, and runs ``sshd -D -e`` in the foreground as the current user (root
in CI; an unprivileged user works too, logging in as itself). Daemons of one `sshd_hosts(n)` call
start concurrently and are ready when their port accepts; teardown kills each daemon with every
session process it forked, so `stop()` really takes a host down mid-run.

Sessions get ``SHLVL=1`` so a login shell that is bash does not source the user's ~/.bashrc (bash
does that for commands run by sshd when SHLVL < 2): tests must not depend on the developer's shell
set-up (a pyenv init there costs 0.2 s per command, and a session killed while it rehashed leaves
a lock that stalls every later command for a minute). `env` adds variables (e.g. PATH); sshd keeps
only the first SetEnv line, so they all go on that one line.

`freeze()` stops (SIGSTOP) a daemon and its sessions so the host hangs with TCP up; `thaw()` resumes.

Fixtures:
    sshd_hosts(n, env=None, extra_config=()) -> list[SshdHost]   (h1..hn on 127.0.0.2..)
    make_inventory(hosts, **options) -> Path            (inventory.yaml + a pre-filled known_hosts)
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
READY_TIMEOUT_S = 10.0


def keygen(path: Path) -> None:
    """A fresh passphrase-less ed25519 key pair at `path` (and `path`.pub)."""
    for old in (path, path.with_name(path.name + ".pub")):
        old.unlink(missing_ok=True)
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (sshd's per-connection children call setsid, so no killpg)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class SshdHost:
    """One sshd daemon on a loopback address; see the module docstring."""

    def __init__(
        self,
        name: str,
        address: str,
        root: Path,
        client_key: Path,
        env: Mapping[str, str] | None = None,
        extra_config: Sequence[str] = (),
    ):
        self.name = name
        self.address = address
        self.dir = root
        self.dir.mkdir(parents=True, exist_ok=True)
        self.base = root / "base"
        self.base.mkdir(exist_ok=True)
        self.host_key_path = root / "ssh_host_ed25519_key"
        self.client_key = client_key
        self.user = getpass.getuser()
        self.port = _free_port(address)
        self.env = {"SHLVL": "1", **(env or {})}
        self.extra_config = list(extra_config)
        self.log_path = root / "sshd.log"
        self._proc: subprocess.Popen | None = None
        keygen(self.host_key_path)
        (root / "authorized_keys").write_text(client_key.with_name(client_key.name + ".pub").read_text())

    @property
    def known_hosts_line(self) -> str:
        kind, b64 = self.host_key_path.with_name(self.host_key_path.name + ".pub").read_text().split()[:2]
        return f"[{self.address}]:{self.port} {kind} {b64}"

    def host_entry(self) -> dict[str, Any]:
        """This host as an inventory.yaml host mapping."""
        return {
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "key_file": str(self.client_key),
            "base": str(self.base),
            "connect_timeout": 3,
        }

    def _write_config(self) -> Path:
        config = self.dir / "sshd_config"
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.address}",
            f"HostKey {self.host_key_path}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            f"PidFile {self.dir / 'sshd.pid'}",
            "StrictModes no",
            "UsePAM no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UseDNS no",
            "MaxStartups 64",
            "MaxSessions 64",
            "LogLevel ERROR",
            "Subsystem sftp internal-sftp",
            "SetEnv " + " ".join(f'{k}="{v}"' for k, v in self.env.items()),
            *self.extra_config,
        ]
        config.write_text("\n".join(lines) + "\n")
        return config

    def _spawn(self) -> None:
        config = self._write_config()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"sshd for {self.name} exited with {self._proc.returncode}: "
                    f"{self.log_path.read_text()[-2000:]}"
                )
            try:
                with socket.create_connection((self.address, self.port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sshd for {self.name} not listening on {self.address}:{self.port} "
                        f"after {READY_TIMEOUT_S}s: {self.log_path.read_text()[-2000:]}"
                    ) from None
                time.sleep(0.01)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if not self.running:
            self._spawn()
            self._wait_ready()

    def stop(self) -> None:
        """Kill the daemon and every session it serves: the host is down."""
        if self._proc is None:
            return
        victims = [*_descendants(self._proc.pid), self._proc.pid]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._proc.wait()
        self._proc = None
        self._wait_refused()

    def _wait_refused(self) -> None:
        """Return once the port refuses connections. The kernel completes `_wait_ready`'s probe
        before sshd accepts it, so on a busy machine the daemon may fork that connection's child
        after `_descendants` looked. The child holds the listening socket until it closes it, and
        a connection made meanwhile is accepted and then reset."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                with socket.create_connection((self.address, self.port), timeout=0.2):
                    pass
            except ConnectionRefusedError:
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.address}:{self.port} still accepts {READY_TIMEOUT_S}s after sshd was killed"
                )
            time.sleep(0.01)

    def freeze(self) -> None:
        """SIGSTOP the daemon and every session it serves: TCP stays up, nothing answers (a stopped
        sshd, a dead NAT). `thaw` undoes it; teardown's SIGKILL works on stopped processes too."""
        assert self._proc is not None
        for pid in [self._proc.pid, *_descendants(self._proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._proc is not None
        for pid in [self._proc.pid, *_descendants(self._proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def rekey(self) -> None:
        """Give the host a new host key (as a reinstalled or impersonated machine would have)."""
        was_running = self.running
        self.stop()
        keygen(self.host_key_path)
        if was_running:
            self.start()


def start_all(hosts: Sequence[SshdHost]) -> None:
    """Start daemons concurrently, then wait for each: startup costs one daemon, not n.

    A first start may lose its port to another process between `_free_port` and sshd's bind
    (parallel test runs); it then retries on a fresh port, which is still unknown to any test.
    """
    for host in hosts:
        host._spawn()
    for host in hosts:
        for attempt in range(3):
            try:
                host._wait_ready()
                break
            except RuntimeError:
                if attempt == 2 or "Address already in use" not in host.log_path.read_text():
                    raise
                host.port = _free_port(host.address)
                host._spawn()


@pytest.fixture(scope="session")
def sshd_client_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ed25519 client key for the whole session, authorized on every test daemon."""
    if not os.path.exists(SSHD):
        pytest.fail(f"sshd not found at {SSHD}: install openssh-server (the Makefile's test target does)")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
    key = tmp_path_factory.mktemp("sshd-client") / "id_ed25519"
    keygen(key)
    return key


@pytest.fixture
def sshd_hosts(tmp_path: Path, sshd_client_key: Path) -> Iterator[Callable[..., list[SshdHost]]]:
    """Factory: sshd_hosts(3) starts h1..h3 on 127.0.0.2..4 (a second call continues the numbering)."""
    started: list[SshdHost] = []

    def factory(
        count: int, env: Mapping[str, str] | None = None, extra_config: Sequence[str] = ()
    ) -> list[SshdHost]:
        first = len(started)
        hosts = [
            SshdHost(
                f"h{i + 1}",
                f"127.0.0.{i + 2}",
                tmp_path / "sshd" / f"h{i + 1}",
                sshd_client_key,
                env,
                extra_config,
            )
            for i in range(first, first + count)
        ]
        started.extend(hosts)
        start_all(hosts)
        return hosts

    yield factory
    for host in started:
        host.stop()


@pytest.fixture
def make_inventory(tmp_path: Path) -> Callable[..., Path]:
    """Factory: write inventory.yaml for SshdHosts, with a project known_hosts holding their keys.

    Options: host_key_policy ("strict"), known (True: pre-fill known_hosts), defaults / groups /
    host_vars (name -> vars) / host_fields (name -> extra fields) to merge in, local (add the
    local demo host with base under tmp_path), name (file name).
    """
    counter = iter(range(1, 1000))

    def factory(
        hosts: Sequence[SshdHost],
        *,
        host_key_policy: str = "strict",
        known: bool = True,
        defaults: dict[str, Any] | None = None,
        groups: dict[str, Any] | None = None,
        host_vars: dict[str, dict[str, Any]] | None = None,
        host_fields: dict[str, dict[str, Any]] | None = None,
        local: bool = False,
        name: str | None = None,
    ) -> Path:
        n = next(counter)
        folder = tmp_path / f"inventory{n}"
        folder.mkdir()
        known_hosts = folder / "known_hosts"
        known_hosts.write_text("".join(h.known_hosts_line + "\n" for h in hosts) if known else "")
        entries: dict[str, Any] = {}
        for host in hosts:
            entry = host.host_entry()
            entry.update((host_fields or {}).get(host.name, {}))
            if host_vars and host.name in host_vars:
                entry["vars"] = host_vars[host.name]
            entries[host.name] = entry
        if local:
            entries["local"] = {
                "connection": "local",
                "base": str(tmp_path / "local-base"),
                "vars": {"profile": "cpu"},
            }
        data: dict[str, Any] = {
            "defaults": {
                "host_key_policy": host_key_policy,
                "known_hosts": [str(known_hosts)],
                **(defaults or {}),
            }
        }
        if groups:
            data["groups"] = groups
        data["hosts"] = entries
        path = folder / (name or "inventory.yaml")
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return factory
