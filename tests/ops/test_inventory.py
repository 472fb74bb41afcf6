"""Inventory loading: precedence, --limit selection, and every validation error with file:line."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from ops.errors import InputFileError, SpecopsError
from ops.inventory import EMBEDDED_INVENTORY, REPO_ROOT, load_inventory, parse_inventory
from ops.redact import Redactor


def write(tmp_path: Path, text: str, name: str = "inventory.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


LAYERED = """
defaults:
  base: /srv/specops
  user: deploy
  connect_timeout: 7
  vars: {a: defaults, b: defaults, c: defaults, d: defaults}
groups:
  first:
    hosts: [gpu1, gpu2]
    user: ops
    vars: {b: first, c: first}
  second:
    hosts: [gpu1]
    port: 2200
    vars: {c: second}
hosts:
  gpu1:
    address: 10.0.0.5
    key_file: keys/id
    vars: {d: host}
  gpu2:
    address: 10.0.0.6
    user: root
    base: /data/specops
  cpu:
    connection: local
    base: ~/.cache/specops/t
"""


def test_precedence_defaults_groups_in_file_order_then_host(tmp_path):
    inv = load_inventory(write(tmp_path, LAYERED))
    gpu1, gpu2, cpu = inv.hosts["gpu1"], inv.hosts["gpu2"], inv.hosts["cpu"]
    assert gpu1.vars == {"a": "defaults", "b": "first", "c": "second", "d": "host"}
    assert (gpu1.user, gpu1.port, gpu1.base, gpu1.connect_timeout) == ("ops", 2200, "/srv/specops", 7.0)
    assert gpu1.groups == ("first", "second")
    assert gpu1.key_file == str(tmp_path / "keys/id")  # relative to the inventory file
    assert (gpu2.user, gpu2.port, gpu2.base) == ("root", 22, "/data/specops")
    assert (cpu.connection, cpu.base) == ("local", os.path.expanduser("~/.cache/specops/t"))
    assert cpu.address is None and cpu.groups == ()
    assert gpu1.host_key_policy == "strict" and gpu1.sudo is False
    assert gpu1.known_hosts == (os.path.expanduser("~/.ssh/known_hosts"),)
    tv = gpu1.template_vars()
    assert tv["name"] == "gpu1" and tv["base"] == "/srv/specops" and tv["d"] == "host"
    assert tv["groups"] == ["first", "second"]


def test_select_by_host_group_and_unknown(tmp_path):
    inv = load_inventory(write(tmp_path, LAYERED))
    assert [h.name for h in inv.select(None)] == ["gpu1", "gpu2", "cpu"]
    assert [h.name for h in inv.select("second")] == ["gpu1"]
    assert [h.name for h in inv.select("cpu, first")] == ["gpu1", "gpu2", "cpu"]  # inventory order, no dups
    with pytest.raises(InputFileError) as exc:
        inv.select("gpu01")
    assert "'gpu01'" in str(exc.value) and "did you mean 'gpu1'" in str(exc.value)
    with pytest.raises(InputFileError, match="--limit is empty"):
        inv.select(" , ")


def test_shipped_inventory_has_the_local_demo_host():
    inv = load_inventory(None)
    assert inv.path == REPO_ROOT / "inventory.yaml"
    demo = inv.hosts["local"]
    assert demo.connection == "local" and demo.vars["profile"] == "cpu"
    assert demo.base.startswith(os.path.expanduser("~/.cache/specops"))
    # The copy used when no inventory.yaml exists (an installed package) is the same demo host.
    embedded = parse_inventory(EMBEDDED_INVENTORY, Path("<embedded inventory>"), base_dir=REPO_ROOT)
    assert list(embedded.hosts) == ["local"] and embedded.hosts["local"] == demo


def test_known_hosts_list_is_resolved_beside_the_inventory(tmp_path):
    path = write(
        tmp_path,
        """
        defaults:
          known_hosts: [project_known_hosts, ~/.ssh/known_hosts]
        hosts:
          a: {address: 1.2.3.4, host_key_policy: accept-new, sudo: true}
    """,
    )
    host = load_inventory(path).hosts["a"]
    assert host.known_hosts == (
        str(tmp_path / "project_known_hosts"),
        os.path.expanduser("~/.ssh/known_hosts"),
    )
    assert host.host_key_policy == "accept-new" and host.sudo is True


@pytest.mark.parametrize(
    ("text", "line", "needles"),
    [
        ("hosts:\n  gpu1:\n    adress: 1.2.3.4\n", 3, ["unknown key 'adress'", "did you mean 'address'"]),
        ("hosts:\n  gpu1:\n    address: 1.2.3.4\n    port: http\n", 4, ["'port'", "1-65535"]),
        ("hosts:\n  gpu1:\n    address: 1.2.3.4\n    port: true\n", 4, ["'port'"]),
        ("hosts:\n  gpu1:\n    address: 1.2.3.4\n    sudo: yes please\n", 4, ["'sudo'", "true or false"]),
        (
            "hosts:\n  gpu1:\n    address: 1.2.3.4\n    connection: sssh\n",
            4,
            ["ssh, local", "did you mean 'ssh'"],
        ),
        ("hosts:\n  gpu1:\n    address: 1.2.3.4\n    host_key_policy: yolo\n", 4, ["strict, accept-new"]),
        ("hosts:\n  gpu1:\n    address: 1.2.3.4\n    connect_timeout: -1\n", 4, ["connect_timeout"]),
        (
            "hosts:\n  gpu1:\n    address: 1.2.3.4\n    vars: [1, 2]\n",
            4,
            ["vars of host 'gpu1' must be a mapping"],
        ),
        ("hosts:\n  gpu1:\n    address: 1.2.3.4\n    known_hosts: [1]\n", 4, ["known_hosts"]),
        ("hosts:\n  gpu1:\n    address: [1]\n", 3, ["'address'", "non-empty string"]),
        (
            "hosts:\n  gpu1:\n    address: 1.2.3.4\n  gpu1:\n    address: 1.2.3.5\n",
            4,
            ["duplicate key 'gpu1'", "first defined at line 2"],
        ),
        ("hosts:\n  gpu1:\n    address: 1.2.3.4\n    address: 1.2.3.5\n", 4, ["duplicate key 'address'"]),
        (
            "groups:\n  g:\n    hosts: [gpu1, gpu9]\nhosts:\n  gpu1: {address: 1.2.3.4}\n",
            3,
            ["group 'g' names host 'gpu9'", "not under hosts"],
        ),
        ("groups:\n  g:\n    hosts: gpu1\nhosts:\n  gpu1: {address: 1.2.3.4}\n", 3, ["list of host names"]),
        ("groups:\n  gpu1:\n    hosts: []\nhosts:\n  gpu1: {address: 1.2.3.4}\n", 2, ["same name as a host"]),
        (
            "groups:\n  g:\n    hots: []\nhosts:\n  gpu1: {address: 1.2.3.4}\n",
            3,
            ["unknown key 'hots'", "'hosts'"],
        ),
        ("hosts:\n  gpu1:\n    port: 22\n", 2, ["host 'gpu1' uses connection ssh but has no 'address'"]),
        ("hosts:\n  gpu1:\n    address: 1.2.3.4\n    base: relative/dir\n", 4, ["absolute path"]),
        (
            "defaults:\n  profile: cpu\nhosts:\n  a: {connection: local}\n",
            2,
            ["unknown key 'profile' in defaults", "defaults.vars"],
        ),
        ("hostz:\n  a: {connection: local}\n", 1, ["unknown key 'hostz'", "did you mean 'hosts'"]),
        (
            "hosts:\n  a:\n    connection: local\n    vars:\n      port: 8000\n",
            5,
            ["variable 'port'", "clashes with the host field"],
        ),
        (
            "hosts:\n  a:\n    connection: local\n    secrets:\n      TOKEN: hunter22\n",
            5,
            ["secret 'TOKEN'", "{env: VAR} or {file: PATH}"],
        ),
        (
            "hosts:\n  a:\n    connection: local\n    secrets:\n      TOKEN: {env: A, file: b}\n",
            5,
            ["secret 'TOKEN'"],
        ),
        (
            "hosts:\n  a:\n    connection: local\n  b:\n    connection: local\n    addr: x\n",
            6,
            ["did you mean 'address'"],
        ),
        ("hosts:\n  a b:\n    connection: local\n", 2, ["without commas, spaces"]),
        ("hosts:\n  a:\n    connection: local\n   bad: [\n", 4, ["invalid YAML"]),
        ("hosts: {}\n", 1, ["defines no hosts"]),
        ("- a\n- b\n", 1, ["must be a mapping"]),
    ],
)
def test_validation_errors_name_file_line_and_key(tmp_path, text, line, needles):
    path = write(tmp_path, text)
    with pytest.raises(InputFileError) as exc:
        load_inventory(path)
    message = str(exc.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert exc.value.line == line
    for needle in needles:
        assert needle in message, message
    assert "\n" not in message


def test_unreadable_inventory_file(tmp_path):
    with pytest.raises(InputFileError, match="cannot read inventory"):
        load_inventory(tmp_path / "missing.yaml")


def test_secrets_resolve_from_env_and_0600_file_and_register(tmp_path, monkeypatch):
    secret_file = tmp_path / "sudo.txt"
    secret_file.write_text("file-secret-value\n")
    secret_file.chmod(0o600)
    path = write(
        tmp_path,
        f"""
        defaults:
          secrets: {{HF_TOKEN: {{env: SPECOPS_TEST_HF}}}}
        hosts:
          a:
            connection: local
            secrets: {{sudo_password: {{file: {secret_file.name}}}}}
    """,
    )
    monkeypatch.setenv("SPECOPS_TEST_HF", "hf_env_secret_value")
    host = load_inventory(path).hosts["a"]
    assert "secrets" not in host.template_vars() and "hf_env_secret_value" not in repr(host)
    redactor = Redactor()
    values = host.resolve_secrets(redactor)
    assert values == {"HF_TOKEN": "hf_env_secret_value", "sudo_password": "file-secret-value"}
    assert redactor.redact("x hf_env_secret_value file-secret-value") == "x ******** ********"


def test_secret_errors_say_how_to_fix(tmp_path, monkeypatch):
    loose = tmp_path / "loose.txt"
    loose.write_text("loose-secret\n")
    loose.chmod(0o644)
    path = write(
        tmp_path,
        f"""
        hosts:
          a:
            connection: local
            secrets:
              MISSING: {{env: SPECOPS_TEST_UNSET}}
              LOOSE: {{file: {loose}}}
    """,
    )
    monkeypatch.delenv("SPECOPS_TEST_UNSET", raising=False)
    host = load_inventory(path).hosts["a"]
    with pytest.raises(SpecopsError) as exc:
        host.resolve_secrets()
    assert f"{path}:5:" in str(exc.value) and "export SPECOPS_TEST_UNSET" in str(exc.value)
    with pytest.raises(SpecopsError, match=f"chmod 600 {loose}"):
        host.secrets["LOOSE"].resolve("a")
    assert host.resolve_secrets(strict=False) == {}


def test_yaml_anchors_merge_under_x_keys_and_merged_typos_are_still_caught(tmp_path):
    text = """
        x-gpu: &gpu {user: ubuntu, port: 2222, sudo: true}
        hosts:
          a: {<<: *gpu, address: 10.0.0.1}
          b: {<<: *gpu, address: 10.0.0.2, port: 22}
    """
    inv = load_inventory(write(tmp_path, text))
    assert (inv.hosts["a"].user, inv.hosts["a"].port, inv.hosts["a"].sudo) == ("ubuntu", 2222, True)
    assert inv.hosts["b"].port == 22  # the host's own key wins over the merged one
    bad = write(
        tmp_path, "x-gpu: &gpu {usr: ubuntu}\nhosts:\n  a:\n    <<: *gpu\n    address: 10.0.0.1\n", "bad.yaml"
    )
    with pytest.raises(
        InputFileError, match=r"bad.yaml:4: unknown key 'usr' in host 'a' \(fix: did you mean 'user'"
    ):
        load_inventory(bad)
