"""The models step: the completeness probe on tiny real checkpoints, the download command, and a real
run through the runner with a stand-in `hf` CLI -- the token reaches hf only through its environment."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
from safetensors import safe_open

from ops.connection import connect
from ops.inventory import load_inventory
from ops.playbook import load_playbook
from ops.runner import run_playbook
from ops.steps.models import download_command, missing_files, models_arg, probe_checkpoint
from tests.provision.helpers import fake_hf, write_checkpoint

TOKEN = "hf_ProvisionTestToken_0123456789"


def test_models_arg_validates_each_entry() -> None:
    [model] = models_arg([{"name": "target", "repo": "Qwen/Qwen3-8B", "size_gb": 16}])
    assert model == {
        "name": "target",
        "repo": "Qwen/Qwen3-8B",
        "revision": "main",
        "size_gb": 16.0,
        "include": [],
    }
    for bad, message in [
        ({"name": "../x", "repo": "a/b"}, "models[0].name '../x' must be a unique directory name"),
        ({"name": "t", "repo": "Qwen3-8B"}, "models[0].repo 'Qwen3-8B' must be a Hugging Face id"),
        ({"name": "t", "repo": "a/b", "revison": "x"}, "models[0]: unknown key 'revison'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            models_arg([bad])
    with pytest.raises(ValueError, match="unique"):
        models_arg([{"name": "t", "repo": "a/b"}, {"name": "t", "repo": "a/c"}])


@pytest.mark.parametrize(
    ("files", "index", "missing"),
    [
        (["config.json", "a.safetensors", "b.safetensors"], ["a.safetensors", "b.safetensors"], []),
        (["config.json", "a.safetensors"], ["a.safetensors", "b.safetensors"], ["b.safetensors"]),
        (["a.safetensors", "b.safetensors"], ["a.safetensors", "b.safetensors"], ["config.json"]),
        (["config.json", "model.safetensors"], None, []),
        (["config.json", "tokenizer.json"], None, ["*.safetensors"]),
        ([], None, ["config.json", "*.safetensors"]),
    ],
)
def test_completeness_rule(files, index, missing) -> None:
    assert missing_files(files, index) == missing


def local_host(tmp_path: Path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        f"hosts:\n  local:\n    connection: local\n    base: {tmp_path / 'base'}\n"
        "    vars: {profile: cpu}\n"
    )
    return load_inventory(inventory).hosts["local"]


def test_probe_on_tiny_real_checkpoints(tmp_path: Path) -> None:
    models = tmp_path / "base" / "models"
    full = write_checkpoint(models / "full", shards=3)
    with safe_open(str(full / "model-00002-of-00003.safetensors"), "numpy") as f:
        assert list(f.keys()) == ["w2"]
    single = write_checkpoint(models / "single", index=False)
    partial = write_checkpoint(models / "partial", shards=2)
    (partial / "model-00002-of-00002.safetensors").unlink()
    with connect(local_host(tmp_path)) as conn:
        assert missing_files(**probe_checkpoint(conn, str(full))) == []
        assert missing_files(**probe_checkpoint(conn, str(single))) == []
        assert missing_files(**probe_checkpoint(conn, str(partial))) == ["model-00002-of-00002.safetensors"]
        assert missing_files(**probe_checkpoint(conn, str(models / "absent"))) == [
            "config.json",
            "*.safetensors",
        ]


def test_download_command_names_the_token_file_and_quotes_everything() -> None:
    model = models_arg(
        [{"name": "d", "repo": "z-lab/Qwen3-8B-DFlash-b16", "revision": "a b", "include": ["*.json"]}]
    )[0]
    command = download_command("/v/bin/hf", model, "/opt/specops/models/d", "/opt/specops/run/hf.token")
    assert command == (
        "HF_TOKEN_PATH=/opt/specops/run/hf.token HF_HUB_DISABLE_PROGRESS_BARS=1 "
        "/v/bin/hf download z-lab/Qwen3-8B-DFlash-b16 --revision 'a b' --local-dir "
        "/opt/specops/models/d --include '*.json'"
    )
    assert download_command("hf", model, "/m", None).startswith("HF_HUB_DISABLE_PROGRESS_BARS=1 hf download")


def test_models_step_downloads_once_with_the_token_only_in_hf_environment(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("SPECOPS_TEST_HF_TOKEN", TOKEN)
    log = tmp_path / "hf.log"
    hf = fake_hf(tmp_path / "bin", log)
    base = tmp_path / "base"
    write_checkpoint(base / "models" / "ready")  # already complete: never downloaded
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        json.dumps(
            {
                "hosts": {
                    "local": {
                        "connection": "local",
                        "base": str(base),
                        "secrets": {"HF_TOKEN": {"env": "SPECOPS_TEST_HF_TOKEN"}},
                        "vars": {
                            "hf_cli": str(hf),
                            "models": [
                                {"name": "target", "repo": "Qwen/Qwen3-8B"},
                                {"name": "drafter", "repo": "z-lab/Qwen3-8B-DFlash-b16", "revision": "main"},
                                {"name": "ready", "repo": "Qwen/Qwen3-0.6B"},
                            ],
                        },
                    }
                }
            }
        )
    )
    playbook = tmp_path / "models.yaml"
    playbook.write_text(
        "name: models\nsteps:\n  - step: models\n    args: {models: '{{ models }}', hf: '{{ hf_cli }}'}\n"
    )
    results = tmp_path / "results"

    def run(check: bool = False):
        hosts = load_inventory(inventory).select(None)
        return run_playbook(load_playbook(playbook), hosts, check=check, results_root=results, live=False)

    checked = run(check=True)
    assert checked.hosts["local"].status == "changed" and not log.exists()
    assert not (base / "run" / "hf.token").exists()

    first = run()
    [step] = first.hosts["local"].steps
    assert step.status == "changed", step.message
    assert step.message == "download target, drafter with the token file"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["argv"][:2] for c in calls] == [
        ["download", "Qwen/Qwen3-8B"],
        ["download", "z-lab/Qwen3-8B-DFlash-b16"],
    ]
    assert all(c["token"] == TOKEN and TOKEN not in " ".join(c["argv"]) for c in calls)
    env_file = base / "run" / "hf.token"
    assert env_file.read_text() == f"{TOKEN}\n" and stat.S_IMODE(env_file.stat().st_mode) == 0o600
    for path in results.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(), f"token leaked into {path}"

    second = run()
    [step] = second.hosts["local"].steps
    assert (step.status, step.message) == ("ok", "3 checkpoint(s) complete: target, drafter, ready")
    assert len(log.read_text().splitlines()) == 2, "a re-run downloaded again"

    os.chmod(env_file, 0o644)
    (base / "models" / "drafter" / "config.json").unlink()
    monkeypatch.delenv("SPECOPS_TEST_HF_TOKEN")
    # no token on the controller: the inventory must not name the secret (an unresolvable secret
    # fails the host before any step), so the step falls back to the host's token file
    config = json.loads(inventory.read_text())
    del config["hosts"]["local"]["secrets"]
    inventory.write_text(json.dumps(config))
    third = run()
    [step] = third.hosts["local"].steps
    assert step.status == "failed" and step.message == (
        f"{env_file} has mode 0644; a token file must be private (fix: chmod 600 {env_file})"
    )


def test_models_step_never_evaluates_the_token_and_sends_only_declared_secrets(
    sshd_hosts, make_inventory, tmp_path: Path, monkeypatch
) -> None:
    """Issue 27, item 3: a token holding `$(...)` reaches hf as text, never through a shell; the
    controller's own HF_TOKEN, undeclared, reaches no host."""
    (h1,) = sshd_hosts(1)
    marker = tmp_path / "evaluated"
    hostile = f"hf_Tok$(touch {marker})en_0123456789"
    log = tmp_path / "hf.log"
    hf = fake_hf(tmp_path / "bin", log)
    models = [{"name": "target", "repo": "Qwen/Qwen3-8B"}]
    playbook = tmp_path / "models.yaml"
    playbook.write_text(
        "name: models\nsteps:\n  - step: models\n    args: {models: '{{ models }}', hf: " + str(hf) + "}\n"
    )
    monkeypatch.setenv("SPECOPS_TEST_HF_TOKEN", hostile)

    def run(**fields):
        inventory = make_inventory([h1], host_vars={"h1": {"models": models}}, host_fields={"h1": fields})
        hosts = load_inventory(inventory).select(None)
        return run_playbook(load_playbook(playbook), hosts, results_root=tmp_path / "results", live=False)

    declared = run(secrets={"HF_TOKEN": {"env": "SPECOPS_TEST_HF_TOKEN"}})
    assert declared.ok, declared.hosts["h1"].steps[0].message
    [call] = [json.loads(line) for line in log.read_text().splitlines()]
    assert call["token"] == hostile and not call["env"] and not marker.exists()
    token_file = h1.base / "run" / "hf.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600

    token_file.unlink()
    log.unlink()
    (h1.base / "models" / "target" / "config.json").unlink()
    monkeypatch.setenv("HF_TOKEN", "hf_ControllerOwnToken_0123456789")  # set, but declared nowhere
    anonymous = run()
    assert anonymous.ok and anonymous.hosts["h1"].steps[0].message == "download target anonymously (no token)"
    [call] = [json.loads(line) for line in log.read_text().splitlines()]
    assert call["token"] is None and not token_file.exists()
