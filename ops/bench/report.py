"""``specops bench report``: results from one or many run directories as a table, report.md and plots.

Why: a user deploys speculative decoding to decode faster, so the report leads with one side-by-side
answer per host: output tokens/s, tau and acceptance, latencies, and the speedup over plain ``ar``
decoding measured in the same run on the same host with the same workload. Runs from several hosts
or dates can be passed together; columns for whatever differs between them (run, host, prompt set,
temperature, concurrency, output length, target) appear only when it does differ. With more than
one client at a time, the table adds tokens/s per client beside the total (what each user of a
loaded server gets), and a plot follows total throughput and TTFT across the concurrency levels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rich.table import Table

from ops.bench.plots import write_plots
from ops.bench.schema import SYSTEMS, BenchResult
from ops.bench.store import find_results
from ops.errors import SpecopsError
from specops_files.store import LocalStore

MODE_ORDER = ("ar", "dflash", "ddtree")


@dataclass
class Row:
    """One result plus the ``ar`` result it is compared with (None when the run has none)."""

    path: Path
    result: BenchResult
    baseline: BenchResult | None = None

    @property
    def speedup(self) -> float | None:
        mine = self.result.output_throughput
        base = self.baseline.output_throughput if self.baseline else None
        return mine / base if mine is not None and base else None


def per_user_throughput(r: BenchResult) -> float | None:
    """Output tokens/s one client sees: its tokens over its end-to-end time, queueing and prefill
    included (mean tokens per request / mean latency), so a server that makes clients wait shows it.
    Built from fields every source reports, so vLLM's and SGLang's imported cells have it too."""
    if not r.num_requests or r.output_tokens is None or not r.e2el_ms.mean:
        return None
    return r.output_tokens / r.num_requests / (r.e2el_ms.mean / 1e3)


def _workload(r: BenchResult) -> tuple[object, ...]:
    """What must match for two cells to be compared: same run, host and workload."""
    return (r.run_id, r.host, r.prompt_set, r.temperature, r.concurrency, r.output_len)


def _order(r: BenchResult) -> tuple[object, ...]:
    mode = MODE_ORDER.index(r.mode) if r.mode in MODE_ORDER else len(MODE_ORDER)
    return (
        r.run_id or "",
        r.host or "",
        r.prompt_set or "",
        r.temperature or 0,
        r.concurrency or 0,
        r.output_len or 0,
        SYSTEMS.index(r.system),
        mode,
        r.mode,
        r.budget or 0,
        r.block_size or 0,
        r.num_speculative_tokens or 0,
    )


def build_rows(found: Iterable[tuple[Path, BenchResult]]) -> list[Row]:
    """Sort results and attach each one's ``ar`` baseline (same system preferred, else any system)."""
    rows = sorted((Row(path, result) for path, result in found), key=lambda row: _order(row.result))
    bases: dict[tuple[object, ...], list[BenchResult]] = {}
    for row in rows:
        if row.result.mode == "ar" and row.result.output_throughput:
            bases.setdefault(_workload(row.result), []).append(row.result)
    for row in rows:
        candidates = bases.get(_workload(row.result), [])
        same = [b for b in candidates if b.system == row.result.system]
        row.baseline = (same or candidates or [None])[0]
    return rows


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


DIMENSIONS: dict[str, Callable[[BenchResult], object]] = {
    "run": lambda r: r.run_id,
    "host": lambda r: r.host,
    "prompts": lambda r: r.prompt_set,
    "T": lambda r: r.temperature,
    "conc": lambda r: r.concurrency,
    "out len": lambda r: r.output_len,
    "target": lambda r: r.target,
}


class Labels:
    """Names for rows that mention only what varies across the report."""

    def __init__(self, rows: Sequence[Row]):
        self.concurrent = any((r.result.concurrency or 1) > 1 for r in rows)
        self.varying = [
            name
            for name, get in DIMENSIONS.items()
            if len({get(r.result) for r in rows}) > 1 or (name == "conc" and self.concurrent)
        ]

    @staticmethod
    def setting(row: Row) -> str:
        r = row.result
        if r.budget is not None:
            return f"B={r.budget}"
        if r.num_speculative_tokens is not None:
            return f"k={r.num_speculative_tokens}"
        return f"bs={r.block_size}" if r.block_size is not None else ""

    def context(self, row: Row, leave_out: str | None = None) -> list[str]:
        return [f"{name}={DIMENSIONS[name](row.result)}" for name in self.varying if name != leave_out]

    def series(self, row: Row) -> str:
        """A line across budgets: everything but the budget."""
        return " ".join([f"{row.result.system}/{row.result.mode}", *self.context(row)])

    def cell(self, row: Row, leave_out: str | None = None) -> str:
        """The row's name; ``leave_out`` a dimension to name a line across it (``conc``)."""
        setting = self.setting(row)
        return " ".join(
            [
                f"{row.result.system}/{row.result.mode}",
                *([setting] if setting else []),
                *self.context(row, leave_out),
            ]
        )


