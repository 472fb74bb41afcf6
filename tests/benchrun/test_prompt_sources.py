"""Hugging Face prompt sets as data: the ``hf:`` syntax, its errors in a matrix (file and line), and
the rows-to-JSONL conversion the host runs. The fetch itself runs on a real host in test_bench_host."""

from __future__ import annotations

import json

import pytest

from ops.bench.matrix import load_matrix
from ops.bench.prompts import DatasetRowsError, HfSpec, parse_hf_spec, prompt_set_name, rows_to_jsonl
from ops.errors import InputFileError


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("hf:openai/gsm8k@main:test:question", HfSpec("openai/gsm8k", "main", "test", "question")),
        ("hf:org/name", HfSpec("org/name", None, "train", "prompt")),
        ("hf:org/name:validation", HfSpec("org/name", None, "validation", "prompt")),
        ("hf:squad", HfSpec("squad", None, "train", "prompt")),
    ],
)
def test_hf_spec_parses_with_defaults_and_round_trips(text, spec):
    parsed = parse_hf_spec(text)
    assert parsed == spec and parse_hf_spec(parsed.text) == parsed


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("hf:", "'' is not a dataset name"),
        ("hf:org/a/b", "is not a dataset name"),
        ("hf:org name", "is not a dataset name"),
        ("hf:org/name:", "split '' is empty"),
        ("hf:org/name:test:", "column '' is empty"),
        ("hf:org/name@:test", "config '' is empty"),
        ("hf:org/name:a:b:c", "at most 3 are allowed"),
    ],
)
def test_hf_spec_errors_say_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words):
        parse_hf_spec(text)


def test_a_bad_hf_spec_in_a_matrix_names_file_line_and_syntax(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "workload:\n  prompts: [math, 'hf:org/name:test:']\nsystems:\n  - {system: ddtree, mode: ar}\n"
    )
    with pytest.raises(InputFileError) as err:
        load_matrix(path)
    assert err.value.line == 2 and "column '' is empty" in str(err.value)
    assert "hf:ORG/NAME[@CONFIG][:SPLIT[:COLUMN]]" in str(err.value)


def test_hf_cells_are_named_after_the_dataset(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "workload: {prompts: ['hf:openai/gsm8k@main:test:question', 'hf:openai/gsm8k@main:train:question']}\n"
        "systems:\n  - {system: ddtree, mode: ar}\n"
    )
    cells = load_matrix(path).cells
    assert [c.cell_id for c in cells] == [
        "ddtree-ar-hf-openai-gsm8k-main-test-question-t0-c1-o128",
        "ddtree-ar-hf-openai-gsm8k-main-train-question-t0-c1-o128",
    ]
    assert prompt_set_name("hf:org/name") == "hf-org-name-train-prompt"
    assert prompt_set_name("sets/mine.jsonl") == "mine" and prompt_set_name("math") == "math"


def test_rows_become_a_prompt_file_capped_and_without_empty_rows():
    spec = parse_hf_spec("hf:org/name:test:question")
    rows = ({"question": q, "answer": 1} for q in ["one", " ", "two", "three", "four"])
    lines = [json.loads(line) for line in rows_to_jsonl(rows, spec, limit=4).decode().splitlines()]
    assert lines == [
        {"id": "hf-org-name-test-question-0", "prompt": "one"},
        {"id": "hf-org-name-test-question-2", "prompt": "two"},
        {"id": "hf-org-name-test-question-3", "prompt": "three"},
    ]


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ([{"text": "a", "label": 0}], "has no column 'question' (it has 'text', 'label'; fix: name one"),
        ([{"question": ["a", "b"]}], "holds list, not text"),
        ([{"question": ""}], "gave no text in column 'question'"),
        ([], "gave no text"),
    ],
)
def test_unusable_rows_are_errors_naming_the_column(rows, words):
    with pytest.raises(DatasetRowsError, match=words.replace("(", r"\(")):
        rows_to_jsonl(iter(rows), parse_hf_spec("hf:org/name:test:question"))
