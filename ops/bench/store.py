"""Where results live on disk: ``<run-dir>/<host>/<cell-id>.json``, written atomically.

Why: a run copies many result files home over SFTP and may be killed midway. Each file is written
to a hidden temp name in the same directory and renamed into place, so a file named
``<cell-id>.json`` is always complete; resuming a run skips exactly the cells whose file exists
(``completed_cells``), and readers ignore hidden temp files. ``<run-dir>`` is
``results/<run-id>`` (the runner's directory for one run).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from ops.bench.cells import slug
from ops.bench.schema import SCHEMA_ID, BenchResult, SchemaError
from ops.errors import InputFileError, SpecopsError
from specops_files.jsonpos import JsonSyntaxError, parse
from specops_files.store import LocalStore


def cell_path(run_dir: str | Path, host: str, cell_id: str) -> Path:
    """The file one cell's result lives in."""
    return Path(run_dir) / host / f"{cell_id}.json"


def write_result(run_dir: str | Path, result: BenchResult) -> Path:
    """Validate ``result`` and write it atomically to its cell file; returns the path.

    ``result.host`` and ``result.cell_id`` name the file; ``result.run_id`` defaults to the run
    directory's name.
    """
    if not result.host or slug(result.host) != result.host:
        raise SpecopsError(
            f"result host {result.host!r} cannot name a directory "
            "(fix: use the inventory host name: letters, digits, . _ -)"
        )
    if not result.cell_id:
        raise SpecopsError("result has no cell_id (fix: set it, e.g. with cells.cell_id_for(result))")
    if result.run_id is None:
        result.run_id = Path(run_dir).resolve().name
    data = json.dumps(result.to_dict(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    path = cell_path(run_dir, result.host, result.cell_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    LocalStore().write_bytes(str(path), data.encode("utf-8"))
    return path


def load_result(path: str | Path) -> BenchResult:
    """Read one result file; every problem is an InputFileError naming file and line."""
    text = _read_text(path)
    try:
        doc = parse(text)
    except JsonSyntaxError as exc:
        raise InputFileError(path, exc.line, f"invalid JSON: {exc.reason}") from None
    try:
        return BenchResult.from_dict(doc.data)
    except SchemaError as exc:
        line, _ = doc.locate(_json_path(exc.field))
        raise InputFileError(path, line, f"field '{exc.field}': {exc.message}", exc.hint) from None


def completed_cells(run_dir: str | Path, host: str) -> set[str]:
    """Cell ids with a complete (valid) result for ``host``: what a resumed run skips."""
    host_dir = Path(run_dir) / host
    if not host_dir.is_dir():
        return set()
    done = set()
    for path in _json_files(host_dir):
        if _is_result(path):
            load_result(path)
            done.add(path.stem)
    return done


def find_results(paths: Iterable[str | Path]) -> list[tuple[Path, BenchResult]]:
    """All result files under the given files or directories (sorted, each file once).

    JSON files that are not results (``summary.json``, facts) are skipped; a file that claims to be
    a result but is invalid is an error, never silently dropped.
    """
    seen: dict[Path, BenchResult] = {}
    for given in paths:
        root = Path(given)
        if not root.exists():
            raise InputFileError(
                root, None, "no such file or directory", "pass a results directory such as results/<run-id>"
            )
        for file in [root] if root.is_file() else _json_files(root):
            real = file.resolve()
            if real not in seen and (root.is_file() or _is_result(file)):
                seen[real] = load_result(file)
    return sorted(seen.items(), key=lambda item: str(item[0]))


def _json_path(dotted: str) -> tuple[str | int, ...]:
    """``ttft_ms.p99`` -> ("ttft_ms", "p99"); ``per_position_acceptance[2]`` -> (..., 2)."""
    steps: list[str | int] = []
    for part in dotted.split("."):
        name, _, index = part.partition("[")
        steps.append(name)
        if index:
            steps.append(int(index.rstrip("]")))
    return tuple(steps)


def _json_files(root: Path) -> list[Path]:
    """Non-hidden ``*.json`` files below ``root``, not following symlinked dirs (``results/latest``)."""
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(
            Path(directory) / f for f in sorted(files) if f.endswith(".json") and not f.startswith(".")
        )
    return found


def _is_result(path: Path) -> bool:
    """Cheap check for the schema marker, so other JSON files in a run directory are skipped."""
    return f'"{SCHEMA_ID}"' in _read_text(path)


def _read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(path, None, f"cannot read: {exc}") from None
