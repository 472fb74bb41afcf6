"""Tensor names, dtypes and shapes from safetensors headers, never the tensor data.

Why: drafter weights can be tens of GB and may sit on a remote host; the facts lint needs (which
tensors exist, their shapes and dtype) are all in the header: an 8-byte little-endian length N,
then N bytes of JSON. Two ranged reads per file, whatever the file size. Sharded checkpoints name
their files in ``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from drafter_config.source import LintInputError, read_text
from drafter_config.store import Store, join

INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024   # the safetensors format's own limit


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry."""

    name: str
    dtype: str            # safetensors spelling: BF16, F16, F32, ...
    shape: tuple[int, ...]
    file: str


@dataclass
class WeightSet:
    """All tensors of a checkpoint directory, and what could not be read."""

    files: list[str] = field(default_factory=list)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)   # (file, message)


def read_header(store: Store, path: str) -> list[TensorInfo]:
    """Parse one file's header; ValueError names what is wrong with it."""
    prefix = store.read_bytes(path, 0, 8)
    if len(prefix) < 8:
        raise ValueError("file is shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", prefix)
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"header length {length} exceeds {MAX_HEADER_BYTES} bytes")
    raw = store.read_bytes(path, 8, length)
    if len(raw) < length:
        raise ValueError(f"header is truncated ({len(raw)} of {length} bytes)")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
                and isinstance(entry.get("shape"), list)):
            raise ValueError(f"tensor {name!r} has no dtype/shape")
        tensors.append(TensorInfo(name, entry["dtype"], tuple(entry["shape"]), path))
    return tensors


def read_weights(store: Store, directory: str) -> WeightSet:
    """Headers of every safetensors file of a checkpoint directory (via the index when present)."""
    names = store.listdir(directory)
    weights = WeightSet()
    expected: dict[str, str] = {}
    if INDEX_FILE in names:
        index_path = join(directory, INDEX_FILE)
        try:
            weight_map = json.loads(read_text(store, index_path)).get("weight_map")
        except (json.JSONDecodeError, AttributeError, LintInputError):
            weight_map = None
        if not isinstance(weight_map, dict):
            weights.problems.append((index_path, "no readable weight_map"))
            weight_map = {}
        expected = {k: v for k, v in weight_map.items() if isinstance(v, str)}
        files = sorted(set(expected.values()))
    else:
        files = [n for n in names if n.endswith(".safetensors")]
    for name in files:
        path = join(directory, name)
        if store.stat(path) is None:
            weights.problems.append((path, f"listed in {INDEX_FILE} but missing"))
            continue
        weights.files.append(path)
        try:
            for tensor in read_header(store, path):
                weights.tensors[tensor.name] = tensor
        except ValueError as exc:
            weights.problems.append((path, f"unreadable safetensors header: {exc}"))
    for tensor, file in expected.items():
        found = weights.tensors.get(tensor)
        if found is not None and found.file != join(directory, file):
            weights.problems.append((found.file, f"{tensor} is in {found.file}, index says {file}"))
        elif found is None and join(directory, file) in weights.files:
            weights.problems.append((join(directory, file), f"{INDEX_FILE} lists {tensor} but the header lacks it"))
    return weights
