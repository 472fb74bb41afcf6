"""The readers under the rules: JSON positions, target normalization, tokenizer, headers, specs."""

from __future__ import annotations

import json

import pytest

from drafter_config import LintInputError, load_spec
from drafter_config.safetensors_header import read_weights
from drafter_config.serve import load_serve_config
from drafter_config.target import load_target
from drafter_config.tokenizer import read_tokenizer
from specops_files.jsonpos import JsonSyntaxError, format_path, parse
from specops_files.store import LocalStore
from tests.lint import corpus


@pytest.mark.parametrize("config", [corpus.qwen3_target(), corpus.qwen35_target(), corpus.qwen36_drafter()])
def test_parser_agrees_with_json_and_records_positions(config):
    text = json.dumps(config, indent=2)
    doc = parse(text)
    assert doc.data == json.loads(text)
    for path, span in doc.spans.items():
        assert json.loads(text[span.start : span.end]) == doc.get(path), format_path(path)
        if span.key_start is not None:
            assert text[span.key_start :].startswith(json.dumps(path[-1]))


@pytest.mark.parametrize(
    "text",
    ['{"a": 1,}', '{"a" 1}', "[1, 2", '{"a": tru}', '{"a": 1} x', "", '{"a": "\\q"}', '\n\n  {"a": [1 2]}'],
)
def test_syntax_errors_match_json_positions(text):
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(JsonSyntaxError) as got:
        parse(text)
    assert (got.value.line, got.value.col) == (expected.value.lineno, expected.value.colno)


def test_qwen3_5_target_is_read_from_text_config_with_derived_layer_types(tmp_path):
    doc = parse(json.dumps(corpus.qwen35_target(), indent=2))
    target = load_target("config.json", doc)
    assert target.prefix == ("text_config",) and target.model_type == "qwen3_5_text"
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (16, 64, 248320)
    assert target.layer_types_derived
    assert target.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 4
    assert target.rope_theta == 10000000 and target.rope_scaling is None
    assert target.special_ids == {corpus.QWEN35_EOS: "eos_token"}
    line = int(target.where("num_hidden_layers").split(":")[1])
    assert '"num_hidden_layers": 16' in doc.text.splitlines()[line - 1]


def test_qwen3_target_is_flat_and_explicit_layer_types_win():
    config = corpus.qwen3_target()
    target = load_target("c.json", parse(json.dumps(config)))
    assert target.prefix == () and target.num_layers == 8 and target.layer_types is None
    config35 = corpus.qwen35_target()
    config35["text_config"]["layer_types"] = ["full_attention"] * 16
    target = load_target("c.json", parse(json.dumps(config35)))
    assert not target.layer_types_derived and target.layer_types == ["full_attention"] * 16


def test_tokenizer_files(tmp_path):
    corpus.write_qwen3_tokenizer(tmp_path)
    info = read_tokenizer(LocalStore(), str(tmp_path))
    assert info is not None and len(info.files) == 3
    assert info.use_of(151645).content == "<|im_end|>" and info.use_of(151645).kind == "eos_token"
    assert info.use_of(151667).kind == "added"  # <think> is added, not special
    assert info.use_of(corpus.QWEN3_MASK) is None and info.vocab["tok42"] == 42
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "special_tokens_map.json").unlink()
    assert read_tokenizer(LocalStore(), str(tmp_path)).use_of(151643).kind == "pad_token"
    (tmp_path / "tokenizer_config.json").unlink()
    assert read_tokenizer(LocalStore(), str(tmp_path)) is None


def test_sharded_headers_through_the_index(tmp_path):
    config = corpus.qwen3_drafter()
    corpus.write_drafter(tmp_path, config, shards=2)
    weights = read_weights(LocalStore(), str(tmp_path))
    assert len(weights.files) == 2 and not weights.problems
    assert weights.tensors["fc.weight"].shape == (64, 192) and weights.tensors["fc.weight"].dtype == "F16"


def test_spec_errors_name_file_line_and_fix(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nvalues:\n  block_size: 16\n  mask_tokn_id: 5\n")
    with pytest.raises(LintInputError, match=r"bad.yaml:4: unknown spec field 'mask_tokn_id'.*mask_token_id"):
        load_spec(str(bad))
    bad.write_text("name: x\nvalues:\n  block_size: true\n")
    with pytest.raises(LintInputError, match=r"bad.yaml:3: spec field 'block_size' has the wrong type bool"):
        load_spec(str(bad))
    bad.write_text("name: x\nvalus: {}\n")
    with pytest.raises(LintInputError, match="'values' mapping"):
        load_spec(str(bad))


def test_serve_config_finds_the_setting_anywhere(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("hosts:\n  gpu1:\n    serve:\n      mode: dflash\n      num_speculative_tokens: 15\n")
    setting = load_serve_config(str(path))
    assert (setting.value, setting.line) == (15, 5)
    path.write_text("mode: ddtree\n")
    assert load_serve_config(str(path)) is None
