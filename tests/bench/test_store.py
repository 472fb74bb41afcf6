"""Results on disk: layout, atomic writes, resume bookkeeping and errors that name file and line."""

from __future__ import annotations

import json
import os

import pytest

from ops.bench.schema import BenchResult
from ops.bench.store import cell_path, completed_cells, find_results, load_result, write_result
from ops.errors import InputFileError, SpecopsError
from tests.bench.samples import native


def test_layout_is_run_host_cell(tmp_path):
    run = tmp_path / "results" / "20261202-150000-bench-ab12"
    path = native(run, "gpu1", "ddtree", "ddtree", 100.0, budget=64, counters=(10, 640, 40))
    assert path == cell_path(run, "gpu1", "ddtree-ddtree-b64-math-t0-c1-o256")
    assert path == run / "gpu1" / "ddtree-ddtree-b64-math-t0-c1-o256.json"
    loaded = load_result(path)
    assert loaded.run_id == run.name and loaded.tau == 5.0
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind


def test_a_failed_write_never_leaves_a_partial_result(tmp_path, monkeypatch):
    run = tmp_path / "run"
    first = native(run, "gpu1", "ddtree", "ar", 40.0)
    before = first.read_bytes()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        native(run, "gpu1", "ddtree", "ar", 41.0)
    assert first.read_bytes() == before  # the complete old file is intact
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]


def test_hidden_temp_files_and_foreign_json_are_not_results(tmp_path):
    run = tmp_path / "run"
    path = native(run, "gpu1", "ddtree", "ar", 40.0)
    (path.parent / f".{path.name}.x1y2.tmp").write_text('{"schema": "specops.bench.result", "sys')
    (run / "summary.json").write_text(json.dumps({"run_id": "run", "hosts": {}}))
    (path.parent / "facts.json").write_text("[1, 2]")
    (run / "gpu1" / "server.log").write_text("log")
    assert [p for p, _ in find_results([run])] == [path.resolve()]
    assert completed_cells(run, "gpu1") == {path.stem}
    assert completed_cells(run, "gpu9") == set()


def test_results_dirs_reached_twice_count_once(tmp_path):
    root = tmp_path / "results"
    native(root / "r1", "gpu1", "ddtree", "ar", 40.0)
    (root / "latest").symlink_to("r1")
    assert len(find_results([root, root / "r1", root / "latest"])) == 1


def test_invalid_result_file_error_names_file_line_and_field(tmp_path):
    run = tmp_path / "run"
    path = native(run, "gpu1", "ddtree", "ddtree", 100.0, budget=64, counters=(10, 640, 40))
    data = json.loads(path.read_text())
    data["ttft_ms"]["p99"] = "slow"
    path.write_text(json.dumps(data, indent=2))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if '"slow"' in text)
    with pytest.raises(InputFileError) as err:
        find_results([run])
    assert str(err.value).startswith(f"{path}:{line}: field 'ttft_ms.p99': expected a number")
    path.write_text('{"schema": "specops.bench.result",\n "system": }')
    with pytest.raises(InputFileError, match=rf"^{path}:2: invalid JSON"):
        completed_cells(run, "gpu1")


def test_write_refuses_results_that_cannot_name_their_file(tmp_path):
    with pytest.raises(SpecopsError, match="cannot name a directory"):
        write_result(tmp_path, BenchResult(system="vllm", mode="ar", host="a/b", cell_id="c"))
    with pytest.raises(SpecopsError, match="no cell_id"):
        write_result(tmp_path, BenchResult(system="vllm", mode="ar", host="gpu1"))
    with pytest.raises(InputFileError, match="no such file or directory"):
        find_results([tmp_path / "missing"])
