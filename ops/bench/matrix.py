"""The benchmark matrix file: which servers to start, and which workload cells to run on each.

Why a file: a benchmark is a product of choices (system x mode x budget x prompts x temperature x
concurrency x output length); writing it as data keeps ``fab bench`` and ``fab tune`` one code path,
lets a user keep their own matrix beside the shipped ones, and gives every cell a stable id
(``cells.cell_id_for``) so a resumed run skips exactly the cells already done. Format::

    workload:                       # defaults for every system; scalars or lists (lists multiply)
      prompts: [math]               # shipped set names, JSONL files (beside the matrix file), or
                                    # hf:ORG/NAME[@CONFIG][:SPLIT[:COLUMN]] (default split train,
                                    # column prompt): a Hugging Face dataset, fetched on the host
                                    # (its venv needs `datasets`, the host internet) once, into
                                    # <base>/results/prompts/ (ops/bench/prompts.py)
      temperature: [0]
      concurrency: [1]              # clients in flight at once; [1, 4, 16, 64] sweeps (the report
                                    # plots tokens/s and TTFT against it)
      output_len: [128]
      num_prompts: 16               # measured requests per cell (at least its concurrency, so
                                    # every client has a request)
      warmup: 2                     # unmeasured requests per cell
    systems:
      - system: ddtree              # ddtree (our server) | vllm | sglang
        mode: ddtree                # ar | dflash | ddtree (ours); dflash | mtp (vllm); mtp | eagle (sglang)
        budget: [16, 32, 64]        # ddtree only: one server per budget
        # num_speculative_tokens: [7, 15]   vllm/sglang: one server per value
        # template: serve-vllm.argv.j2      vllm/sglang: the server's command line, one argument a line
        #                                   (default: the one fab deploy uses, templates/serve-<system>.argv.j2)
        # min_tau: 2.0                      the acceptance gate (fab deploy's) before the cells: the
        #                                   server's own /metrics counters, a number or {mode: number}
        # port: 8100                        vllm/sglang: where it listens (default 8100); a server
        #                                   already answering there whose /v1/models lists the served
        #                                   model (vars.served_name, default the target) is reused,
        #                                   not started, and left running afterwards
        # vars: {venv: ...}                 more template variables (venv: default <base>/venvs/<system>)
        # workload: {...}                   overrides for this system's cells
        # stay: true                        leave this server running afterwards
        # enabled: false                    keep the entry, skip it

One entry with list-valued ``budget`` or ``num_speculative_tokens`` is several servers; each server
runs every workload cell. Servers run one at a time (one GPU, one model).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.bench.cells import cell_id_for, slug
from ops.bench.prompts import HF_PREFIX, HF_SYNTAX, parse_hf_spec, prompt_set_name
from ops.bench.schema import SYSTEMS, BenchResult
from ops.errors import InputFileError
from ops.service.systems import SYSTEMS as SERVING
from ops.service.thresholds import min_tau_arg
from ops.yamlfile import line_of, load_yaml, plain
from specops_contract import MODES, SERVE_DEFAULTS

OUR_MODES = MODES
FOREIGN_MODES = {name: SERVING[name].modes for name in ("vllm", "sglang")}
DEFAULT_TEMPLATES = {name: SERVING[name].template for name in ("vllm", "sglang")}  # shared with fab deploy
DEFAULT_FOREIGN_PORT = 8100
WORKLOAD_LISTS = ("prompts", "temperature", "concurrency", "output_len")
WORKLOAD_DEFAULTS: dict[str, Any] = {
    "prompts": ["math"],
    "temperature": [0.0],
    "concurrency": [1],
    "output_len": [128],
    "num_prompts": 16,
    "warmup": 2,
}
SYSTEM_KEYS = (
    "system",
    "mode",
    "budget",
    "num_speculative_tokens",
    "block_size",
    "template",
    "port",
    "vars",
    "workload",
    "stay",
    "enabled",
    "name",
    "min_tau",
)


@dataclass(frozen=True)
class Cell:
    """One measured workload on one server."""

    cell_id: str
    prompts: str
    temperature: float
    concurrency: int
    output_len: int
    num_prompts: int
    warmup: int


@dataclass
class Server:
    """One server instance of the matrix and the cells it runs."""

    label: str
    system: str
    mode: str
    budget: int | None = None
    num_speculative_tokens: int | None = None
    block_size: int | None = None
    template: str | None = None
    port: int | None = None
    vars: dict[str, Any] = field(default_factory=dict)
    stay: bool = False
    min_tau: float | dict[str, float] | None = None  # the acceptance gate before its cells
    cells: list[Cell] = field(default_factory=list)
    line: int = 0


@dataclass
class Matrix:
    path: Path
    servers: list[Server]

    @property
    def cells(self) -> list[Cell]:
        return [c for s in self.servers for c in s.cells]


def load_matrix(path: str | Path, overrides: dict[str, Any] | None = None) -> Matrix:
    """Read and expand a matrix file; errors name the file, line and key. ``overrides`` replace
    ``workload`` keys of every system (``fab tune`` narrows the prompt set and lengths this way)."""
    path = Path(path)
    try:
        doc = load_yaml(path.read_text(), path)
    except OSError as exc:
        raise InputFileError(
            path,
            None,
            f"cannot read the matrix: {exc.strerror}",
            "pass --matrix FILE, e.g. playbooks/bench-matrix.yaml",
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("systems"), list) or not doc["systems"]:
        raise InputFileError(
            path, 1, "a matrix is a mapping with a non-empty 'systems' list", "see ops/bench/matrix.py"
        )
    for key in doc:
        if key not in ("workload", "systems"):
            raise InputFileError(
                path, _line(doc, key), f"unknown key '{key}'", "use 'workload' and 'systems'"
            )
    base = _workload(path, doc.get("workload") or {}, dict(WORKLOAD_DEFAULTS), _line(doc, "workload"))
    servers: list[Server] = []
    for index, entry in enumerate(doc["systems"]):
        line = doc["systems"].item_lines[index] if hasattr(doc["systems"], "item_lines") else 0
        servers += _servers(path, entry, base, overrides or {}, line)
    if not servers:
        raise InputFileError(path, _line(doc, "systems"), "every system is disabled", "enable at least one")
    seen: dict[str, int] = {}
    for server in servers:
        for cell in server.cells:
            if cell.cell_id in seen:
                raise InputFileError(
                    path,
                    server.line,
                    f"cell {cell.cell_id} appears twice (first on line {seen[cell.cell_id]})",
                    "give the entries different settings",
                )
            seen[cell.cell_id] = server.line
    return Matrix(path=path, servers=servers)


def _line(mapping: Any, key: str) -> int:
    return line_of(mapping, key)


def _workload(path: Path, raw: Any, base: dict[str, Any], line: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InputFileError(
            path, line, "'workload' must be a mapping", "e.g. {prompts: [math], output_len: [128]}"
        )
    out = dict(base)
    for key, value in raw.items():
        where = _line(raw, key) or line
        if key not in WORKLOAD_DEFAULTS:
            raise InputFileError(
                path, where, f"unknown workload key '{key}'", f"use {', '.join(WORKLOAD_DEFAULTS)}"
            )
        if key in WORKLOAD_LISTS:
            values = value if isinstance(value, list) else [value]
            kind = {"prompts": str, "temperature": float, "concurrency": int, "output_len": int}[key]
            out[key] = [_typed(path, where, key, v, kind) for v in values]
            for value in out[key] if key == "prompts" else ():
                if value.startswith(HF_PREFIX):
                    _hf_spec(path, where, value)
            if not out[key]:
                raise InputFileError(path, where, f"workload '{key}' is empty", "give at least one value")
        else:
            out[key] = _typed(path, where, key, value, int, minimum=1 if key == "num_prompts" else 0)
    return out


def _hf_spec(path: Path, line: int, value: str) -> None:
    try:
        parse_hf_spec(value)
    except ValueError as exc:
        raise InputFileError(path, line, f"prompt set {exc}", f"write {HF_SYNTAX}") from None


def _typed(path: Path, line: int, key: str, value: Any, kind: type, minimum: float | None = None) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputFileError(path, line, f"'{key}': expected {kind.__name__}, got {value!r}")
    try:
        typed = kind(value)
    except ValueError:
        raise InputFileError(path, line, f"'{key}': expected {kind.__name__}, got {value!r}") from None
    if kind is int and float(value) != typed:
        raise InputFileError(path, line, f"'{key}': expected a whole number, got {value!r}")
    low = minimum if minimum is not None else (0 if key == "temperature" else 1 if kind is not str else None)
    if low is not None and typed < low:
        raise InputFileError(path, line, f"'{key}': must be >= {low}, got {value!r}")
    return typed


def _servers(
    path: Path, entry: Any, base: dict[str, Any], overrides: dict[str, Any], line: int
) -> list[Server]:
    _check_system_keys(path, entry, line)
    if entry.get("enabled", True) is False:
        return []
    system, mode = _system_mode(path, entry, line)
    work = _workload(path, entry.get("workload") or {}, base, _line(entry, "workload") or line)
    work = _workload(path, overrides, work, line) if overrides else work
    settings = _server_settings(path, entry, system, mode, line)
    if system != "ddtree" and not isinstance(entry.get("vars", {}), dict):
        raise InputFileError(path, _line(entry, "vars") or line, "'vars' must be a mapping")
    keys = list(settings)
    return [
        _server(path, entry, system, mode, line, dict(zip(keys, combo, strict=True)), work)
        for combo in (itertools.product(*(settings[k] for k in keys)) if keys else [()])
    ]


def _check_system_keys(path: Path, entry: Any, line: int) -> None:
    """A system entry is a mapping of known keys only."""
    if not isinstance(entry, dict):
        raise InputFileError(path, line, "each system is a mapping with 'system' and 'mode'")
    for key in entry:
        if key not in SYSTEM_KEYS:
            raise InputFileError(
                path,
                _line(entry, key) or line,
                f"unknown system key '{key}'",
                f"use {', '.join(SYSTEM_KEYS)}",
            )


def _system_mode(path: Path, entry: dict[str, Any], line: int) -> tuple[str, str]:
    """The entry's system and a mode that system has."""
    system, mode = entry.get("system"), entry.get("mode")
    if system not in SYSTEMS:
        raise InputFileError(
            path,
            _line(entry, "system") or line,
            f"system {system!r} is unknown",
            f"use one of {', '.join(SYSTEMS)}",
        )
    modes = OUR_MODES if system == "ddtree" else FOREIGN_MODES[system]
    if mode not in modes:
        raise InputFileError(
            path,
            _line(entry, "mode") or line,
            f"mode {mode!r} is not a {system} mode",
            f"use one of {', '.join(modes)}",
        )
    return system, mode


