"""Target hidden states at the drafter's `target_layer_ids`: computed in the loop (online) or
stored once as sharded safetensors (offline).

Online costs a target forward per step and no disk; it is the default. Offline pays the disk once
(`disk_need` says how much before anything is written) and lets many epochs or runs reuse it. In a
job over several ranks (and hosts) each rank extracts only its own samples, into a folder of its
own on its host's disk, so the shards spread over the hosts that train on them.
Shards are written to a temporary name and renamed, and the index is rewritten after each shard,
so a killed extraction leaves only whole shards and a rerun resumes at the first missing one. Each
sample is run alone, so a shard's bytes do not depend on where a run was interrupted.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from ddtree_runtime.models.target import Target
from ddtree_runtime.train.forward import TargetFeatures

INDEX = "index.json"
BYTES = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4}


class ExtractionError(RuntimeError):
    """Offline extraction cannot proceed; the message says why and what to change."""


@dataclass(frozen=True)
class Sample:
    tokens: Tensor  # [T] int64: prompt + response
    prompt_len: int
    hidden: Tensor | None = None  # [T, n_ids * hidden] when read from shards


def disk_need(lengths: list[int], n_layers: int, hidden: int, dtype: torch.dtype) -> int:
    """Bytes the shards will take: features plus the int64 tokens, per token."""
    return sum(lengths) * (n_layers * hidden * BYTES[dtype] + 8)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000:
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def extract_offline(
    target: Target,
    samples: list[tuple[list[int], int]],
    layer_ids: tuple[int, ...],
    out: Path,
    shard_size: int = 256,
    dtype: torch.dtype = torch.bfloat16,
    progress: Callable[[int, int], None] | None = None,
    sharing: int = 1,
) -> dict[str, object]:
    """Write the shards that are missing under `out` and return the index. `sharing` processes
    extract as much at once onto the same disk (the ranks of a host): the free space must hold all."""
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / INDEX
    n_shards = (len(samples) + shard_size - 1) // shard_size
    index: dict[str, object] = {
        "layer_ids": list(layer_ids),
        "hidden_size": target.config.hidden_size,
        "dtype": str(dtype).removeprefix("torch."),
        "num_samples": len(samples),
        "shard_size": shard_size,
        "shards": [],
    }
    if index_path.exists():
        index["shards"] = _kept_shards(index_path, index)
    done = {s["file"] for s in index["shards"]}  # type: ignore[union-attr]
    todo = [i for i in range(n_shards) if f"shard-{i:05d}.safetensors" not in done]
    need = disk_need(
        [len(samples[j][0]) for i in todo for j in _rows(i, shard_size, len(samples))],
        len(layer_ids),
        target.config.hidden_size,
        dtype,
    )
    _check_free(out, need * sharing)
    features = TargetFeatures(target, layer_ids)
    for i in todo:
        shard = _write_shard(features, samples, i, shard_size, dtype, out)
        index["shards"].append(shard)  # type: ignore[union-attr]
        index["shards"].sort(key=lambda s: s["first"])  # type: ignore[union-attr]
        write_json(index_path, index)
        if progress is not None:
            progress(len(index["shards"]), n_shards)  # type: ignore[arg-type]
    write_json(index_path, index)
    return index


def _kept_shards(index_path: Path, index: dict[str, object]) -> list[dict[str, object]]:
    """The shards an earlier run listed in `index_path` that are still on disk; the earlier settings
    must match `index`'s."""
    old = json.loads(index_path.read_text())
    if {k: old.get(k) for k in index if k != "shards"} != {k: v for k, v in index.items() if k != "shards"}:
        raise ExtractionError(
            f"{index_path}: written for other settings (fix: use a new directory or delete this one)"
        )
    return [s for s in old["shards"] if (index_path.parent / s["file"]).exists()]


def _check_free(out: Path, need: int) -> None:
    """Refuse before writing anything when `need` bytes would not fit under `out`."""
    free = shutil.disk_usage(out).free
    if need > free:
        raise ExtractionError(
            f"{out}: extraction needs {human_bytes(need)} but {human_bytes(free)} is free "
            "(fix: free space, or use online extraction)"
        )


def _write_shard(
    features: TargetFeatures,
    samples: list[tuple[list[int], int]],
    shard: int,
    shard_size: int,
    dtype: torch.dtype,
    out: Path,
) -> dict[str, object]:
    """Run the target on the shard's samples and write them atomically; returns its index entry."""
    tensors: dict[str, Tensor] = {}
    rows = _rows(shard, shard_size, len(samples))
    for j in rows:
        ids, prompt_len = samples[j]
        tokens = torch.tensor(ids, dtype=torch.int64)
        tensors[f"hidden.{j}"] = features(tokens).to(dtype).contiguous()
        tensors[f"tokens.{j}"] = tokens
        tensors[f"prompt_len.{j}"] = torch.tensor([prompt_len])
    name = f"shard-{shard:05d}.safetensors"
    tmp = out / f".{name}.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})  # metadata order is not stable: no more
    os.replace(tmp, out / name)
    return {"file": name, "first": shard * shard_size, "count": len(rows)}


def _rows(shard: int, shard_size: int, total: int) -> range:
    return range(shard * shard_size, min(total, (shard + 1) * shard_size))


def write_json(path: Path, data: object) -> None:
    """Atomically, and not at all when the file already holds this (a rerun leaves files untouched)."""
    text = json.dumps(data, indent=2) + "\n"
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class OfflineSamples:
    """The samples stored under `out`, by index (opened lazily, one shard file at a time)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.index = json.loads((out / INDEX).read_text())
        if sum(s["count"] for s in self.index["shards"]) < self.index["num_samples"]:
            raise ExtractionError(f"{out}: extraction is incomplete (fix: rerun to resume it)")
        self.file: tuple[str, Any] | None = None

    def __len__(self) -> int:
        return int(self.index["num_samples"])

    def __getitem__(self, j: int) -> Sample:
        shard = self.index["shards"][j // self.index["shard_size"]]
        if self.file is None or self.file[0] != shard["file"]:
            self.file = (shard["file"], safe_open(str(self.out / shard["file"]), framework="pt"))
        f = self.file[1]
        return Sample(
            f.get_tensor(f"tokens.{j}"), int(f.get_tensor(f"prompt_len.{j}")[0]), f.get_tensor(f"hidden.{j}")
        )
