"""Prompt sets for benchmarks: the shipped ``math``, ``code`` and ``chat`` sets, or a user JSONL file.

Why: acceptance (tau) depends heavily on the kind of text - math and code are far more predictable
than chat - so a benchmark must say which prompts it ran, and users must be able to bring their own.
A prompt file is JSONL, one object per line: ``{"id": "math-01", "prompt": "..."}``. ``prompt`` is
required; ``id`` defaults to ``<file stem>-<line>``; other keys are ignored (datasets often carry
answers or tags). Blank lines are skipped. The shipped sets are original short prompts written for
this project and installed as package data (``ops/bench/prompts/*.jsonl``).

A Hugging Face dataset is named ``hf:ORG/NAME[@CONFIG][:SPLIT[:COLUMN]]`` (split ``train`` and
column ``prompt`` by default), e.g. ``hf:openai/gsm8k@main:test:question``. It is fetched on the
host, which has the network and the venv, by ``python -m ops.bench.prompts SPEC OUT``: the first
``HF_ROWS`` rows, streamed (never the whole dataset), written as a prompt file and renamed into
place, so a file that exists is complete and a re-run does not fetch again.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.errors import InputFileError

SHIPPED_DIR = Path(__file__).with_name("prompts")
HF_PREFIX = "hf:"
HF_ROWS = 512
HF_SYNTAX = "hf:ORG/NAME[@CONFIG][:SPLIT[:COLUMN]], e.g. hf:openai/gsm8k@main:test:question"
_HF_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_HF_PART = re.compile(r"[\w.-]+")


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


@dataclass(frozen=True)
class PromptSet:
    name: str  # shipped set name, or the file's stem
    path: Path
    prompts: tuple[Prompt, ...]


def shipped_sets() -> list[str]:
    """Names of the prompt sets that ship with specops."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.jsonl"))


def load_prompts(name_or_file: str | Path) -> PromptSet:
    """A shipped set by name, or a JSONL file by path; errors name file and line."""
    path = Path(name_or_file)
    if not path.is_file():
        if str(name_or_file) not in shipped_sets():
            raise InputFileError(
                name_or_file,
                None,
                "unknown prompt set",
                f"use one of {', '.join(shipped_sets())}, or the path of a JSONL file",
            )
        path = SHIPPED_DIR / f"{name_or_file}.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(path, None, f"cannot read: {exc}") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        prompt = _parse_line(path, number, line)
        if prompt.id in seen:
            raise InputFileError(
                path,
                number,
                f"duplicate id {prompt.id!r} (first on line {seen[prompt.id]})",
                "give every prompt its own id",
            )
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise InputFileError(
            path, None, "no prompts in the file", 'write one {"prompt": "..."} object per line'
        )
    return PromptSet(name=path.stem, path=path, prompts=tuple(prompts))


def _parse_line(path: Path, number: int, line: str) -> Prompt:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputFileError(
            path,
            number,
            f"invalid JSON: {exc.msg} (column {exc.colno})",
            "each line must hold one complete JSON object",
        ) from None
    if not isinstance(data, dict):
        raise InputFileError(
            path, number, f"expected a JSON object, got {type(data).__name__}", 'write {"prompt": "..."}'
        )
    text = data.get("prompt")
    if not isinstance(text, str) or not text.strip():
        found = f"keys {', '.join(map(repr, data))}" if "prompt" not in data else f"prompt {text!r}"
        raise InputFileError(
            path,
            number,
            f"needs a non-empty string 'prompt', found {found}",
            'write {"id": "q1", "prompt": "..."}',
        )
    prompt_id = data.get("id", f"{path.stem}-{number}")
    if not isinstance(prompt_id, (str, int)) or isinstance(prompt_id, bool):
        raise InputFileError(path, number, f"'id' must be a string, got {prompt_id!r}")
    return Prompt(id=str(prompt_id), text=text)


class DatasetRowsError(ValueError):
    """The dataset was read, but its rows hold no usable prompts in the named column."""


@dataclass(frozen=True)
class HfSpec:
    """A prompt set read from a Hugging Face dataset column."""

    dataset: str
    config: str | None = None
    split: str = "train"
    column: str = "prompt"

    @property
    def text(self) -> str:
        config = f"@{self.config}" if self.config else ""
        return f"{HF_PREFIX}{self.dataset}{config}:{self.split}:{self.column}"

    @property
    def name(self) -> str:
        """The prompt set's name in results, and the stem of its file on the host."""
        parts = ["hf", self.dataset.replace("/", "-"), self.config or "", self.split, self.column]
        return "-".join(p for p in parts if p)


