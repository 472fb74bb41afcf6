"""A host over SSH: Fabric builds the client; we own host keys, channel exec and SFTP.

The transport opens lazily on first use, with a bounded retry on connect (never on host-key or
authentication errors). Commands run through Paramiko channels, so stdin is closed once sent and
stdout/stderr are read together (no deadlock on large stderr). Writes go to a temp file, created
0600 and exclusive, whose size and SHA-256 are checked before the rename, so a short copy never
replaces the target and a secret is never readable by others, not even its first byte.

A host whose sshd stops answering while TCP stays up (a stopped process, a dead NAT) would leave
every read waiting forever: Paramiko's own keepalive wants no answer. `_Keepalive` asks for one
every ``connect_timeout`` seconds; when none comes for KEEPALIVE_MISSES intervals it closes the
transport, which ends every blocked command and file operation with HostUnreachable naming why,
and the connection refuses further use for the rest of the run (no reconnect to a frozen host).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import posixpath
import re
import socket
import stat as stat_mod
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

import fabric
import paramiko
from paramiko import sftp_client

from ops.connection.base import (
    CHUNK,
    TIMEOUT_EXIT,
    Abandoned,
    Connection,
    FileStat,
    copy_stream,
    write_local_atomically,
)
from ops.errors import HostKeyError, HostUnreachable, SpecopsError, WriteFailed
from ops.hostkeys import changed_key_error, prepare_client
from ops.hosts import Host
from ops.redact import Redactor

# Paramiko logs each transport failure with its traceback; we report every one as HostUnreachable,
# so keep its records away from logging's last-resort stderr printer (a configured handler still sees them).
logging.getLogger("paramiko").addHandler(logging.NullHandler())

CONNECT_ATTEMPTS = 3
OPEN_BUDGET = 3  # connect timeouts one attempt may take in all: TCP connect, banner, key exchange and auth
_NO_HANDSHAKE = re.compile(r"protocol banner|Indecipherable protocol version|No existing session")
CONNECT_BACKOFF_S = (0.2, 0.5)
KEEPALIVE_MISSES = 2  # connect timeouts a keepalive may wait for its answer
KEEPALIVE_REQUEST = "keepalive@openssh.com"  # sshd answers it (with a refusal, which is an answer)
SIGNALLED_EXIT = 255  # what ssh(1) reports when the remote command dies without an exit status


def _temp_name(path: str) -> str:
    """A unique name beside `path`, so the final rename stays on one filesystem."""
    head, tail = posixpath.split(path)
    return posixpath.join(head, f".{tail}.specops-{uuid.uuid4().hex[:12]}.tmp")


class _Counted:
    """A writer that counts and hashes what passes through, so a remote copy can be checked."""

    def __init__(self, dest: IO[bytes]):
        self.dest = dest
        self.size = 0
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.size += len(data)
        self.digest.update(data)
        return self.dest.write(data)


class SshConnection(Connection):
    """A host over SSH: Fabric builds the client, we own host keys, exec and SFTP."""

    def __init__(self, host: Host, redactor: Redactor | None = None):
        if not host.address:
            raise SpecopsError(f"host '{host.name}' has no address (fix: set address: in the inventory)")
        super().__init__(host, redactor)
        self._lock = threading.RLock()
        self._fabric: fabric.Connection | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._keepalive: _Keepalive | None = None
        self._dead: str | None = None  # why the host stopped counting: no keepalive answer, abandoned

    # -- opening

    def _new_fabric(self) -> fabric.Connection:
        # lazy=True: no ~/.ssh/config and no invoke/fabric config files; the inventory is the truth.
        config = fabric.Config(lazy=True)
        connect_kwargs: dict[str, object] = {
            "banner_timeout": self.host.connect_timeout,
            "auth_timeout": self.host.connect_timeout,
        }
        if self.host.key_file:
            connect_kwargs["key_filename"] = self.host.key_file
            connect_kwargs["look_for_keys"] = False
        conn = fabric.Connection(
            self.host.address,
            user=self.host.user,
            port=self.host.port,
            config=config,
            connect_timeout=self.host.connect_timeout,
            connect_kwargs=connect_kwargs,
            inline_ssh_env=False,
        )
        prepare_client(conn.client, self.host)
        return conn

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._abandoned is not None:
                raise Abandoned(self.host.name, self._abandoned)
            if self._dead is not None:
                raise HostUnreachable(self.host.name, self._dead)
            if self._fabric is not None and self._fabric.is_connected:
                return self._fabric.transport
            self._drop()
            last: BaseException | None = None
            for attempt in range(CONNECT_ATTEMPTS):
                conn = self._new_fabric()
                try:
                    self._open(conn)
                except _NoHandshake:
                    conn.close()
                    raise HostUnreachable(
                        self.host.name,
                        f"{self.host.address}:{self.host.port} accepted the connection but no SSH handshake "
                        f"completed (no SSH banner; gave up within {OPEN_BUDGET * self.host.connect_timeout:g}s)",
                        f"check that port {self.host.port} is the host's sshd, not another service or a tarpit",
                    ) from None
                except HostKeyError:
                    conn.close()
                    raise
                except paramiko.BadHostKeyException as exc:
                    conn.close()
                    raise changed_key_error(self.host, exc) from None
                except paramiko.AuthenticationException as exc:
                    conn.close()
                    raise HostUnreachable(
                        self.host.name,
                        f"authentication as {conn.user} refused: {exc}",
                        "check user and key_file in the inventory and the host's authorized_keys",
                    ) from None
                except (OSError, EOFError, paramiko.SSHException) as exc:
                    conn.close()
                    last = exc
                    if attempt < CONNECT_ATTEMPTS - 1:
                        time.sleep(CONNECT_BACKOFF_S[min(attempt, len(CONNECT_BACKOFF_S) - 1)])
                    continue
                # Without this, Nagle plus delayed ACK add ~45 ms to every short command round trip.
                conn.transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._fabric = conn
                self._keepalive = _Keepalive(conn.transport, self.host.connect_timeout, self._frozen)
                self._keepalive.start()
                return conn.transport
            raise HostUnreachable(
                self.host.name,
                f"cannot connect to {self.host.address}:{self.host.port} after {CONNECT_ATTEMPTS} attempts: "
                f"{_describe(last)}",
                f"check that the host is up and sshd listens on port {self.host.port} "
                f"(connect_timeout is {self.host.connect_timeout:g}s)",
            )

    def _open(self, conn: fabric.Connection) -> None:
        """Open under a watchdog: a peer that never sends a banner, or trickles junk lines (a
        tarpit), cannot hold a run longer than OPEN_BUDGET connect timeouts, and is not retried."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            transport = conn.client.get_transport()
            if transport is not None:
                transport.close()

        watchdog = threading.Timer(OPEN_BUDGET * self.host.connect_timeout, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.open()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if expired.is_set() or _NO_HANDSHAKE.search(str(exc)):
                raise _NoHandshake() from None
            raise
        finally:
            watchdog.cancel()

    def _lost(self, what: str, exc: BaseException | None = None) -> SpecopsError:
        self._drop()
        if self._abandoned is not None:
            return Abandoned(self.host.name, f"{self._abandoned} (during {what})")
        if self._dead is not None:
            return HostUnreachable(self.host.name, f"{self._dead} (during {what})")
        cause = f"connection lost during {what}" + (f": {_describe(exc)}" if exc else "")
        return HostUnreachable(self.host.name, cause)

    def _frozen(self, silent_s: float) -> None:
        """The keepalive's verdict: the host is gone for this run (the transport is closed next)."""
        self._dead = (
            f"no answer from {self.host.address}:{self.host.port} for {silent_s:g}s while the "
            "connection stayed open (the host or its sshd froze, or the network dropped it)"
        )

    def _interrupt(self) -> None:
        """Close the transport without the lock: a frozen host may hold it in a blocked call."""
        conn = self._fabric
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    def _drop(self) -> None:
        with self._lock:
            if self._keepalive is not None:
                self._keepalive.stop.set()
                self._keepalive = None
            if self._sftp is not None:
                with contextlib.suppress(Exception):
                    self._sftp.close()
                self._sftp = None
            if self._fabric is not None:
                with contextlib.suppress(Exception):
                    self._fabric.close()
                self._fabric = None

    def close(self) -> None:
        self._drop()

    # -- commands

    def _execute(self, command: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes]:
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=self.host.connect_timeout)
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self._lost("command start", exc) from None
        try:
            return self._collect(chan, transport, timeout)
        finally:
            chan.close()

    def _collect(
        self, chan: paramiko.Channel, transport: paramiko.Transport, timeout: float | None
    ) -> tuple[int, bytes, bytes]:
        """Read stdout here and stderr in a helper thread (both block on events, no polling)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = bytearray(), bytearray()

        def drain_stderr() -> None:
            while True:
                try:
                    data = chan.recv_stderr(CHUNK)
                except TimeoutError:  # the shared channel timeout is set for stdout's sake
                    continue
                if not data:
                    return
                err.extend(data)

        reader = threading.Thread(target=drain_stderr, name=f"stderr-{self.host.name}", daemon=True)
        reader.start()
        timed_out = False
        while True:
            chan.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
            try:
                data = chan.recv(CHUNK)
            except TimeoutError:
                timed_out = True
                break
            if not data:
                break
            out.extend(data)
        if not timed_out:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            timed_out = not chan.status_event.wait(remaining)
        if timed_out:
            chan.close()
            reader.join()
            assert timeout is not None
            return TIMEOUT_EXIT, bytes(out), bytes(err) + self._timeout_note(timeout)
        reader.join()
        if chan.exit_status != -1:
            return chan.exit_status, bytes(out), bytes(err)
        # Closed without a status: the command died of a signal, or the transport is going down
        # (Paramiko closes the channels just before it marks the transport inactive).
        if self._transport_dies(transport):
            raise self._lost("a command")
        return (
            SIGNALLED_EXIT,
            bytes(out),
            bytes(err) + b"\n[specops] the command ended without an exit status (killed by a signal?)\n",
        )

    @staticmethod
    def _transport_dies(transport: paramiko.Transport, wait_s: float = 0.5) -> bool:
        deadline = time.monotonic() + wait_s
        while transport.is_active():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    # -- files

    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            transport = self._transport()
            if self._sftp is None:
                try:
                    self._sftp = paramiko.SFTPClient.from_transport(transport)
                except (OSError, EOFError, paramiko.SSHException) as exc:
                    raise self._lost("sftp start", exc) from None
                if self._sftp is None:
                    raise self._lost("sftp start")
            return self._sftp

    @contextlib.contextmanager
    def _sftp_op(self, what: str):
        """Turn transport failures into HostUnreachable; file errors (ENOENT, EACCES) pass through."""
        sftp = self._sftp_client()
        try:
            yield sftp
        except OSError as exc:
            if exc.errno is None and not (self._fabric and self._fabric.is_connected):
                raise self._lost(what, exc) from None
            raise
        except (EOFError, paramiko.SSHException) as exc:
            raise self._lost(what, exc) from None

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        self._check_range(offset, length)
        with self._sftp_op(f"read of {path}") as sftp, sftp.open(path, "rb") as fh:
            fh.seek(offset)
            if length is None:
                fh.prefetch()  # pipelined requests from `offset` to the end
                return fh.read()
            return fh.read(length)

    def _atomic(
        self, path: str, write: Callable[[IO[bytes]], object], mode: int | None, default_mode: int
    ) -> None:
        """Pipelined SFTP write, verified by size and SHA-256 read back before the rename.

        Paramiko drops the status of the last pipelined writes (a full disk answers them with a
        bare "Failure"), so the temp file is proved complete before it may replace `path`.
        """
        tmp = _temp_name(path)
        with self._sftp_op(f"write of {path}") as sftp:
            if mode is None:
                try:
                    mode = stat_mod.S_IMODE(sftp.stat(path).st_mode)
                except FileNotFoundError:
                    mode = default_mode
            try:
                try:
                    with _create_private(sftp, tmp) as fh:
                        fh.set_pipelined(True)
                        sent = _Counted(fh)
                        write(sent)  # type: ignore[arg-type]
                except OSError as exc:
                    if exc.errno is not None or not self._fabric or not self._fabric.is_connected:
                        raise
                    raise self._write_failed(
                        path, f"the host refused a write ('{exc}'; is its disk full?)"
                    ) from None
                self._verify(sftp, path, tmp, sent)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, path)
            except BaseException:
                with contextlib.suppress(Exception):
                    sftp.remove(tmp)
                raise

    def _verify(self, sftp: paramiko.SFTPClient, path: str, tmp: str, sent: _Counted) -> None:
        kept = sftp.stat(tmp).st_size or 0
        if kept != sent.size:
            raise self._write_failed(path, f"the host kept {kept} of {sent.size} bytes (is its disk full?)")
        digest = hashlib.sha256()
        with sftp.open(tmp, "rb") as fh:
            fh.prefetch()
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
        if digest.digest() != sent.digest.digest():
            raise self._write_failed(path, "the bytes read back differ from the bytes sent")

    def _write_failed(self, path: str, why: str) -> WriteFailed:
        folder = posixpath.dirname(path) or "."
        return WriteFailed(
            self.host.name,
            path,
            why,
            f"free space on the host (df -h {folder}) or check who may write there, then run again",
        )

    def get_file(self, remote_path: str, local_path: str | Path) -> None:
        with self._sftp_op(f"read of {remote_path}") as sftp, sftp.open(remote_path, "rb") as source:
            source.prefetch()
            write_local_atomically(Path(local_path), lambda fh: copy_stream(source, fh))

    def stat(self, path: str) -> FileStat | None:
        with self._sftp_op(f"stat of {path}") as sftp:
            try:
                st = sftp.stat(path)
            except FileNotFoundError:
                return None
        return FileStat(
            size=st.st_size or 0,
            mode=stat_mod.S_IMODE(st.st_mode or 0),
            is_dir=stat_mod.S_ISDIR(st.st_mode or 0),
            is_file=stat_mod.S_ISREG(st.st_mode or 0),
        )

    def listdir(self, path: str) -> list[str]:
        with self._sftp_op(f"listing of {path}") as sftp:
            return sorted(sftp.listdir(path))

    def realpath(self, path: str) -> str:
        with self._sftp_op(f"realpath of {path}") as sftp:
            return sftp.normalize(path)  # the server's realpath(3): every link resolved


class _NoHandshake(Exception):
    """The peer accepted TCP but never completed an SSH handshake in time."""


def _create_private(sftp: paramiko.SFTPClient, path: str) -> paramiko.SFTPFile:
    """A new file open for writing, created with mode 0600 by the server's open(2) (Paramiko's
    ``open`` sends no mode, so the file would be 0644 until chmod) and exclusively (never an
    existing file or a link someone planted)."""
    attrs = paramiko.SFTPAttributes()
    attrs.st_mode = 0o600
    flags = sftp_client.SFTP_FLAG_WRITE | sftp_client.SFTP_FLAG_CREATE | sftp_client.SFTP_FLAG_EXCL
    kind, msg = sftp._request(sftp_client.CMD_OPEN, path, flags, attrs)
    if kind != sftp_client.CMD_HANDLE:
        raise paramiko.SFTPError("Expected handle")
    return paramiko.SFTPFile(sftp, msg.get_binary(), "wb")


class _Keepalive(threading.Thread):
    """Every ``interval`` seconds a keepalive that wants an answer; when none has come after
    KEEPALIVE_MISSES more intervals, ``frozen`` records why and the transport is closed."""

    def __init__(self, transport: paramiko.Transport, interval: float, frozen: Callable[[float], None]):
        super().__init__(name="keepalive", daemon=True)
        self.transport, self.interval, self.frozen = transport, interval, frozen
        self.stop = threading.Event()

    def run(self) -> None:
        limit = KEEPALIVE_MISSES * self.interval
        while not self.stop.wait(self.interval) and self.transport.is_active():
            answered = threading.Event()
            threading.Thread(target=self._ask, args=(answered,), name="keepalive-ask", daemon=True).start()
            if not answered.wait(limit) and not self.stop.is_set():
                self.frozen(self.interval + limit)
                self.transport.close()
                return

    def _ask(self, answered: threading.Event) -> None:
        """Blocks until the answer (or the transport's end): hence its own thread."""
        with contextlib.suppress(Exception):
            self.transport.global_request(KEEPALIVE_REQUEST, wait=True)
        answered.set()


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = {os.strerror(e.errno) if e.errno else str(e) for e in exc.errors.values()}
        return ", ".join(sorted(reasons))
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text
