"""The inventory's data model: a `Host` with all layers merged, its `SecretRef`s, and the `Inventory`.

Secrets never appear in the inventory. A secret is a reference that is resolved on the controller
only when needed::

    secrets:
      HF_TOKEN: {env: HF_TOKEN}                         # from the controller's environment
      sudo_password: {file: ~/.config/specops/gpu1.sudo} # a local file that only its owner can read

A ``file`` secret must not be readable by group or others (``chmod 600``); its trailing newline is
dropped. `Host.resolve_secrets` returns the values and registers each with the given `Redactor`,
and every connection registers the host's resolvable secrets before it runs anything, so a value
is masked in all returned output even when the command that printed it did not use it. The
secret named ``sudo_password`` is what the connection feeds to ``sudo -S`` on stdin (never argv).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.errors import InputFileError, SpecopsError, did_you_mean
from ops.redact import Redactor

SUDO_PASSWORD = "sudo_password"


@dataclass(frozen=True)
class SecretRef:
    """Where a secret's value lives on the controller; never the value itself."""

    name: str
    env: str | None
    file: str | None
    origin: str  # "inventory.yaml:12", for error messages

    def _one_line(self, value: str, where: str) -> str:
        """Refuse a value with a line break: in a KEY=VALUE env file it would add lines of its own."""
        if "\n" in value or "\r" in value:
            raise SpecopsError(
                f"{self.origin}: secret '{self.name}' from {where} contains a line break, which "
                "could add lines to the host's env file (fix: store the value on one line)"
            )
        return value

    def resolve(self, host: str) -> str:
        if self.env is not None:
            value = os.environ.get(self.env)
            if not value:
                raise SpecopsError(
                    f"{self.origin}: host '{host}' needs secret '{self.name}' from the environment "
                    f"variable {self.env}, which is not set on the controller "
                    f"(fix: export {self.env}=... before running)"
                )
            return self._one_line(value, f"the environment variable {self.env}")
        assert self.file is not None  # parse guarantees one of env/file
        try:
            st = os.stat(self.file)
            if stat.S_IMODE(st.st_mode) & 0o077:
                raise SpecopsError(
                    f"{self.origin}: secret file {self.file} for '{self.name}' is readable by others "
                    f"(fix: chmod 600 {self.file})"
                )
            value = Path(self.file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise SpecopsError(
                f"{self.origin}: host '{host}' cannot read secret '{self.name}' from {self.file}: "
                f"{exc.strerror} (fix: create it with mode 0600)"
            ) from exc
        if not value:
            raise SpecopsError(f"{self.origin}: secret file {self.file} for '{self.name}' is empty")
        return self._one_line(value, f"the file {self.file}")


@dataclass(frozen=True)
class Host:
    """One machine as the controller sees it, all layers merged."""

    name: str
    connection: str
    address: str | None
    port: int
    user: str | None
    key_file: str | None
    base: str
    host_key_policy: str
    known_hosts: tuple[str, ...]
    sudo: bool
    connect_timeout: float
    vars: dict[str, Any]
    groups: tuple[str, ...]
    secrets: Mapping[str, SecretRef] = field(default_factory=dict)

    def template_vars(self) -> dict[str, Any]:
        """Variables for Jinja2: the host's vars plus its fields (never secret values)."""
        return {
            **self.vars,
            "name": self.name,
            "connection": self.connection,
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "key_file": self.key_file,
            "base": self.base,
            "host_key_policy": self.host_key_policy,
            "known_hosts": list(self.known_hosts),
            "sudo": self.sudo,
            "connect_timeout": self.connect_timeout,
            "groups": list(self.groups),
        }

    def resolve_secrets(self, redactor: Redactor | None = None, *, strict: bool = True) -> dict[str, str]:
        """Resolve the host's secrets on the controller and register them with `redactor`.

        strict=False skips secrets that cannot be resolved (a connection that only wants to
        redact what it can); strict=True raises the first failure.
        """
        values: dict[str, str] = {}
        for name, ref in self.secrets.items():
            try:
                value = ref.resolve(self.name)
            except SpecopsError:
                if strict:
                    raise
                continue
            if redactor is not None:
                try:
                    redactor.add(value)
                except ValueError as exc:
                    raise SpecopsError(f"{ref.origin}: secret '{name}' of host '{self.name}': {exc}") from exc
            values[name] = value
        return values


@dataclass
class Inventory:
    """All hosts (in file order) and groups of one inventory file."""

    path: Path
    hosts: dict[str, Host]
    groups: dict[str, list[str]]

    def select(self, limit: str | None) -> list[Host]:
        """Hosts named by ``--limit a,b`` (host or group names), in inventory order; None = all."""
        if limit is None:
            return list(self.hosts.values())
        tokens = [t.strip() for t in limit.split(",") if t.strip()]
        if not tokens:
            raise InputFileError(
                self.path, None, "--limit is empty", "name hosts or groups: --limit gpu1,blackwell"
            )
        wanted: set[str] = set()
        for token in tokens:
            if token in self.hosts:
                wanted.add(token)
            elif token in self.groups:
                wanted.update(self.groups[token])
            else:
                known = [*self.hosts, *self.groups]
                raise InputFileError(
                    self.path,
                    None,
                    f"--limit names '{token}', which is neither a host nor a group",
                    did_you_mean(token, known) or f"known hosts and groups: {', '.join(known)}",
                )
        return [host for name, host in self.hosts.items() if name in wanted]
