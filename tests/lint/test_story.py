"""The three faults of the original incident, each alone and all at once, then fixed by patch.

A Qwen3.6-style sliding-window drafter was deployed with a wrong mask_token_id (the eos id),
target_layer_ids off by one, and layer_types/sliding_window describing full attention. Each
fault alone, and all three together, must be reported with the model card's value as the fix.
"""

from __future__ import annotations

import pytest

from drafter_config import lint, load_spec, patch
from specops_files.store import LocalStore
from tests.lint import corpus
from tests.lint.corpus import mutated

GOOD = corpus.qwen36_drafter()
CARD = {
    "block_size": 16,
    "mask_token_id": corpus.QWEN35_MASK,
    "target_layer_ids": corpus.default_ids(16, 5),
    "num_target_layers": 16,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 64,
}
WRONG_MASK = {"dflash_config__mask_token_id": corpus.QWEN35_EOS}
SHIFTED_IDS = {"dflash_config__target_layer_ids": [i + 1 for i in corpus.default_ids(16, 5)]}
FULL_LAYERS = {"layer_types": ["full_attention"] * 5, "sliding_window": None, "use_sliding_window": False}
EXPECTED = {"mask": {"DFL011", "DFL012"}, "ids": {"DFL025"}, "types": {"DFL030", "DFL032"}}
FAULTS = {"mask": WRONG_MASK, "ids": SHIFTED_IDS, "types": FULL_LAYERS}


def _setup(tmp_path, changes):
    drafter = corpus.write_drafter(
        tmp_path / "drafter", mutated(GOOD, **changes), corpus.drafter_tensors(GOOD)
    )
    target = corpus.write_target(tmp_path / "target", corpus.qwen35_target(), tokenizer=False)
    spec = load_spec(str(corpus.write_spec(tmp_path / "card.yaml", "qwen3.6-tiny-dflash", CARD)))
    return str(drafter), str(target), spec


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_alone(tmp_path, fault):
    drafter, target, spec = _setup(tmp_path, FAULTS[fault])
    report = lint(drafter, target, spec=spec)
    assert set(report.codes()) == EXPECTED[fault]
    assert report.errors


def test_all_three_at_once_then_patch_fixes_them(tmp_path):
    drafter, target, spec = _setup(tmp_path, {**WRONG_MASK, **SHIFTED_IDS, **FULL_LAYERS})
    report = lint(drafter, target, spec=spec)
    assert set(report.codes()) == set().union(*EXPECTED.values())
    (shift,) = [f for f in report.findings if f.code == "DFL025"]
    assert "one-based" in shift.message and str(CARD["target_layer_ids"]) in shift.hint
    hints = " ".join(f.hint for f in report.findings)
    assert str(corpus.QWEN35_MASK) in hints and "64" in hints

    result = patch(LocalStore(), drafter, spec, target_path=target)
    assert result.changed and result.written
    assert lint(drafter, target, spec=spec).findings == []
    assert not patch(LocalStore(), drafter, spec, target_path=target).changed


def test_without_a_spec_the_story_faults_are_still_visible(tmp_path):
    """No model card at hand: the eos mask still warns, and a one-based id list runs off the end."""
    changes = {**WRONG_MASK, "dflash_config__target_layer_ids": [2, 5, 8, 11, 16]}
    drafter, target, _ = _setup(tmp_path, changes)
    codes = lint(drafter, target).codes()
    assert "DFL012" in codes and "DFL022" in codes
