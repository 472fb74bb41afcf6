"""Shipped prompt sets and user prompt files."""

from __future__ import annotations

import pytest

from ops.bench.prompts import SHIPPED_DIR, load_prompts, shipped_sets
from ops.errors import InputFileError


def test_shipped_sets_are_a_few_dozen_distinct_prompts_each():
    assert shipped_sets() == ["chat", "code", "math"]
    texts = set()
    for name in shipped_sets():
        prompts = load_prompts(name)
        assert prompts.name == name and prompts.path == SHIPPED_DIR / f"{name}.jsonl"
        assert 24 <= len(prompts.prompts) <= 60
        assert all(p.id.startswith(f"{name}-") and 10 < len(p.text) < 300 for p in prompts.prompts)
        texts |= {p.text for p in prompts.prompts}
    assert len(texts) == sum(len(load_prompts(n).prompts) for n in shipped_sets())


def test_user_file_with_default_ids_and_extra_keys(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "Say hi.", "answer": "hi"}\n\n{"id": 7, "prompt": "Count to 3."}\n')
    prompts = load_prompts(str(path))
    assert prompts.name == "mine"
    assert [(p.id, p.text) for p in prompts.prompts] == [("mine-1", "Say hi."), ("7", "Count to 3.")]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('{"prompt": "a"}\n{"prompt": "b"\n', 2, "invalid JSON"),
        ('["a"]\n', 1, "expected a JSON object"),
        ('{"promt": "a"}\n', 1, "needs a non-empty string 'prompt', found keys 'promt'"),
        ('{"prompt": ""}\n', 1, "found prompt ''"),
        ('{"id": "x", "prompt": "a"}\n{"id": "x", "prompt": "b"}\n', 2, "duplicate id 'x' (first on line 1)"),
        ('{"id": [1], "prompt": "a"}\n', 1, "'id' must be a string"),
    ],
)
def test_bad_user_files_name_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(InputFileError) as err:
        load_prompts(path)
    assert str(err.value).startswith(f"{path}:{line}: ") and words in str(err.value)


def test_unknown_set_and_empty_file(tmp_path):
    with pytest.raises(InputFileError, match=r"^mth: unknown prompt set \(fix: use one of chat, code, math"):
        load_prompts("mth")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(InputFileError, match="no prompts"):
        load_prompts(tmp_path / "e.jsonl")
