"""One faulty case per rule code; the good corpus is clean."""

from __future__ import annotations

import json

import pytest

from drafter_config import CODES
from tests.lint import corpus
from tests.lint.corpus import DELETE, mutated
from tests.lint.helpers import by_code, lint_case

Q3 = corpus.qwen3_drafter()
Q36 = corpus.qwen36_drafter()


def test_good_corpus_is_clean(tmp_path):
    assert lint_case(tmp_path / "a").findings == []
    assert lint_case(tmp_path / "b", Q36, target=corpus.qwen35_target(), tokenizer=False).findings == []
    spec = corpus.qwen3_spec_values(Q3)
    assert lint_case(tmp_path / "c", spec=spec, serve="num_speculative_tokens: 15\n").findings == []
    assert lint_case(tmp_path / "d", with_target=False).findings == []


def test_sharded_checkpoint_with_index_is_clean(tmp_path):
    corpus.write_drafter(tmp_path / "drafter", Q3, shards=3)
    corpus.write_target(tmp_path / "target", corpus.qwen3_target())
    from drafter_config import lint

    report = lint(str(tmp_path / "drafter"), str(tmp_path / "target"))
    assert report.findings == []


def _without(name):
    tensors = corpus.drafter_tensors(Q3)
    del tensors[name]
    return tensors


# (case id, kwargs for lint_case, expected code, expected severity)
CASES = [
    ("not-dflash", {"drafter": mutated(Q3, architectures=["Qwen3ForCausalLM"])}, "DFL002", "error"),
    ("target-as-drafter", {"drafter": corpus.qwen3_target()}, "DFL002", "error"),
    ("mask-missing", {"drafter": mutated(Q3, dflash_config__mask_token_id=DELETE)}, "DFL010", "error"),
    ("mask-out-of-range", {"drafter": mutated(Q3, dflash_config__mask_token_id=151936)}, "DFL011", "error"),
    ("mask-not-int", {"drafter": mutated(Q3, dflash_config__mask_token_id="151669")}, "DFL011", "error"),
    (
        "mask-spec",
        {"drafter": mutated(Q3, dflash_config__mask_token_id=151700), "spec": {"mask_token_id": 151669}},
        "DFL011",
        "error",
    ),
    ("mask-is-im_end", {"drafter": mutated(Q3, dflash_config__mask_token_id=151645)}, "DFL012", "error"),
    ("mask-is-word", {"drafter": mutated(Q3, dflash_config__mask_token_id=42)}, "DFL012", "error"),
    (
        "mask-is-eos-config-only",
        {"drafter": mutated(Q3, dflash_config__mask_token_id=151645), "tokenizer": False},
        "DFL012",
        "warning",
    ),
    ("ids-missing", {"drafter": mutated(Q3, dflash_config__target_layer_ids=DELETE)}, "DFL020", "error"),
    ("ids-unsorted", {"drafter": mutated(Q3, dflash_config__target_layer_ids=[5, 3, 1])}, "DFL021", "error"),
    ("ids-duplicate", {"drafter": mutated(Q3, dflash_config__target_layer_ids=[1, 1, 5])}, "DFL021", "error"),
    ("ids-not-int", {"drafter": mutated(Q3, dflash_config__target_layer_ids=[1, "3", 5])}, "DFL021", "error"),
    ("ids-beyond", {"drafter": mutated(Q3, dflash_config__target_layer_ids=[1, 3, 8])}, "DFL022", "error"),
    (
        "ids-last-layer",
        {"drafter": mutated(Q3, dflash_config__target_layer_ids=[1, 3, 7])},
        "DFL022",
        "warning",
    ),
    ("num-target-layers", {"drafter": mutated(Q3, num_target_layers=36)}, "DFL023", "error"),
    ("ids-vs-fc", {"drafter": mutated(Q3, dflash_config__target_layer_ids=[1, 3, 4, 5])}, "DFL024", "error"),
    ("ids-spec-shift", {"spec": {"target_layer_ids": [0, 2, 4]}}, "DFL025", "error"),
    ("types-length", {"drafter": mutated(Q3, layer_types=["full_attention"] * 2)}, "DFL030", "error"),
    (
        "types-unknown",
        {"drafter": mutated(Q3, layer_types=["full_attention", "linear_attention", "full_attention"])},
        "DFL031",
        "error",
    ),
    (
        "sliding-no-window",
        {"drafter": mutated(Q36, sliding_window=None), "target": corpus.qwen35_target(), "tokenizer": False},
        "DFL032",
        "error",
    ),
    ("window-unused", {"drafter": mutated(Q3, sliding_window=4096)}, "DFL033", "warning"),
    ("use-sliding-unused", {"drafter": mutated(Q3, use_sliding_window=True)}, "DFL033", "warning"),
    (
        "window-below-block",
        {"drafter": mutated(Q36, sliding_window=8), "target": corpus.qwen35_target(), "tokenizer": False},
        "DFL034",
        "error",
    ),
    ("hidden-size", {"target": corpus.qwen3_target(hidden=128)}, "DFL040", "error"),
    ("vocab-size", {"target": mutated(corpus.qwen3_target(), vocab_size=152064)}, "DFL041", "error"),
    ("kv-heads-vs-weights", {"drafter": mutated(Q3, num_key_value_heads=4)}, "DFL042", "error"),
    ("head-dim-vs-weights", {"drafter": mutated(Q3, head_dim=32)}, "DFL042", "error"),
    ("rope-theta", {"drafter": mutated(Q3, rope_theta=10000)}, "DFL043", "warning"),
    (
        "rope-scaling",
        {
            "target": mutated(
                corpus.qwen3_target(),
                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            )
        },
        "DFL043",
        "warning",
    ),
    ("rms-eps", {"drafter": mutated(Q3, rms_norm_eps=1e-5)}, "DFL044", "warning"),
    ("max-position", {"drafter": mutated(Q3, max_position_embeddings=4096)}, "DFL045", "warning"),
    (
        "target-awq",
        {"target": mutated(corpus.qwen3_target(), quantization_config={"quant_method": "awq", "bits": 4})},
        "DFL046",
        "warning",
    ),
    ("block-missing", {"drafter": mutated(Q3, block_size=DELETE)}, "DFL050", "error"),
    ("block-one", {"drafter": mutated(Q3, block_size=1)}, "DFL050", "error"),
    (
        "serve-tokens",
        {"serve": "serve:\n  mode: dflash\n  speculative_config:\n    num_speculative_tokens: 7\n"},
        "DFL051",
        "error",
    ),
    ("dtype", {"drafter": mutated(Q3, dtype="bfloat16")}, "DFL060", "warning"),
    ("weight-missing", {"tensors": _without("layers.2.mlp.down_proj.weight")}, "DFL061", "error"),
    (
        "weights-beyond-layers",
        {
            "drafter": mutated(Q3, num_hidden_layers=2, layer_types=["full_attention"] * 2),
            "tensors": corpus.drafter_tensors(Q3),
        },
        "DFL061",
        "error",
    ),
    (
        "weights-unexplained",
        {
            "tensors": {
                **corpus.drafter_tensors(Q3),
                "selector.codebook.weight": corpus.drafter_tensors(Q3)["norm.weight"],
            }
        },
        "DFL061",
        "warning",
    ),
]


