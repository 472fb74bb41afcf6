"""Tensor names, dtypes and shapes from safetensors headers, never the tensor data.

Why: drafter weights can be tens of GB and may sit on a remote host; the facts lint needs (which
tensors exist, their shapes and dtype) are all in the header: an 8-byte little-endian length N,
then N bytes of JSON. Two ranged reads per file, whatever the file size. Sharded checkpoints name
their files in ``model.safetensors.index.json``.
"""

from __future__ import annotations

import itertools
import math
import posixpath
import struct
from dataclasses import dataclass, field

from drafter_config.source import LintInputError, loads, read_text
from specops_files.store import Store, join

INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
ITEM_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry."""

    name: str
    dtype: str  # safetensors spelling: BF16, F16, F32, ...
    shape: tuple[int, ...]
    file: str


@dataclass
class WeightSet:
    """All tensors of a checkpoint directory, and what could not be read."""

    files: list[str] = field(default_factory=list)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (file, message): DFL061
    escapes: list[tuple[str, str]] = field(default_factory=list)  # (index file, named path): DFL062
    bad_offsets: list[tuple[str, str]] = field(default_factory=list)  # (file, message): DFL063


def inside(name: str) -> bool:
    """Whether a shard name from an index stays inside the checkpoint directory (never opened otherwise)."""
    normal = posixpath.normpath(name)
    return (
        bool(name)
        and "\0" not in name
        and not posixpath.isabs(name)
        and normal != ".."
        and not normal.startswith("../")
    )


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_header(store: Store, path: str, size: int) -> tuple[list[TensorInfo], list[str]]:
    """The tensors of a ``size``-byte file's header, and what is wrong with their ``data_offsets``.

    ValueError names a header that cannot be read at all.
    """
    if size < 8:
        raise ValueError("file is shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", store.read_bytes(path, 0, 8))
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"header length {length} exceeds {MAX_HEADER_BYTES} bytes")
    if 8 + length > size:
        raise ValueError(
            f"header is truncated: its length {length} runs past the end of the {size}-byte file"
        )
    raw = store.read_bytes(path, 8, length)
    if len(raw) < length:
        raise ValueError(f"header is truncated ({len(raw)} of {length} bytes)")
    try:
        header = loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    tensors, problems, spans = [], [], []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("dtype"), str)
            and isinstance(entry.get("shape"), list)
            and all(_int(d) and d >= 0 for d in entry["shape"])
        ):
            raise ValueError(f"tensor {name!r} has no dtype/shape")
        tensors.append(TensorInfo(name, entry["dtype"], tuple(entry["shape"]), path))
        problem = _offsets_problem(name, entry, size - 8 - length)
        if problem:
            problems.append(problem)
        else:
            spans.append((*entry["data_offsets"], name))
    spans.sort()
    problems += [
        f"tensors {first!r} and {second!r} overlap (bytes {begin} to {end} of the data)"
        for (_, end, first), (begin, _, second) in itertools.pairwise(spans)
        if begin < end
    ]
    return tensors, problems


def _offsets_problem(name: str, entry: dict, data_size: int) -> str | None:
    offsets = entry.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_int(o) for o in offsets)):
        return f"tensor {name!r} has no [begin, end] data_offsets"
    begin, end = offsets
    if begin < 0 or end < begin:
        return f"tensor {name!r} has data_offsets [{begin}, {end}]: negative or reversed"
    if end > data_size:
        return (
            f"tensor {name!r} has data_offsets [{begin}, {end}] past the end of the data "
            f"({data_size} bytes after the header)"
        )
    item = ITEM_BYTES.get(entry["dtype"])
    if item is not None and end - begin != math.prod(entry["shape"]) * item:
        return (
            f"tensor {name!r} has data_offsets [{begin}, {end}] ({end - begin} bytes) but "
            f"{entry['dtype']} {entry['shape']} needs {math.prod(entry['shape']) * item}"
        )
    return None


def read_weights(store: Store, directory: str) -> WeightSet:
    """Headers of every safetensors file of a checkpoint directory (via the index when present)."""
    names = store.listdir(directory)
    weights = WeightSet()
    expected: dict[str, str] = {}
    if INDEX_FILE in names:
        index_path = join(directory, INDEX_FILE)
        try:
            weight_map = loads(read_text(store, index_path)).get("weight_map")
        except (ValueError, AttributeError, LintInputError):
            weight_map = None
        if not isinstance(weight_map, dict):
            weights.problems.append((index_path, "no readable weight_map"))
            weight_map = {}
        named = {v for v in weight_map.values() if isinstance(v, str)}
        weights.escapes = [(index_path, name) for name in sorted(named) if not inside(name)]
        expected = {k: v for k, v in weight_map.items() if isinstance(v, str) and inside(v)}
        files = sorted(set(expected.values()))
    else:
        files = [n for n in names if n.endswith(".safetensors")]
    for name in files:
        path = join(directory, name)
        info = store.stat(path)
        if info is None:
            weights.problems.append((path, f"listed in {INDEX_FILE} but missing"))
            continue
        if not info.is_file:
            weights.problems.append(
                (path, "not a regular file (a device, FIFO or directory, or a link to one)")
            )
            continue
        weights.files.append(path)
        try:
            tensors, bad = read_header(store, path, info.size)
        except ValueError as exc:
            weights.problems.append((path, f"unreadable safetensors header: {exc}"))
            continue
        weights.tensors.update((tensor.name, tensor) for tensor in tensors)
        weights.bad_offsets += [(path, problem) for problem in bad]
    for tensor, file in expected.items():
        found = weights.tensors.get(tensor)
        if found is not None and found.file != join(directory, file):
            weights.problems.append((found.file, f"{tensor} is in {found.file}, index says {file}"))
        elif found is None and join(directory, file) in weights.files:
            weights.problems.append(
                (join(directory, file), f"{INDEX_FILE} lists {tensor} but the header lacks it")
            )
    return weights
