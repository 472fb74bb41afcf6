"""The report's PNG plots: tokens/s by system, tau and speedup against the DDTree budget, the
distribution of tokens emitted per verification round, and total tokens/s and TTFT against the
number of concurrent clients.

Why: the questions a user asks ("which method, which budget, on my box, for how many users?") are
answered at a glance by these five pictures. Figures are drawn on matplotlib's object API with the
Agg canvas (no pyplot global state, no display needed) and written atomically like every other
result file.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ops.bench.schema import SYSTEMS, BenchResult
from ops.errors import SpecopsError
from specops_files.store import LocalStore

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ops.bench.report import Labels, Row

COLORS = {"ddtree": "#1f77b4", "vllm": "#ff7f0e", "sglang": "#2ca02c"}
MAX_HISTOGRAM_SERIES = 8


def write_plots(rows: Sequence[Row], out_dir: Path, labels: Labels) -> list[Path]:
    """Draw every plot the data supports into ``out_dir``; returns the files written."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise SpecopsError("plots need matplotlib (fix: pip install 'matplotlib>=3.8')") from None
    written = []
    for name, draw in (
        ("throughput.png", _throughput),
        ("tau_vs_budget.png", _tau),
        ("speedup_vs_budget.png", _speedup),
        ("accepted_length.png", _histogram),
        ("concurrency.png", _concurrency),
    ):
        fig = Figure(figsize=(9, 5), dpi=110, layout="constrained")
        if draw(fig, rows, labels):
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png")
            LocalStore().write_bytes(str(out_dir / name), buffer.getvalue())
            written.append(out_dir / name)
    return written


