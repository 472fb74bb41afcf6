"""One interface over SSH hosts (Fabric/Paramiko) and the local machine (subprocess).

Steps talk to a `Connection` only: `run` a shell command, ranged `read_bytes`, atomic
`write_bytes`/`put_file`, `get_file`, `stat`, `listdir`, `realpath`. Both backends share the
behaviour that steps rely on:

- `run` never raises for a non-zero exit; a transport failure raises `HostUnreachable` (host
  name and cause on one line); a timeout returns exit code 124 (as coreutils `timeout` does):
  locally the process group is killed, over SSH the channel is closed (the remote command then
  dies on its next write; wrap it in `timeout` on the host when it must die at once). A command
  given no timeout gets the connection's `default_timeout` (the runner sets the step's).
- An SSH host that stops answering while TCP stays up is dropped by a keepalive that expects an
  answer (3 × `connect_timeout` of silence): every blocked call ends with `HostUnreachable`.
  `abandon(reason)` (a second Ctrl-C, from another thread) ends what runs and refuses the rest.
- Every command, stdout and stderr string returned or logged goes through the `Redactor`, after
  the host's resolvable secrets were registered with it.
- ``run(..., sudo=True)`` goes through sudo only when the host says ``sudo: true`` (otherwise the
  connecting user is trusted to have the rights, e.g. root or a user-owned base). The password
  never touches argv: ``sudo -k -S -p ''`` reads the host's ``sudo_password`` secret from stdin,
  and without that secret ``sudo -n`` fails at once instead of waiting for a prompt.
- Writes are atomic: a temp file in the target's directory, then a rename; over SSH the temp
  file's size and SHA-256 are checked first, and a short or corrupt copy raises `WriteFailed`
  with the target untouched (a full disk must never replace a file by a short one). With mode None a
  replaced file keeps its mode; a new one gets the source file's mode (put) or 0644 (write).
- Paths that are not absolute are relative to the login directory on both backends.

The SSH side opens lazily on first use, with a bounded retry on connect (never on host-key or
authentication errors), and executes through Paramiko channels so stdin is closed once sent
and stdout/stderr are read together (no deadlock on large stderr).
"""

from __future__ import annotations

from ops.connection.base import CommandResult, Connection, FileStat
from ops.connection.local import LocalConnection
from ops.connection.ssh import SshConnection
from ops.hosts import Host
from ops.redact import Redactor

__all__ = ["CommandResult", "Connection", "FileStat", "connect"]


def connect(host: Host, *, redactor: Redactor | None = None) -> Connection:
    """A connection for `host`; nothing is opened until the first use."""
    if host.connection == "local":
        return LocalConnection(host, redactor)
    return SshConnection(host, redactor)
