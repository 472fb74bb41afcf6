"""Nothing can add a line to a host's env file (issue 27, item 4): a line break in a `serve_env` key
or value, a secret name or a host name (the file's header shows it) would add a variable such as
`LD_PRELOAD=...` to the 0600 file the server's process trusts. Keys must be identifiers and values
one line: refused with one line naming the key (never the value), and nothing is written."""

from __future__ import annotations

import pytest
import yaml
from invoke.exceptions import Exit

from ops.inventory import load_inventory
from ops.playbook import load_playbook
from ops.runner import run_playbook
from ops.tasks import run_file

PLAYBOOK = """\
name: env
steps:
  - name: run directory
    step: directory
    args: {path: "{{ layout.run }}", mode: "0700"}
  - name: environment file   # as in playbooks/deploy.yaml
    step: template
    args: {src: ddtree.env.j2, dest: "{{ layout.env_file }}", mode: "0600", vars: {service: specops-ddtree}}
"""
INJECTED = "LD_PRELOAD=/tmp/evil.so"


def test_serve_env_keys_and_values_stay_one_line(sshd_hosts, make_inventory, tmp_path):
    (h1,) = sshd_hosts(1)
    book = tmp_path / "env.yaml"
    book.write_text(PLAYBOOK)
    env_file = h1.base / "run" / "specops-ddtree.env"

    def render(serve_env):
        inventory = make_inventory([h1], host_vars={"h1": {"serve_env": serve_env}})
        hosts = load_inventory(inventory).select(None)
        result = run_playbook(load_playbook(book), hosts, results_root=tmp_path / "results", live=False)
        return result.hosts["h1"].steps[-1]

    ok = render({"SPECOPS_SERVE_TEMPERATURE": 0.7})
    assert ok.status == "changed" and "SPECOPS_SERVE_TEMPERATURE=0.7\n" in env_file.read_text()
    before = env_file.read_bytes()
    for serve_env, named in [
        ({f"A\n{INJECTED.split('=')[0]}": "1"}, "env file key 'A\\nLD_PRELOAD' is not an identifier"),
        ({"A B": "1"}, "env file key 'A B' is not an identifier"),
        ({"SPECOPS_SERVE_BUDGET": f"8\n{INJECTED}"}, "the value of SPECOPS_SERVE_BUDGET holds a line break"),
        ({"X": f"1\r{INJECTED}"}, "the value of X holds a line break"),
    ]:
        step = render(serve_env)
        assert step.status == "failed" and named in step.message, step.message
        assert "\n" not in step.message and "evil.so" not in step.message
        assert env_file.read_bytes() == before  # nothing written


@pytest.mark.parametrize(
    ("where", "fix"),
    [
        ("host", "host name 'gpu1\\nLD_PRELOAD=/tmp/evil.so' must be non-empty without commas, spaces"),
        ("secret", "secret name 'HF\\nLD_PRELOAD' in host 'gpu1' is not an identifier"),
    ],
)
def test_host_and_secret_names_with_line_breaks_are_refused_before_any_host(tmp_path, capsys, where, fix):
    host_name = f"gpu1\n{INJECTED}" if where == "host" else "gpu1"
    entry = {"connection": "local", "base": str(tmp_path / "base")}
    if where == "secret":
        entry["secrets"] = {"HF\nLD_PRELOAD": {"env": "HF_TOKEN"}}
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {host_name: entry}}))
    book = tmp_path / "env.yaml"
    book.write_text(PLAYBOOK)
    with pytest.raises(Exit) as stopped:
        run_file(book, inventory=str(inventory), results=str(tmp_path / "results"))
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert fix in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "base").exists()
