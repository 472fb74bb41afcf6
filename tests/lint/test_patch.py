"""patch: minimal in-place edits, backup, atomic write, diff, idempotence, refusal."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from drafter_config import PatchRefused, lint, load_spec, patch
from specops_files.store import LocalStore
from tests.lint import corpus
from tests.lint.corpus import DELETE, mutated

Q3 = corpus.qwen3_drafter()
SPEC = corpus.qwen3_spec_values(Q3)


def _write(tmp_path, drafter, spec=SPEC):
    d = corpus.write_drafter(tmp_path / "drafter", drafter, corpus.drafter_tensors(Q3))
    return d, load_spec(str(corpus.write_spec(tmp_path / "spec.yaml", "tiny", spec)))


def test_patch_edits_in_place_with_backup(tmp_path):
    bad = mutated(Q3, dflash_config__mask_token_id=151645, dflash_config__target_layer_ids=[2, 4, 6])
    d, spec = _write(tmp_path, bad)
    config = d / "config.json"
    os.chmod(config, 0o640)
    before = config.read_text()

    result = patch(LocalStore(), str(d), spec)

    after = config.read_text()
    assert result.changed and result.written
    assert Path(result.backup).read_text() == before and ".bak-" in result.backup
    assert list(json.loads(after)) == list(json.loads(before))  # key order kept
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert len(changed) == 4  # the mask line and three list elements, nothing else
    assert '-    "mask_token_id": 151645,' in result.diff and '+    "mask_token_id": 151669,' in result.diff
    assert json.loads(after)["dflash_config"] == Q3["dflash_config"]
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".")) == []  # no temp files left

    again = patch(LocalStore(), str(d), spec)
    assert not again.changed and again.backup is None and config.read_text() == after
    assert len(list(d.glob("config.json.bak-*"))) == 1


def test_check_writes_nothing(tmp_path):
    d, spec = _write(tmp_path, mutated(Q3, block_size=8))
    before = (d / "config.json").read_bytes()
    result = patch(LocalStore(), str(d), spec, check=True)
    assert result.changed and not result.written and '+  "block_size": 16,' in result.diff
    assert (d / "config.json").read_bytes() == before and not list(d.glob("*.bak-*"))


def test_inline_lists_stay_inline_and_missing_keys_are_inserted(tmp_path):
    text = json.dumps(mutated(Q3, dflash_config__mask_token_id=DELETE), indent=2)
    text = text.replace("[\n      1,\n      3,\n      5\n    ]", "[9, 9, 9]")  # z-lab writes ids inline
    d, spec = _write(tmp_path, Q3)
    (d / "config.json").write_text(text)
    result = patch(LocalStore(), str(d), spec)
    after = (d / "config.json").read_text()
    assert '"target_layer_ids": [1, 3, 5]' in after
    assert json.loads(after)["dflash_config"] == {"target_layer_ids": [1, 3, 5], "mask_token_id": 151669}
    assert result.changed and lint(str(d), spec=spec).findings == []


def test_multiline_layer_types_keep_their_layout(tmp_path):
    q36 = corpus.qwen36_drafter()
    values = {"layer_types": q36["layer_types"], "sliding_window": 64}
    d = corpus.write_drafter(
        tmp_path / "drafter",
        mutated(q36, layer_types=["full_attention"] * 5, sliding_window=None, use_sliding_window=False),
        corpus.drafter_tensors(q36),
    )
    spec = load_spec(str(corpus.write_spec(tmp_path / "spec.yaml", "q36", values)))
    patch(LocalStore(), str(d), spec)
    after = (d / "config.json").read_text()
    assert after == json.dumps(mutated(q36, use_sliding_window=False), indent=2) + "\n"


def test_refuses_a_result_that_lint_rejects(tmp_path):
    d, spec = _write(tmp_path, mutated(Q3, block_size=8, num_key_value_heads=4))
    before = (d / "config.json").read_bytes()
    with pytest.raises(PatchRefused, match="DFL042"):
        patch(LocalStore(), str(d), spec)
    assert (d / "config.json").read_bytes() == before and not list(d.glob("*.bak-*"))


def test_shipped_spec_on_full_size_published_configs(tmp_path):
    """Full-size Qwen3-8B target and drafter configs (no weights): the shipped spec agrees with them."""
    target = mutated(
        corpus.qwen3_target(layers=36, hidden=4096),
        head_dim=128,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
    )
    drafter = mutated(
        corpus.qwen3_drafter(target_layers=36, draft_layers=5, hidden=4096),
        head_dim=128,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        dtype="bfloat16",
    )
    assert drafter["dflash_config"]["target_layer_ids"] == [1, 9, 17, 25, 33]
    config = corpus.write_json(tmp_path / "drafter.json", drafter)
    corpus.write_target(tmp_path / "target", target)
    spec = load_spec("qwen3-8b-dflash-b16")
    assert lint(str(config), str(tmp_path / "target"), spec=spec).findings == []

    corpus.write_json(
        config,
        mutated(
            drafter, dflash_config__mask_token_id=151643, dflash_config__target_layer_ids=[2, 10, 18, 26, 34]
        ),
    )
    assert {"DFL011", "DFL012", "DFL025"} <= set(
        lint(str(config), str(tmp_path / "target"), spec=spec).codes()
    )
    patch(LocalStore(), str(config), spec, target_path=str(tmp_path / "target"))
    assert lint(str(config), str(tmp_path / "target"), spec=spec).findings == []