@pytest.mark.parametrize(("kwargs", "code", "severity"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_faulty_case_reports_its_code(tmp_path, kwargs, code, severity):
    report = lint_case(tmp_path, **kwargs)
    found = by_code(report, code)
    assert found, f"{code} not in {report.codes()}"
    assert found[0].severity == severity
    assert found[0].message and found[0].hint
    if found[0].file.endswith("config.json") and "drafter" in found[0].file:
        assert found[0].line is not None and found[0].col is not None


def test_every_code_has_a_faulty_case():
    covered = {c[2] for c in CASES} | {
        "DFL001",
        "DFL062",
        "DFL063",
    }  # the last two: tests/lint/test_hostile.py
    assert covered == set(CODES)


def test_invalid_json_reports_line_and_column(tmp_path):
    corpus.write_drafter(tmp_path / "drafter", Q3)
    (tmp_path / "drafter" / "config.json").write_text('{\n  "architectures": ["DFlashDraftModel"],\n}\n')
    from drafter_config import lint

    report = lint(str(tmp_path / "drafter"))
    (finding,) = report.findings
    assert (finding.code, finding.line, finding.col) == ("DFL001", 3, 1)
    assert report.unreadable


def test_invalid_target_json_is_dfl001_on_the_target(tmp_path):
    corpus.write_drafter(tmp_path / "drafter", Q3)
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text('{"num_hidden_layers": 8 "x": 1}')
    from drafter_config import lint

    report = lint(str(tmp_path / "drafter"), str(tmp_path / "target"))
    assert report.codes() == ["DFL001"] and report.findings[0].file.endswith("target/config.json")


def test_top_level_dflash_fields_are_the_fallback(tmp_path):
    drafter = mutated(Q3, dflash_config=DELETE, mask_token_id=151645, target_layer_ids=[1, 3, 5])
    report = lint_case(tmp_path, drafter)
    (finding,) = report.findings
    assert finding.code == "DFL012" and finding.path == "mask_token_id"


def test_findings_point_at_the_offending_value(tmp_path):
    drafter = mutated(Q3, dflash_config__target_layer_ids=[1, 3, 8])
    report = lint_case(tmp_path, drafter)
    (finding,) = by_code(report, "DFL022")
    text = (tmp_path / "drafter" / "config.json").read_text().splitlines()
    assert finding.path == "dflash_config.target_layer_ids[2]"
    assert text[finding.line - 1][finding.col - 1] == "8"


def test_corrupt_header_and_empty_directory(tmp_path):
    d = corpus.write_drafter(tmp_path / "drafter", Q3)
    (d / "model.safetensors").write_bytes((10**6).to_bytes(8, "little") + b"{}")
    from drafter_config import lint

    assert "truncated" in by_code(lint(str(d)), "DFL061")[0].message
    (d / "model.safetensors").unlink()
    assert "no *.safetensors" in by_code(lint(str(d)), "DFL061")[0].message


def test_index_naming_a_missing_shard(tmp_path):
    d = corpus.write_drafter(tmp_path / "drafter", Q3, shards=2)
    (d / "model-00002-of-00002.safetensors").unlink()
    from drafter_config import lint

    messages = [f.message for f in by_code(lint(str(d)), "DFL061")]
    assert any("listed in model.safetensors.index.json but missing" in m for m in messages)
    assert any("missing:" in m for m in messages)
    json.loads((d / "model.safetensors.index.json").read_text())