def _server_settings(
    path: Path, entry: dict[str, Any], system: str, mode: str, line: int
) -> dict[str, list[int]]:
    """The per-server integer settings, each a list of values (one server per combination)."""
    settings = {}
    for key in ("budget", "num_speculative_tokens", "block_size"):
        raw = entry.get(key)
        if raw is None:
            continue
        if key == "budget" and not (system == "ddtree" and mode == "ddtree"):
            raise InputFileError(
                path,
                _line(entry, key) or line,
                "'budget' applies to system ddtree, mode ddtree only",
                "use num_speculative_tokens for vllm/sglang",
            )
        values = raw if isinstance(raw, list) else [raw]
        settings[key] = [_typed(path, _line(entry, key) or line, key, v, int) for v in values]
    if system == "ddtree" and mode == "ddtree" and "budget" not in settings:
        settings["budget"] = [SERVE_DEFAULTS["budget"]]
    return settings


def _min_tau(path: Path, entry: dict[str, Any], line: int) -> float | dict[str, float] | None:
    try:
        return min_tau_arg(plain(entry.get("min_tau")))
    except ValueError as exc:
        raise InputFileError(path, _line(entry, "min_tau") or line, str(exc), "e.g. min_tau: 2.0") from None


def _server(
    path: Path,
    entry: dict[str, Any],
    system: str,
    mode: str,
    line: int,
    chosen: dict[str, int],
    work: dict[str, Any],
) -> Server:
    """One server of the entry (one combination of its settings), with every workload cell."""
    server = Server(
        label="",
        system=system,
        mode=mode,
        line=line,
        stay=entry.get("stay") is True,
        template=entry.get("template") or DEFAULT_TEMPLATES.get(system),
        port=None if system == "ddtree" else int(entry.get("port") or DEFAULT_FOREIGN_PORT),
        vars=plain(entry.get("vars") or {}),
        min_tau=_min_tau(path, entry, line),
        **chosen,
    )
    probe = BenchResult(
        system=system,
        mode=mode,
        budget=server.budget,
        block_size=server.block_size,
        num_speculative_tokens=server.num_speculative_tokens,
    )
    server.label = slug(entry.get("name") or cell_id_for(probe))
    server.cells = [
        _cell(server, probe, p, t, c, o, work)
        for p, t, c, o in itertools.product(
            work["prompts"], work["temperature"], work["concurrency"], work["output_len"]
        )
    ]
    return server


def _cell(
    server: Server,
    probe: BenchResult,
    prompts: str,
    temperature: float,
    concurrency: int,
    output_len: int,
    work: dict[str, Any],
) -> Cell:
    name = prompt_set_name(prompts)
    probe = BenchResult(
        system=probe.system,
        mode=probe.mode,
        budget=probe.budget,
        block_size=probe.block_size,
        num_speculative_tokens=probe.num_speculative_tokens,
        prompt_set=name,
        temperature=temperature,
        concurrency=concurrency,
        output_len=output_len,
    )
    return Cell(
        cell_id=cell_id_for(probe),
        prompts=prompts,
        temperature=temperature,
        concurrency=concurrency,
        output_len=output_len,
        num_prompts=max(work["num_prompts"], concurrency),
        warmup=work["warmup"],
    )
