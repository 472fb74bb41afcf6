"""`bench report` on small synthetic results directories: table, report.md and real PNG files."""

from __future__ import annotations

import io
import json

import pytest
from matplotlib.image import imread
from rich.console import Console

from ops.bench.importers import import_files
from ops.bench.plots import length_distribution
from ops.bench.report import make_report
from ops.bench.schema import BenchResult
from ops.errors import SpecopsError
from tests.bench.samples import concurrency_run, sweep_run, vllm_record

ALL_PLOTS = ["throughput.png", "tau_vs_budget.png", "speedup_vs_budget.png", "accepted_length.png"]


def table_text(report) -> str:
    console = Console(record=True, width=250, file=io.StringIO())
    console.print(report.table)
    return console.export_text()


def header(text: str) -> list[str]:
    return [cell.strip() for cell in line_of(text, "┃", "system").split("┃") if cell.strip()]


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 400 and image.std() > 0.01


def line_of(text: str, *words: str) -> str:
    return next(line for line in text.splitlines() if all(w in line for w in words))


def test_one_run_one_host(tmp_path):
    run = tmp_path / "results" / "run1"
    sweep_run(run)
    report = make_report([run], tmp_path / "out")
    text = table_text(report)
    assert header(text) == [
        "system",
        "mode",
        "budget",
        "tok/s",
        "τ",
        "accept",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TPOT p50 ms",
        "TPOT p99 ms",
        "speedup",
    ]  # nothing varies: no run/host columns
    b64 = line_of(text, "ddtree", "B=64")
    assert "260.0" in b64 and "7.50" in b64 and "6.50x" in b64 and "10.2%" in b64
    assert "3.00x" in line_of(text, "vllm", "dflash", "k=15")  # over vLLM's own ar (150 / 50)
    assert "1.00x" in line_of(text, "ddtree", " ar ")
    assert [p.name for p in report.plots] == ALL_PLOTS
    for plot in report.plots:
        assert_png(plot)
    md = report.markdown_path.read_text()
    assert "| system | mode | budget | tok/s | τ | accept |" in md
    assert "| ddtree | ddtree | B=64 | 260.0 | 7.50 | 10.2% |" in md
    assert all(f"]({name})" in md for name in ALL_PLOTS)
    assert "| run1 | gpu1 | NVIDIA H200 | 9.0 | 570.124 | 12.8 | 2.7.0 |" in md
    assert "`specops-client --mode ddtree --budget 64`" in md


def test_hosts_and_runs_compare_in_one_report(tmp_path):
    sweep_run(tmp_path / "r1", "gpu1")
    sweep_run(tmp_path / "r1", "gpu2", scale=0.5)
    sweep_run(tmp_path / "r2", "gpu1", scale=1.1)
    report = make_report([tmp_path / "r1", tmp_path / "r2"], tmp_path / "out")
    assert len(report.rows) == 21
    text = table_text(report)
    assert header(text)[:3] == ["run", "host", "system"]
    assert "6.50x" in line_of(text, "r1", "gpu2", "B=64")  # speedup within the host's own run
    assert "286.0" in line_of(text, "r2", "gpu1", "B=64")
    md = report.markdown_path.read_text()
    assert "| r1 | gpu2 | ddtree | ddtree | B=64 | 130.0 |" in md
    assert md.count("NVIDIA H200") == 3


def test_concurrency_sweep_shows_per_user_rates_and_plots_against_clients(tmp_path):
    concurrency_run(tmp_path / "run")
    src = tmp_path / "v.json"  # vLLM's own bench at 4 clients: per-client rate from its fields too
    src.write_text(json.dumps(vllm_record(max_concurrency=4)))
    same = {
        "prompt_set": "math",
        "temperature": "0",
        "output_len": "256",
        "target": "/opt/specops/models/target",
    }
    settings = {"mode": "mtp", "num_speculative_tokens": "3", **same}  # its workload is the sweep's
    import_files("vllm", [src], tmp_path / "run", host="gpu1", settings=settings)
    report = make_report([tmp_path / "run"], tmp_path / "run")
    text = table_text(report)
    names = header(text)
    assert names[:6] == ["conc", "system", "mode", "budget", "tok/s", "tok/s/user"]
    cells = [
        dict(zip(names, (c.strip() for c in line.split("│")[1:-1]), strict=True))
        for line in text.splitlines()
        if line.startswith("│")
    ]
    b16 = next(c for c in cells if c["conc"] == "16" and c["budget"] == "B=16")
    assert (b16["tok/s"], b16["tok/s/user"], b16["TTFT p50 ms"]) == ("1600.0", "100.0", "376.0")
    assert b16["speedup"] == "5.00x"  # over ar at the same concurrency
    assert "concurrency.png" in [p.name for p in report.plots]
    assert_png(tmp_path / "run" / "concurrency.png")
    md = report.markdown_path.read_text()
    assert "| conc | system | mode | budget | tok/s | tok/s/user |" in md
    assert "| 4 | vllm | dflash | k=15 | 450.0 | 112.5 |" in md
    assert "| 4 | vllm | mtp | k=3 | 128.0 | 6400.0 |" in md  # 256 tokens a request, 40 ms mean e2el
    assert "tok/s/user is what one client sees" in md


def test_foreign_results_without_ar_or_budgets(tmp_path):
    src = tmp_path / "v.json"
    src.write_text(json.dumps(vllm_record()))
    import_files("vllm", [src], tmp_path / "run", settings={"mode": "dflash", "num_speculative_tokens": "15"})
    report = make_report([tmp_path / "run"], tmp_path / "run")
    assert table_text(report).splitlines()[-2].split("│")[-2].strip() == "-"  # no ar cell: no speedup
    assert [p.name for p in report.plots] == ["throughput.png", "accepted_length.png"]
    assert_png(tmp_path / "run" / "accepted_length.png")


def test_length_distribution_from_histogram_or_per_position_rates():
    hist = BenchResult(system="ddtree", mode="ddtree", accepted_length_histogram={1: 1, 3: 3})
    assert length_distribution(hist) == {1: 0.25, 2: 0.0, 3: 0.75}
    chain = BenchResult(system="vllm", mode="dflash", per_position_acceptance=[0.8, 0.5, 0.1])
    dist = length_distribution(chain)
    assert dist == pytest.approx({1: 0.2, 2: 0.3, 3: 0.4, 4: 0.1})
    assert sum(k * p for k, p in dist.items()) == pytest.approx(1 + 0.8 + 0.5 + 0.1)  # mean is tau


def test_no_results_is_a_clear_error(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(SpecopsError, match=r"no benchmark results under .*`specops bench import`"):
        make_report([tmp_path], tmp_path)
