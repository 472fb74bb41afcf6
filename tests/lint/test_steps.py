"""The drafter_lint / drafter_patch steps: plans as data, then end to end over real sshd hosts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ops.api.changes import StepFailed, Write
from ops.api.context import StepContext
from ops.hosts import Host
from ops.runner import REPO_ROOT
from ops.steps import get_step
from ops.tasks import run_file
from tests.lint import corpus
from tests.lint.corpus import mutated
from tests.lint.test_story import CARD, FULL_LAYERS, GOOD, SHIFTED_IDS, WRONG_MASK

PLAYBOOKS = REPO_ROOT / "playbooks"


def _ctx(tmp_path: Path) -> StepContext:
    host = Host(
        name="gpu1",
        connection="ssh",
        address="10.0.0.5",
        port=22,
        user="u",
        key_file=None,
        base="/opt/specops",
        host_key_policy="strict",
        known_hosts=(),
        sudo=False,
        connect_timeout=10.0,
        vars={},
        groups=(),
    )
    return StepContext(host=host, playbook_dir=tmp_path, templates_dir=tmp_path, vars={})


def test_patch_plan_from_facts(tmp_path):
    step = get_step("drafter_patch")()
    args = step.check_args({"drafter": "/m/d", "spec": "qwen3-8b-dflash-b16"})
    facts = {
        "config": "/m/d/config.json",
        "target": "/m/d/config.json",
        "spec": "s",
        "refused": None,
        "old": '{"a": 1}\n',
        "new": '{"a": 2}\n',
        "diff": "-a\n+a\n",
        "backup": "/m/d/config.json.bak-20261202T000000Z",
    }
    plan = step.plan(facts, args, _ctx(tmp_path))
    backup, config = plan.changes
    assert (
        isinstance(backup, Write)
        and backup.path.endswith(".bak-20261202T000000Z")
        and backup.data == b'{"a": 1}\n'
    )
    assert config.path == "/m/d/config.json" and config.data == b'{"a": 2}\n' and plan.diff == "-a\n+a\n"
    linked = step.plan(
        {**facts, "target": "/m/blobs/0f1e"}, args, _ctx(tmp_path)
    )  # the Hugging Face cache layout
    assert [c.path for c in linked.changes] == [backup.path, "/m/blobs/0f1e"]
    assert "patched /m/d/config.json through the link: wrote /m/blobs/0f1e" in linked.reason
    again = step.plan({**facts, "old": facts["new"], "backup": None}, args, _ctx(tmp_path))
    assert not again.will_change and again.reason == "/m/d/config.json already matches spec s"
    with pytest.raises(StepFailed, match="refusing to patch"):
        step.plan(
            {
                **facts,
                "refused": "text",
                "errors": [{"code": "DFL042", "path": "x", "file": "c.json", "line": 3}],
            },
            args,
            _ctx(tmp_path),
        )


def test_lint_plan_from_facts(tmp_path):
    step = get_step("drafter_lint")()
    args = step.check_args({"drafter": "/m/d"})
    warning = {
        "code": "DFL044",
        "severity": "warning",
        "path": "rms_norm_eps",
        "file": "/m/d/config.json",
        "line": 9,
    }
    plan = step.plan({"findings": [warning], "text": ""}, args, _ctx(tmp_path))
    assert not plan.will_change and "1 warning(s): DFL044 rms_norm_eps (config.json:9)" in plan.reason
    error = {**warning, "code": "DFL025", "severity": "error", "path": "dflash_config.target_layer_ids"}
    with pytest.raises(StepFailed, match=r"1 error\(s\), 1 warning\(s\): DFL025"):
        step.plan({"findings": [warning, error], "text": "full"}, args, _ctx(tmp_path))


def _host_checkpoints(base: Path, drafter: dict, sparse: bool = False) -> dict[str, str]:
    d = corpus.write_drafter(base / "models" / "drafter", drafter, corpus.drafter_tensors(GOOD))
    t = corpus.write_target(base / "models" / "target", corpus.qwen35_target(), tokenizer=False)
    if sparse:  # a 50 GB weights file: only its header may travel over SFTP
        weights = d / "model.safetensors"
        os.truncate(weights, 8 + int.from_bytes(weights.read_bytes()[:8], "little"))
        os.truncate(weights, 50 * 1024**3)
    return {"drafter": str(d), "target": str(t)}


def test_fab_lint_and_patch_drafter_over_sshd(sshd_hosts, make_inventory, tmp_path):
    h1, h2 = sshd_hosts(2)
    spec = corpus.write_spec(tmp_path / "card.yaml", "qwen3.6-tiny-dflash", CARD)
    broken = mutated(GOOD, **WRONG_MASK, **SHIFTED_IDS, **FULL_LAYERS)
    host_vars = {
        "h1": {**_host_checkpoints(h1.base, broken), "drafter_spec": str(spec)},
        "h2": {
            **_host_checkpoints(h2.base, GOOD, sparse=True),
            "drafter_spec": str(spec),
            "serve": {"mode": "dflash", "num_speculative_tokens": 15},
        },
    }
    inventory = str(make_inventory([h1, h2], host_vars=host_vars))
    config = h1.base / "models" / "drafter" / "config.json"
    original = config.read_text()
    results = str(tmp_path / "results")

    def run(playbook: str, check: bool = False):
        result = run_file(PLAYBOOKS / playbook, inventory=inventory, check=check, results=results)
        return json.loads((result.run_dir / "summary.json").read_text())

    lint = run("lint-drafter.yaml")
    assert lint["hosts"]["h1"]["status"] == "failed" and lint["hosts"]["h2"]["status"] == "ok"
    message = lint["hosts"]["h1"]["steps"][0]["message"]
    assert "DFL011" in message and "DFL025" in message and "error(s)" in message

    check = run("patch-drafter.yaml", check=True)
    assert check["check"] and check["hosts"]["h1"]["status"] == "changed"
    assert config.read_text() == original and not list(config.parent.glob("config.json.bak-*"))

    patched = run("patch-drafter.yaml")
    assert patched["hosts"]["h1"]["status"] == "changed" and patched["hosts"]["h2"]["status"] == "ok"
    assert [s["status"] for s in patched["hosts"]["h1"]["steps"]] == ["changed", "ok"]
    (backup,) = config.parent.glob("config.json.bak-*")
    assert backup.read_text() == original
    assert json.loads(config.read_text())["dflash_config"] == GOOD["dflash_config"]
    assert list(json.loads(config.read_text())) == list(json.loads(original))
    assert not list((h2.base / "models" / "drafter").glob("config.json.bak-*"))

    again = run("patch-drafter.yaml")
    assert again["changed"] == 0 and again["failed"] == 0
    assert "already matches spec qwen3.6-tiny-dflash" in again["hosts"]["h1"]["steps"][0]["message"]
    assert len(list(config.parent.glob("config.json.bak-*"))) == 1

    assert run("lint-drafter.yaml")["failed"] == 0