def columns(labels: Labels) -> list[tuple[str, Callable[[Row], str]]]:
    """The table's columns, shared by the terminal table and report.md."""
    dims: list[tuple[str, Callable[[Row], str]]] = [
        (name, lambda row, get=DIMENSIONS[name]: _fmt_any(get(row.result))) for name in labels.varying
    ]
    return [
        *dims,
        ("system", lambda row: row.result.system),
        ("mode", lambda row: row.result.mode),
        ("budget", lambda row: labels.setting(row) or "-"),
        ("tok/s", lambda row: _fmt(row.result.output_throughput, ".1f")),
        *(
            [("tok/s/user", lambda row: _fmt(per_user_throughput(row.result), ".1f"))]
            if labels.concurrent
            else []
        ),
        ("τ", lambda row: _fmt(row.result.tau, ".2f")),
        (
            "accept",
            lambda row: _fmt(
                None if row.result.acceptance_rate is None else 100 * row.result.acceptance_rate, ".1f", "%"
            ),
        ),
        ("TTFT p50 ms", lambda row: _fmt(row.result.ttft_ms.median, ".1f")),
        ("TTFT p99 ms", lambda row: _fmt(row.result.ttft_ms.p99, ".1f")),
        ("TPOT p50 ms", lambda row: _fmt(row.result.tpot_ms.median, ".2f")),
        ("TPOT p99 ms", lambda row: _fmt(row.result.tpot_ms.p99, ".2f")),
        ("speedup", lambda row: _fmt(row.speedup, ".2f", "x")),
    ]


def _fmt_any(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def rich_table(rows: Sequence[Row], labels: Labels) -> Table:
    table = Table(title="specops benchmark", title_justify="left")
    for header, _ in columns(labels):
        numeric = header not in ("system", "mode", "budget", *DIMENSIONS)
        table.add_column(header, justify="right" if numeric else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(get(row) for _, get in columns(labels)))
    return table


def markdown(rows: Sequence[Row], labels: Labels, sources: Sequence[str], plots: Sequence[Path]) -> str:
    """report.md: the table, the plots, then the hardware and exact command behind every cell."""
    cols = columns(labels)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    lines = [
        "# specops benchmark report",
        "",
        f"Generated {stamp} from {', '.join(f'`{s}`' for s in sources)}.",
        "",
        "| " + " | ".join(h for h, _ in cols) + " |",
        "|"
        + "|".join("---" if h in ("system", "mode", "budget", *DIMENSIONS) else "---:" for h, _ in cols)
        + "|",
    ]
    lines += ["| " + " | ".join(get(row) for _, get in cols) + " |" for row in rows]
    lines += [
        "",
        "tok/s is output tokens per second over all clients"
        + (
            "; tok/s/user is what one client sees: its tokens over its end-to-end time, queueing and "
            "prefill included"
            if labels.concurrent
            else ""
        )
        + "; τ is tokens per target verification (1 + accepted/drafts); speedup is tok/s over the `ar` "
        "cell of the same run, host, prompt set, temperature, concurrency and output length (the same "
        "system's `ar` when there is one).",
        "",
    ]
    for plot in plots:
        lines += [f"![{plot.stem}]({plot.name})", ""]
    lines += [
        "## Hosts",
        "",
        "| run | host | GPU | compute cap | driver | CUDA | torch |",
        "|---|---|---|---|---|---|---|",
    ]
    hosts = {(r.result.run_id, r.result.host): r.result.hardware for r in rows}
    for (run_id, host), hw in hosts.items():
        cells = [
            run_id,
            host,
            hw.gpu_name if hw.gpu_count in (None, 1) else f"{hw.gpu_count} x {hw.gpu_name}",
            hw.compute_cap,
            hw.driver,
            hw.cuda,
            hw.torch,
        ]
        lines.append("| " + " | ".join(_fmt_any(c) for c in cells) + " |")
    lines += ["", "## Cells", ""]
    for row in rows:
        r = row.result
        lines.append(
            f"- `{r.host}/{r.cell_id}`: {labels.cell(row)}; target `{r.target or '-'}`, drafter "
            f"`{r.drafter or '-'}`; {r.num_requests if r.num_requests is not None else '?'} requests; "
            f"source {r.source}; {r.started_at or '?'} .. {r.finished_at or '?'}"
        )
        if r.command:
            lines.append(f"  `{r.command}`")
    return "\n".join(lines) + "\n"


@dataclass
class Report:
    rows: list[Row]
    table: Table
    markdown_path: Path
    plots: list[Path]


def make_report(sources: Sequence[str | Path], out_dir: str | Path) -> Report:
    """Load every result under ``sources``, write report.md and the plots into ``out_dir``."""
    found = find_results(sources)
    if not found:
        raise SpecopsError(
            f"no benchmark results under {', '.join(map(str, sources))} "
            "(fix: pass results/<run-id> of a bench run, or import files with `specops bench import`)"
        )
    rows = build_rows(found)
    labels = Labels(rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(rows, out, labels)
    md_path = out / "report.md"
    LocalStore().write_bytes(
        str(md_path), markdown(rows, labels, [str(s) for s in sources], plots).encode("utf-8")
    )
    return Report(rows=rows, table=rich_table(rows, labels), markdown_path=md_path, plots=plots)
