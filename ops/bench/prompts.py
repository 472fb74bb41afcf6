"""Prompt sets for benchmarks: the shipped ``math``, ``code`` and ``chat`` sets, or a user JSONL file.

Why: acceptance (tau) depends heavily on the kind of text - math and code are far more predictable
than chat - so a benchmark must say which prompts it ran, and users must be able to bring their own.
A prompt file is JSONL, one object per line: ``{"id": "math-01", "prompt": "..."}``. ``prompt`` is
required; ``id`` defaults to ``<file stem>-<line>``; other keys are ignored (datasets often carry
answers or tags). Blank lines are skipped. The shipped sets are original short prompts written for
this project and installed as package data (``ops/bench/prompts/*.jsonl``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ops.errors import InputFileError

SHIPPED_DIR = Path(__file__).with_name("prompts")


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


@dataclass(frozen=True)
class PromptSet:
    name: str          # shipped set name, or the file's stem
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
            raise InputFileError(name_or_file, None, "unknown prompt set",
                                 f"use one of {', '.join(shipped_sets())}, or the path of a JSONL file")
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
            raise InputFileError(path, number, f"duplicate id {prompt.id!r} (first on line {seen[prompt.id]})",
                                 "give every prompt its own id")
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise InputFileError(path, None, "no prompts in the file", 'write one {"prompt": "..."} object per line')
    return PromptSet(name=path.stem, path=path, prompts=tuple(prompts))


def _parse_line(path: Path, number: int, line: str) -> Prompt:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputFileError(path, number, f"invalid JSON: {exc.msg} (column {exc.colno})",
                             "each line must hold one complete JSON object") from None
    if not isinstance(data, dict):
        raise InputFileError(path, number, f"expected a JSON object, got {type(data).__name__}",
                             'write {"prompt": "..."}')
    text = data.get("prompt")
    if not isinstance(text, str) or not text.strip():
        found = f"keys {', '.join(map(repr, data))}" if "prompt" not in data else f"prompt {text!r}"
        raise InputFileError(path, number, f"needs a non-empty string 'prompt', found {found}",
                             'write {"id": "q1", "prompt": "..."}')
    prompt_id = data.get("id", f"{path.stem}-{number}")
    if not isinstance(prompt_id, (str, int)) or isinstance(prompt_id, bool):
        raise InputFileError(path, number, f"'id' must be a string, got {prompt_id!r}")
    return Prompt(id=str(prompt_id), text=text)
