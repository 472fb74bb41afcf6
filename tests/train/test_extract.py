"""Offline extraction: the disk need is checked before writing, and a run killed midway then resumed
leaves exactly the shards of an uninterrupted run."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from ddtree_runtime.loader import load_target
from ddtree_runtime.tiny import TinyPair
from ddtree_runtime.train.extract import (
    INDEX,
    ExtractionError,
    OfflineSamples,
    disk_need,
    extract_offline,
)
from ddtree_runtime.train.forward import TargetFeatures

LAYERS = (1, 2)


def _samples() -> list[tuple[list[int], int]]:
    rng = random.Random(0)
    return [([rng.randrange(5, 69) for _ in range(rng.randint(6, 14))], 3) for _ in range(7)]


class Killed(Exception):
    pass


def test_killed_and_resumed_extraction_gives_the_same_shards(raw_pair: TinyPair, tmp_path: Path) -> None:
    target = load_target(raw_pair.target, torch.device("cpu"), torch.float32)
    samples = _samples()
    whole = tmp_path / "whole"
    extract_offline(target, samples, LAYERS, whole, shard_size=2)

    def kill_after_two(done: int, total: int) -> None:
        if done == 2:
            raise Killed

    part = tmp_path / "part"
    with pytest.raises(Killed):
        extract_offline(target, samples, LAYERS, part, shard_size=2, progress=kill_after_two)
    (part / ".shard-00002.safetensors.tmp").write_bytes(b"half a shard")  # killed mid-write
    assert len(list(part.glob("shard-*.safetensors"))) == 2
    extract_offline(target, samples, LAYERS, part, shard_size=2)

    names = sorted(p.name for p in whole.glob("shard-*.safetensors"))
    assert names == [f"shard-{i:05d}.safetensors" for i in range(4)]
    for name in names:
        assert (part / name).read_bytes() == (whole / name).read_bytes()
    assert (part / INDEX).read_text() == (whole / INDEX).read_text()

    stored = OfflineSamples(part)
    assert [stored[j].tokens.tolist() for j in range(len(stored))] == [ids for ids, _ in samples]
    want = TargetFeatures(target, LAYERS)(stored[5].tokens).to(torch.bfloat16)
    assert torch.equal(stored[5].hidden, want) and stored[5].prompt_len == 3


def test_disk_need_is_checked_first(
    raw_pair: TinyPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 5 layers x 5120 x 2 bytes + 8 bytes of token id: ~51 KB per token, as for a 27B target
    assert disk_need([1000], 5, 5120, torch.bfloat16) == 1000 * (5 * 5120 * 2 + 8)
    target = load_target(raw_pair.target, torch.device("cpu"), torch.float32)

    class Tiny:
        free = 100

    monkeypatch.setattr("ddtree_runtime.train.extract.shutil.disk_usage", lambda _: Tiny)
    with pytest.raises(ExtractionError, match=r"needs .* but 100.0 B is free"):
        extract_offline(target, _samples(), LAYERS, tmp_path / "f", shard_size=2)
    assert not list((tmp_path / "f").glob("shard-*"))
    Tiny.free = disk_need([len(ids) for ids, _ in _samples()], 2, target.config.hidden_size, torch.bfloat16)
    with pytest.raises(ExtractionError, match="needs"):  # four ranks of a host share its disk
        extract_offline(target, _samples(), LAYERS, tmp_path / "f", shard_size=2, sharing=4)
    extract_offline(target, _samples(), LAYERS, tmp_path / "f", shard_size=2)