def _throughput(fig: Figure, rows: Sequence[Row], labels: Labels) -> bool:
    bars = [r for r in rows if r.result.output_throughput is not None]
    if not bars:
        return False
    fig.set_size_inches(9, max(2.5, 0.38 * len(bars) + 1.2))
    ax = fig.add_subplot()
    ys = range(len(bars))
    values = [r.result.output_throughput for r in bars]
    ax.barh(ys, values, color=[COLORS[r.result.system] for r in bars])
    ax.set_yticks(list(ys), [labels.cell(r) for r in bars], fontsize=8)
    ax.invert_yaxis()
    for y, row, value in zip(ys, bars, values, strict=True):
        note = f"{value:.1f}" + (f"  ({row.speedup:.2f}x)" if row.speedup is not None else "")
        ax.annotate(note, (value, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_xlim(0, max(values) * 1.25 or 1)
    ax.set_xlabel("output tokens/s (higher is better; speedup over ar in brackets)")
    ax.set_title("Output throughput by system and mode")
    handles = [
        ax.bar(0, 0, color=COLORS[s], label=s) for s in SYSTEMS if any(r.result.system == s for r in bars)
    ]
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return True


def _tau(fig: Figure, rows: Sequence[Row], labels: Labels) -> bool:
    return _against_budget(
        fig,
        rows,
        labels,
        lambda r: r.result.tau,
        "τ (tokens per target step)",
        "Mean acceptance length τ against the DDTree budget",
        floor=1.0,
    )


def _speedup(fig: Figure, rows: Sequence[Row], labels: Labels) -> bool:
    return _against_budget(
        fig,
        rows,
        labels,
        lambda r: r.speedup,
        "speedup over ar (x)",
        "Speedup over autoregressive decoding against the DDTree budget",
        floor=1.0,
    )


def _against_budget(
    fig: Figure,
    rows: Sequence[Row],
    labels: Labels,
    metric: Callable[[Row], float | None],
    ylabel: str,
    title: str,
    floor: float,
) -> bool:
    """One line per setting over the ddtree budgets; other speculative modes as dashed references;
    a grey line at ``floor`` (tau 1 / speedup 1: no gain over plain decoding)."""
    tree = [r for r in rows if r.result.mode == "ddtree" and r.result.budget and metric(r) is not None]
    if not tree:
        return False
    ax = fig.add_subplot()
    series: dict[str, list[Row]] = {}
    for row in tree:
        series.setdefault(labels.series(row), []).append(row)
    for name, points in series.items():
        points.sort(key=lambda r: r.result.budget or 0)
        ax.plot([r.result.budget for r in points], [metric(r) for r in points], marker="o", label=name)
    references = [r for r in rows if r.result.mode not in ("ddtree", "ar") and metric(r) is not None]
    for i, row in enumerate(references):
        ax.axhline(
            metric(row),
            linestyle="--",
            linewidth=1,
            color=f"C{(len(series) + i) % 10}",
            label=f"{labels.cell(row)} (reference)",
        )
    ax.axhline(floor, color="grey", linewidth=0.8)
    budgets = sorted({r.result.budget for r in tree if r.result.budget})
    _log2_axis(ax, budgets, "DDTree budget (tree nodes per round, log scale)", ylabel, title)
    ax.legend(fontsize=8)
    return True


def _log2_axis(ax: Axes, ticks: Sequence[int], xlabel: str, ylabel: str, title: str) -> None:
    """A log2 x axis ticked at the measured values (budgets, client counts), labels and a grid."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)


def length_distribution(result: BenchResult) -> dict[int, float] | None:
    """Fraction of rounds emitting k tokens: from the histogram, else from per-position rates.

    For chain drafts (vLLM, SGLang), acceptance is prefix-closed, so P(accept >= k drafts) is the
    rate at position k-1 and P(exactly k tokens) = rate[k-2] - rate[k-1] (rate[-1] = 1, past the end 0).
    """
    if result.accepted_length_histogram:
        total = sum(result.accepted_length_histogram.values())
        hist = result.accepted_length_histogram
        return {k: hist.get(k, 0) / total for k in range(1, max(hist) + 1)} if total else None
    rates = result.per_position_acceptance
    if not rates:
        return None
    survive = [1.0, *rates, 0.0]
    return {k + 1: max(survive[k] - survive[k + 1], 0.0) for k in range(len(rates) + 1)}


def _histogram(fig: Figure, rows: Sequence[Row], labels: Labels) -> bool:
    """One line per series (system, mode, setting context); for budget sweeps, the fastest budget."""
    best: dict[str, tuple[Row, dict[int, float]]] = {}
    for row in rows:
        dist = length_distribution(row.result) if row.result.mode != "ar" else None
        key = labels.series(row)
        if dist and (
            key not in best
            or (row.result.output_throughput or 0) > (best[key][0].result.output_throughput or 0)
        ):
            best[key] = (row, dist)
    if not best:
        return False
    ax = fig.add_subplot()
    for row, dist in list(best.values())[:MAX_HISTOGRAM_SERIES]:
        source = "" if row.result.accepted_length_histogram else " (from per-position rates)"
        tau = f", τ={row.result.tau:.2f}" if row.result.tau is not None else ""
        ax.plot(list(dist), list(dist.values()), marker="o", label=f"{labels.cell(row)}{tau}{source}")
    ax.set_xlabel("tokens emitted per verification round (accepted drafts + 1)")
    ax.set_ylabel("fraction of rounds")
    ax.set_title("Accepted length per round (fastest setting of each system and mode)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return True


def _concurrency(fig: Figure, rows: Sequence[Row], labels: Labels) -> bool:
    """Total output tokens/s and TTFT p50 against concurrency, one line per system, mode and setting;
    drawn when some line has two concurrency levels or more."""
    lines: dict[str, list[Row]] = {}
    for row in rows:
        if row.result.concurrency is not None and row.result.output_throughput is not None:
            lines.setdefault(labels.cell(row, leave_out="conc"), []).append(row)
    if not any(len({r.result.concurrency for r in points}) > 1 for points in lines.values()):
        return False
    from matplotlib.ticker import FormatStrFormatter  # matplotlib is checked by write_plots

    fig.set_size_inches(12, 5)
    total, ttft = fig.subplots(1, 2)
    for i, (name, points) in enumerate(lines.items()):
        points.sort(key=lambda r: r.result.concurrency or 0)
        style = {"marker": "o", "color": f"C{i % 10}", "label": name}
        total.plot(
            [r.result.concurrency for r in points], [r.result.output_throughput for r in points], **style
        )
        timed = [r for r in points if r.result.ttft_ms.median is not None]
        ttft.plot([r.result.concurrency for r in timed], [r.result.ttft_ms.median for r in timed], **style)
    levels = sorted({r.result.concurrency for points in lines.values() for r in points})
    for ax, ylabel, title in (
        (total, "output tokens/s, all clients", "Total throughput against concurrency"),
        (ttft, "TTFT p50 (ms, log scale)", "Time to first token against concurrency"),
    ):
        _log2_axis(ax, levels, "concurrent clients (log scale)", ylabel, title)
    total.set_ylim(bottom=0)
    ttft.set_yscale("log")
    plain = FormatStrFormatter("%g")  # 20, 50, 100 ms rather than 2x10^1
    ttft.yaxis.set_major_formatter(plain)
    ttft.yaxis.set_minor_formatter(plain)
    total.legend(fontsize=8)
    return True
