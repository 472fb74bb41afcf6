"""A 50 GB safetensors file is linted from its header alone."""

from __future__ import annotations

import os
import time

from drafter_config import lint
from specops_files.store import LocalStore
from tests.lint import corpus

SIZE = 50 * 1024**3


class CountingStore(LocalStore):
    """The real local store, counting the bytes its reads return."""

    def __init__(self) -> None:
        self.bytes_read = 0

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        data = super().read_bytes(path, offset, length)
        self.bytes_read += len(data)
        return data


def _rchar() -> int:
    with open("/proc/self/io") as handle:
        return int(next(line for line in handle if line.startswith("rchar:")).split()[1])


def test_50gb_sparse_file_reads_only_the_header(tmp_path):
    config = corpus.qwen3_drafter()
    d = corpus.write_drafter(tmp_path / "drafter", config)
    weights = d / "model.safetensors"
    header_end = 8 + int.from_bytes(weights.read_bytes()[:8], "little")
    os.truncate(weights, header_end)  # keep the valid header, drop the data
    os.truncate(weights, SIZE)  # then a 50 GB hole
    assert weights.stat().st_size == SIZE and weights.stat().st_blocks * 512 < 10 * 1024**2

    store = CountingStore()
    rchar, start = _rchar(), time.perf_counter()
    report = lint(str(d), store=store)
    elapsed, read = time.perf_counter() - start, _rchar() - rchar

    assert report.findings == []  # the header describes every tensor the config expects
    assert store.bytes_read < 1024**2, store.bytes_read
    assert read < 1024**2, read
    print(
        f"50 GB sparse safetensors: {read} bytes read (rchar), {store.bytes_read} via the store, {elapsed:.3f} s"
    )
    assert elapsed < 5