def parse_hf_spec(text: str) -> HfSpec:
    """``hf:ORG/NAME[@CONFIG][:SPLIT[:COLUMN]]`` to a spec; ValueError says what is wrong."""
    if not text.startswith(HF_PREFIX):
        raise ValueError(f"{text!r} does not start with {HF_PREFIX!r}")
    parts = text[len(HF_PREFIX) :].split(":")
    if len(parts) > 3:
        raise ValueError(f"{text!r} has {len(parts)} ':'-separated parts after 'hf:', at most 3 are allowed")
    dataset, _, config = parts[0].partition("@")
    if not _HF_NAME.fullmatch(dataset):
        raise ValueError(f"{text!r}: {dataset!r} is not a dataset name like ORG/NAME")
    if "@" in parts[0] and not _HF_PART.fullmatch(config):
        raise ValueError(f"{text!r}: config {config!r} is empty or has odd characters")
    for what, value in zip(("split", "column"), parts[1:], strict=False):
        if not _HF_PART.fullmatch(value):
            raise ValueError(f"{text!r}: {what} {value!r} is empty or has odd characters")
    split, column = (parts[1:] + ["train", "prompt"][len(parts) - 1 :])[:2]
    return HfSpec(dataset=dataset, config=config or None, split=split, column=column)


def prompt_set_name(prompts: str) -> str:
    """The name results carry for a matrix ``prompts`` value: set name, dataset name or file stem."""
    if prompts.startswith(HF_PREFIX):
        return parse_hf_spec(prompts).name
    return Path(prompts).stem if prompts.endswith(".jsonl") else prompts


def rows_to_jsonl(rows: Iterable[Mapping[str, Any]], spec: HfSpec, limit: int = HF_ROWS) -> bytes:
    """Pure: dataset rows to a prompt file of at most ``limit`` prompts; rows with an empty column
    are skipped, a missing or non-text column is an error naming the columns there are."""
    lines = []
    for index, row in enumerate(itertools.islice(rows, limit)):
        if spec.column not in row:
            raise DatasetRowsError(
                f"dataset {spec.dataset} has no column {spec.column!r} (it has "
                f"{', '.join(map(repr, row))}; fix: name one, e.g. {HF_PREFIX}{spec.dataset}:"
                f"{spec.split}:COLUMN)"
            )
        value = row[spec.column]
        if not isinstance(value, str):
            raise DatasetRowsError(
                f"dataset {spec.dataset} column {spec.column!r} holds {type(value).__name__}, "
                "not text (fix: name a text column)"
            )
        if value.strip():
            lines.append(json.dumps({"id": f"{spec.name}-{index}", "prompt": value}) + "\n")
    if not lines:
        raise DatasetRowsError(
            f"dataset {spec.dataset} split {spec.split!r} gave no text in column {spec.column!r}"
        )
    return "".join(lines).encode("utf-8")


def fetch_hf(spec: HfSpec, out: Path) -> None:
    """Runs on the host: stream the dataset's first rows into ``out`` (written aside, then renamed)."""
    try:
        import datasets  # the host's optional dependency, needed only here
    except ImportError:
        raise RuntimeError(
            f"dataset {spec.dataset}: {sys.executable} has no 'datasets' module (fix: "
            f"{Path(sys.executable).parent}/pip install datasets, or give a JSONL file)"
        ) from None
    try:
        rows = datasets.load_dataset(spec.dataset, spec.config, split=spec.split, streaming=True)
        data = rows_to_jsonl(rows, spec)
    except DatasetRowsError:
        raise
    except Exception as exc:  # the library raises many kinds; all mean "could not fetch"
        raise RuntimeError(
            f"dataset {spec.dataset}: cannot load split {spec.split!r}: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]} (fix: the host needs internet access to "
            "huggingface.co, or give a JSONL file)"
        ) from None
    partial = out.with_name(f".{out.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, out)


def main(argv: list[str] | None = None) -> int:
    """``python -m ops.bench.prompts SPEC OUT``: one line on stderr and exit 1 when it cannot."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(f"usage: python -m ops.bench.prompts {HF_SYNTAX.split(',')[0]} OUT.jsonl", file=sys.stderr)
        return 2
    try:
        fetch_hf(parse_hf_spec(args[0]), Path(args[1]))
    except (ValueError, RuntimeError, OSError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
