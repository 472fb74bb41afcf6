"""Inventory: hosts, groups and their variables, read from ``inventory.yaml``.

Format (see docs/architecture.md, "Inventory and playbooks")::

    defaults:   {<host field>: ..., vars: {...}}               lowest precedence
    groups:     {NAME: {hosts: [h, ...], vars: {...}, <host field>: ...}}   applied in file order
    hosts:      {NAME: {<host field>: ..., vars: {...}}}        highest precedence

Top-level keys starting with ``x-`` are ignored (a place for YAML anchors to merge with ``<<``).
Host fields: address, port, user, key_file, connection (ssh | local), base, host_key_policy
(strict | accept-new), known_hosts (a path or a list), sudo, connect_timeout, secrets, vars.
Each field is taken from the last layer that sets it (defaults < groups in file order < host);
``vars`` and ``secrets`` merge key by key in the same order. A variable may not reuse a host-field
name (``port``, ``base``, ...): templates see both, so the clash is refused instead of guessed.

What the architecture's summary leaves out:
- ``known_hosts`` is the COMPLETE list of files a host's key is checked against (default
  ``[~/.ssh/known_hosts]``); relative paths are relative to the inventory file. ``accept-new``
  records a new key in the first listed file that is writable, so list a project file first to
  keep new keys out of ``~/.ssh``.
- ``Host`` has one extra field, ``secrets`` (name -> `SecretRef`), and `Host.resolve_secrets`.

A secret is a reference (``{env: VAR}`` or ``{file: PATH}``), never a value; `ops.hosts` holds the
resolved model (`Host`, `SecretRef`, `Inventory`) and says how secrets are resolved and redacted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.errors import InputFileError, did_you_mean
from ops.hosts import Host, Inventory, SecretRef
from ops.yamlfile import LineMap, LineSeq, load_yaml, plain, read_source

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASE = "/opt/specops"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_CONNECT_TIMEOUT = 10.0

_HOST_FIELDS = (
    "address",
    "port",
    "user",
    "key_file",
    "connection",
    "base",
    "host_key_policy",
    "known_hosts",
    "sudo",
    "connect_timeout",
    "secrets",
    "vars",
)
_TOP_KEYS = ("defaults", "groups", "hosts")
_GROUP_KEYS = ("hosts", *_HOST_FIELDS)
_RESERVED_VARS = frozenset(_HOST_FIELDS) | {"name", "groups"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Used when no inventory.yaml exists (an installed package): the same local demo host we ship.
EMBEDDED_INVENTORY = """\
hosts:
  local:
    connection: local
    base: ~/.cache/specops/demo
    vars:
      profile: cpu
      bench_matrix: bench-demo.yaml
      min_tau: 2
      acceptance: {prompts: ../demo_pair/held_out_prompts.jsonl}
