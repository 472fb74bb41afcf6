"""Curation: duplicates and lengths filtered, a stable held-out split, a manifest that makes a rerun
a no-op, and self-distilled responses that resume after a torn write."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ddtree_runtime.train.curate import (
    CurationError,
    Filters,
    curate,
    read_prompts,
    regenerate,
    write_prompt_sets,
)

WORDS = [
    "the",
    "city",
    "was",
    "first",
    "made",
    "by",
    "new",
    "old",
    "great",
    "small",
    "north",
    "south",
    "east",
    "west",
    "red",
    "blue",
    "war",
    "state",
]
BASE = [" ".join(random.Random(i).choices(WORDS, k=12)) for i in range(30)]


def test_duplicates_lengths_and_split() -> None:
    prompts = [
        *BASE,
        BASE[0],
        "  " + BASE[0].upper().replace(" ", ", ", 2) + "!  ",
        BASE[1] + " also",
        "tiny",
        "x" * 5000,
    ]
    train, held, counts = curate(
        prompts, Filters(min_chars=8, max_chars=4000, near_dup_threshold=0.5, held_out_fraction=0.3)
    )
    assert counts["exact_dup"] == 2  # a repeat, and one differing only in case and punctuation
    assert counts["near_dup"] >= 1  # one extra word on a long prompt
    assert counts["too_short"] == 1 and counts["too_long"] == 1
    assert counts["train"] + counts["held_out"] == len(train) + len(held) == 30 - counts["near_dup"] + 1
    again, held_again, _ = curate(reversed(prompts), Filters(near_dup_threshold=0.5, held_out_fraction=0.3))
    both = (set(train) | set(held)) & (set(again) | set(held_again))
    assert both and all((p in held) == (p in held_again) for p in both)  # by content, not by order
    assert held, "a 30% split of 30 prompts holds some out"


def test_sources_and_manifest(tmp_path: Path) -> None:
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(
        json.dumps({"prompt": BASE[0]})
        + "\n"
        + json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": BASE[1]}]})
        + "\n"
    )
    txt = tmp_path / "b.txt"
    txt.write_text("\n".join(BASE[2:6]) + "\n")
    assert list(read_prompts(str(jsonl))) == BASE[:2]
    assert list(read_prompts(str(txt))) == BASE[2:6]
    out = tmp_path / "data"
    manifest = write_prompt_sets(out, [str(jsonl), str(txt)], Filters(held_out_fraction=0.0))
    assert manifest["counts"]["train"] == 6
    assert manifest["filters"]["near_dup_threshold"] == 0.8
    assert set(manifest["sha256"]) == {"prompts.train.jsonl", "prompts.held_out.jsonl"}
    stamp = (out / "prompts.train.jsonl").stat().st_mtime_ns
    assert write_prompt_sets(out, [str(jsonl), str(txt)], Filters(held_out_fraction=0.0)) == manifest
    assert (out / "prompts.train.jsonl").stat().st_mtime_ns == stamp  # nothing rewritten

    held = tmp_path / "held.txt"
    held.write_text(BASE[2] + "\n" + BASE[20] + "\n")
    split = write_prompt_sets(
        tmp_path / "split", [str(jsonl), str(txt)], Filters(held_out_fraction=0.0), held_sources=[str(held)]
    )
    assert split["counts"]["held_out"] == 2 and split["counts"]["exact_dup"] == 1  # BASE[2] stays held out
    assert (tmp_path / "split" / "prompts.held_out.jsonl").read_text().count("prompt") == 2

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine prompt here"}\n{"oops": 1}\n')
    with pytest.raises(CurationError, match=r"bad.jsonl:2: no prompt field"):
        list(read_prompts(str(bad)))


def test_regenerate_resumes_after_a_torn_line(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in BASE[:7]))
    out = tmp_path / "responses.jsonl"
    calls: list[list[str]] = []

    def gen(batch: list[str]) -> list[tuple[list[int], list[int]]]:
        calls.append(batch)
        return [([len(p)], [len(p) + 1, 2]) for p in batch]

    assert regenerate(prompts, out, gen, batch=3) == 7
    full = out.read_text()
    out.write_text("".join(full.splitlines(keepends=True)[:4]) + '{"id": 4, "prom')  # killed mid-write
    calls.clear()
    assert regenerate(prompts, out, gen, batch=3) == 3
    assert calls == [BASE[4:7]]
    assert sorted(out.read_text().splitlines()) == sorted(full.splitlines())
    assert regenerate(prompts, out, gen, batch=3) == 0

    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in [BASE[9], *BASE[1:7]]))  # one new
    calls.clear()
    assert regenerate(prompts, out, gen, batch=3) == 1 and calls == [[BASE[9]]]
    assert len(out.read_text().splitlines()) == 7  # the old first prompt's row is gone


def test_regenerate_takes_one_ranks_share(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in BASE[:7]))
    out = tmp_path / "r.jsonl"
    assert regenerate(prompts, out, lambda b: [([1], [2]) for _ in b], shard=(1, 3)) == 2
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [1, 4]


def test_a_missing_file_is_not_taken_for_a_dataset_name(tmp_path: Path) -> None:
    with pytest.raises(CurationError, match="no such file"):
        list(read_prompts(str(tmp_path / "prompts.txt")))
