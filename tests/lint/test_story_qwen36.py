"""The story's three faults on the real Qwen3.6-27B shapes, against the shipped spec.

The shipped `qwen3.6-27b-dflash` spec passes the real pair cleanly; a wrong mask_token_id (the eos
id), target_layer_ids off by one, and layer_types/sliding_window describing full attention are each
reported alone and all together, with the card's values as the fix, and `patch` repairs them.
"""

from __future__ import annotations

import json

import pytest

from drafter_config import lint, load_spec, patch
from specops_files.store import LocalStore
from tests.lint import qwen36
from tests.lint.corpus import mutated

WRONG_MASK = {"dflash_config__mask_token_id": qwen36.EOS}
SHIFTED_IDS = {"dflash_config__target_layer_ids": [i + 1 for i in qwen36.IDS]}
FULL_LAYERS = {"layer_types": ["full_attention"] * 5, "sliding_window": None, "use_sliding_window": False}
FAULTS = {"mask": WRONG_MASK, "ids": SHIFTED_IDS, "types": FULL_LAYERS}
EXPECTED = {"mask": {"DFL011", "DFL012"}, "ids": {"DFL025"}, "types": {"DFL030", "DFL032"}}


@pytest.fixture(scope="module")
def spec():
    return load_spec("qwen3.6-27b-dflash")


def test_the_real_pair_is_clean_under_the_shipped_spec(tmp_path, spec):
    drafter, target = qwen36.write_pair(tmp_path, qwen36.drafter())
    report = lint(drafter, target, spec=spec)
    assert report.findings == [], [f.code for f in report.findings]
    assert spec.values["num_target_layers"] == 64  # the target's text_config, 16 x (3 + 1) layers


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_alone(tmp_path, spec, fault):
    drafter, target = qwen36.write_pair(tmp_path, mutated(qwen36.drafter(), **FAULTS[fault]))
    report = lint(drafter, target, spec=spec)
    assert set(report.codes()) == EXPECTED[fault]
    assert report.errors


def test_all_three_at_once_then_patch_fixes_them(tmp_path, spec):
    drafter, target = qwen36.write_pair(
        tmp_path, mutated(qwen36.drafter(), **WRONG_MASK, **SHIFTED_IDS, **FULL_LAYERS)
    )
    report = lint(drafter, target, spec=spec)
    assert set(report.codes()) == set().union(*EXPECTED.values())
    (shift,) = [f for f in report.findings if f.code == "DFL025"]
    assert "one-based" in shift.message and str(qwen36.IDS) in shift.hint
    hints = " ".join(f.hint for f in report.findings)
    assert str(qwen36.MASK) in hints and "2048" in hints

    result = patch(LocalStore(), drafter, spec, target_path=target)
    assert result.changed and result.written
    assert lint(drafter, target, spec=spec).findings == []
    fixed = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert fixed["dflash_config"] == {"mask_token_id": qwen36.MASK, "target_layer_ids": qwen36.IDS}
    assert fixed["layer_types"] == qwen36.TYPES and fixed["sliding_window"] == 2048
    assert fixed["use_sliding_window"] is True
    assert not patch(LocalStore(), drafter, spec, target_path=target).changed


def test_the_runtime_reads_the_real_drafter_config(tmp_path):
    """The DFlash config the runtime builds from it keeps the 2048 window on the sliding layers."""
    from ddtree_runtime.config import DFlashConfig

    drafter, _ = qwen36.write_pair(tmp_path, qwen36.drafter())
    cfg = DFlashConfig.from_dir(drafter)
    assert cfg.windows == (2048, 2048, 2048, 2048, None)
    assert cfg.causal == (True, True, True, True, False)
    assert cfg.target_layer_ids == tuple(qwen36.IDS) and cfg.mask_token_id == qwen36.MASK