"""


def load_inventory(path: str | Path | None = None) -> Inventory:
    """Read and validate an inventory; None means the repo-root inventory.yaml (or the embedded demo)."""
    if path is None:
        default = REPO_ROOT / "inventory.yaml"
        if not default.exists():
            return parse_inventory(EMBEDDED_INVENTORY, Path("<embedded inventory>"), base_dir=Path.cwd())
        path = default
    path = Path(path)
    return parse_inventory(
        read_source(path, "inventory", "pass an existing file with --inventory FILE"), path
    )


def parse_inventory(text: str, path: Path, base_dir: Path | None = None) -> Inventory:
    """Validate inventory text; `path` is only used in messages and to resolve relative paths."""
    data = load_yaml(text, path)
    return _Parser(path, base_dir or path.resolve().parent).inventory(data)


# ---------------------------------------------------------------- validation


@dataclass
class _Layer:
    """The fields one inventory section sets, each with the line it came from."""

    where: str
    fields: dict[str, tuple[Any, int]]


class _Parser:
    def __init__(self, path: Path, base_dir: Path):
        self.path = path
        self.base_dir = base_dir

    def error(self, line: int | None, message: str, hint: str | None = None) -> InputFileError:
        return InputFileError(self.path, line, message, hint)

    def mapping(self, value: Any, line: int, what: str) -> LineMap:
        if value is None:
            empty = LineMap()
            empty.line, empty.key_lines = line, {}
            return empty
        if not isinstance(value, LineMap):
            raise self.error(line, f"{what} must be a mapping, got {_kind(value)}")
        for key in value:
            if not isinstance(key, str):
                raise self.error(value.key_lines[key], f"{what}: key {key!r} must be a string")
        return value

    def check_keys(
        self,
        m: LineMap,
        allowed: tuple[str, ...],
        what: str,
        extra_hint: str = "",
        free_prefix: str | None = None,
    ) -> None:
        for key in m:
            if key not in allowed and not (free_prefix and key.startswith(free_prefix)):
                hint = did_you_mean(key, allowed) or f"allowed keys: {', '.join(allowed)}"
                raise self.error(m.key_lines[key], f"unknown key '{key}' in {what}", hint + extra_hint)

    def name(self, name: str, line: int, what: str) -> None:
        # control characters: a line break in a name would add lines to the env file's header
        if not name or any(c in name for c in ", \t/") or not name.isprintable():
            raise self.error(
                line,
                f"{what} name {name!r} must be non-empty without commas, spaces, '/' or control characters",
            )

    def inventory(self, data: Any) -> Inventory:
        top = self.mapping(data, 1, "the inventory")
        # "x-..." keys are free, as in compose files: a place for YAML anchors (<<: *common).
        self.check_keys(top, _TOP_KEYS, "the inventory's top level", free_prefix="x-")
        defaults_map = self.mapping(top.get("defaults"), top.key_lines.get("defaults", 1), "defaults")
        self.check_keys(defaults_map, _HOST_FIELDS, "defaults", "; variables go under defaults.vars")
        defaults = self.layer(defaults_map, "defaults")

        hosts_map = self.mapping(top.get("hosts"), top.key_lines.get("hosts", 1), "hosts")
        if not hosts_map:
            raise self.error(
                hosts_map.line or None,
                "the inventory defines no hosts",
                "add a 'hosts:' mapping, e.g. hosts: {local: {connection: local}}",
            )
        host_layers: dict[str, tuple[_Layer, int]] = {}
        for name, body in hosts_map.items():
            line = hosts_map.key_lines[name]
            self.name(name, line, "host")
            body_map = self.mapping(body, line, f"host '{name}'")
            self.check_keys(body_map, _HOST_FIELDS, f"host '{name}'", "; variables go under vars:")
            host_layers[name] = (self.layer(body_map, f"host '{name}'"), line)

        groups_map = self.mapping(top.get("groups"), top.key_lines.get("groups", 1), "groups")
        groups: dict[str, list[str]] = {}
        group_layers: dict[str, _Layer] = {}
        for gname, body in groups_map.items():
            line = groups_map.key_lines[gname]
            self.name(gname, line, "group")
            if gname in host_layers:
                raise self.error(
                    line,
                    f"group '{gname}' has the same name as a host",
                    "rename the group: --limit could not tell them apart",
                )
            body_map = self.mapping(body, line, f"group '{gname}'")
            self.check_keys(body_map, _GROUP_KEYS, f"group '{gname}'", "; variables go under vars:")
            groups[gname] = self.members(body_map, gname, host_layers)
            group_layers[gname] = self.layer(body_map, f"group '{gname}'", skip=("hosts",))

        hosts = {}
        for name, (layer, line) in host_layers.items():
            member_of = tuple(g for g, members in groups.items() if name in members)
            layers = [defaults, *(group_layers[g] for g in member_of), layer]
            hosts[name] = self.host(name, line, member_of, layers)
        return Inventory(path=self.path, hosts=hosts, groups=groups)

    def members(self, body: LineMap, gname: str, host_layers: dict[str, Any]) -> list[str]:
        if "hosts" not in body or body["hosts"] is None:
            return []
        value, line = body["hosts"], body.key_lines["hosts"]
        if not isinstance(value, LineSeq):
            raise self.error(line, f"group '{gname}': hosts must be a list of host names, got {_kind(value)}")
        members: list[str] = []
        for item, item_line in zip(value, value.item_lines, strict=True):
            if not isinstance(item, str):
                raise self.error(item_line, f"group '{gname}': host entry {item!r} must be a host name")
            if item not in host_layers:
                raise self.error(
                    item_line,
                    f"group '{gname}' names host '{item}', which is not under hosts",
                    did_you_mean(item, list(host_layers)) or f"add '{item}' under hosts: or remove it",
                )
            if item not in members:
                members.append(item)
        return members

    def layer(self, m: LineMap, where: str, skip: tuple[str, ...] = ()) -> _Layer:
        """Type-check one section's fields; values are normalised, lines kept for later errors."""
        fields: dict[str, tuple[Any, int]] = {}
        for key, value in m.items():
            if key in skip:
                continue
            line = m.key_lines[key]
            fields[key] = (self.field(key, value, line, where), line)
        return _Layer(where, fields)

    def field(self, key: str, value: Any, line: int, where: str) -> Any:
        what = f"'{key}' in {where}"
        if key in ("address", "user", "key_file", "base"):
            if not isinstance(value, str) or not value.strip():
                raise self.error(line, f"{what} must be a non-empty string, got {_kind(value)}")
            return self.local_path(value) if key == "key_file" else value
        if key == "port":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
                raise self.error(line, f"{what} must be an integer port 1-65535, got {value!r}")
            return int(value)
        if key == "connection":
            return self.choice(value, ("ssh", "local"), line, what)
        if key == "host_key_policy":
            return self.choice(value, ("strict", "accept-new"), line, what)
        if key == "sudo":
            if not isinstance(value, bool):
                raise self.error(line, f"{what} must be true or false, got {value!r}")
            return value
        if key == "connect_timeout":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise self.error(line, f"{what} must be a positive number of seconds, got {value!r}")
            return float(value)
        if key == "known_hosts":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not items or not all(isinstance(i, str) and i for i in items):
                raise self.error(line, f"{what} must be a path or a list of paths, got {value!r}")
            return tuple(self.local_path(i) for i in items)
        if key == "vars":
            m = self.mapping(value, line, f"vars of {where}")
            for var in m:
                if var in _RESERVED_VARS:
                    raise self.error(
                        m.key_lines[var],
                        f"variable '{var}' in {where} clashes with the host field '{var}'",
                        f"set it as a host field ({var}: ...) or rename the variable",
                    )
            return plain(m)
        if key == "secrets":
            return self.secrets(value, line, where)
        raise AssertionError(f"unhandled field {key}")

    def secrets(self, value: Any, line: int, where: str) -> dict[str, SecretRef]:
        m = self.mapping(value, line, f"secrets of {where}")
        refs: dict[str, SecretRef] = {}
        for name, spec in m.items():
            sline = m.key_lines[name]
            origin = f"{self.path}:{sline}"
            if not isinstance(spec, LineMap) or len(spec) != 1 or next(iter(spec)) not in ("env", "file"):
                raise self.error(
                    sline,
                    f"secret '{name}' in {where} must be {{env: VAR}} or {{file: PATH}}",
                    "secret values never go in the inventory; reference an environment "
                    "variable or a 0600 file on the controller",
                )
            if not _ENV_NAME.fullmatch(name):
                raise self.error(
                    sline,
                    f"secret name {name!r} in {where} is not an identifier: it becomes a KEY= line of the "
                    "host's env file",
                    "use letters, digits and _ (not starting with a digit), e.g. HF_TOKEN",
                )
            kind, ref = next(iter(spec.items()))
            if not isinstance(ref, str) or not ref:
                raise self.error(sline, f"secret '{name}' in {where}: {kind} must be a non-empty string")
            if kind == "env":
                refs[name] = SecretRef(name, env=ref, file=None, origin=origin)
            else:
                refs[name] = SecretRef(name, env=None, file=self.local_path(ref), origin=origin)
        return refs

    def choice(self, value: Any, choices: tuple[str, ...], line: int, what: str) -> str:
        if value not in choices:
            hint = (
                did_you_mean(value, choices) if isinstance(value, str) else None
            ) or f"use one of: {', '.join(choices)}"
            raise self.error(line, f"{what} must be one of {', '.join(choices)}, got {value!r}", hint)
        return value

    def local_path(self, value: str) -> str:
        """A controller-side path: ~ expanded, relative paths taken from the inventory's folder."""
        p = Path(os.path.expanduser(value))
        return str(p if p.is_absolute() else self.base_dir / p)

    def host(self, name: str, line: int, groups: tuple[str, ...], layers: list[_Layer]) -> Host:
        merged: dict[str, tuple[Any, int]] = {}
        variables: dict[str, Any] = {}
        secrets: dict[str, SecretRef] = {}
        for layer in layers:
            for key, (value, vline) in layer.fields.items():
                if key == "vars":
                    variables.update(value)
                elif key == "secrets":
                    secrets.update(value)
                else:
                    merged[key] = (value, vline)

        def get(key: str, default: Any) -> Any:
            return merged[key][0] if key in merged else default

        connection = get("connection", "ssh")
        address = get("address", None)
        if connection == "ssh" and address is None:
            raise self.error(
                line,
                f"host '{name}' uses connection ssh but has no 'address'",
                "add address: <ip or hostname>, or set connection: local",
            )
        base = get("base", DEFAULT_BASE)
        if connection == "local":
            base = os.path.expanduser(base)
        if not base.startswith("/"):
            raise self.error(
                merged.get("base", (None, line))[1],
                f"'base' of host '{name}' must be an absolute path, got '{base}'",
                "use an absolute path such as /opt/specops (a remote ~ is not expanded)",
            )
        return Host(
            name=name,
            connection=connection,
            address=address,
            port=get("port", 22),
            user=get("user", None),
            key_file=get("key_file", None),
            base=base.rstrip("/") or "/",
            host_key_policy=get("host_key_policy", "strict"),
            known_hosts=get("known_hosts", (os.path.expanduser(DEFAULT_KNOWN_HOSTS),)),
            sudo=get("sudo", False),
            connect_timeout=get("connect_timeout", DEFAULT_CONNECT_TIMEOUT),
            vars=variables,
            groups=groups,
            secrets=secrets,
        )


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {
        dict: "a mapping",
        LineMap: "a mapping",
        list: "a list",
        LineSeq: "a list",
        str: f"'{value}'",
    }.get(type(value), repr(value))
