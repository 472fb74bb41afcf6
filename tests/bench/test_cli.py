"""`specops bench import|report` through a real subprocess: files in, exit codes, output out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.bench.samples import sglang_record, sweep_run, vllm_record, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def specops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_then_report(tmp_path):
    run = tmp_path / "results" / "20261202-150000-bench-ab12"
    sweep_run(run, "gpu1")
    vllm = tmp_path / "vllm.json"
    vllm.write_text(json.dumps(vllm_record()))
    sglang = write_jsonl(tmp_path / "sglang.jsonl", [sglang_record()])
    imported = specops(
        "import",
        "--from",
        "vllm",
        str(vllm),
        "--into",
        str(run),
        "--host",
        "gpu1",
        "--set",
        "mode=dflash",
        "--set",
        "num_speculative_tokens=7",
        "--set",
        "prompt_set=math",
        "--set",
        "temperature=0",
        "--set",
        "output_len=256",
    )
    assert imported.returncode == 0, imported.stderr
    target = run / "gpu1" / "vllm-dflash-k7-math-t0-c1-o256-vllm.json"
    assert imported.stdout.strip() == f"wrote {target}"
    assert (
        specops(
            "import",
            "--from",
            "sglang",
            str(sglang),
            "--into",
            str(run),
            "--host",
            "gpu1",
            "--set",
            "mode=mtp",
        ).returncode
        == 0
    )

    report = specops("report", str(run))
    assert report.returncode == 0, report.stderr
    vllm_line = next(line for line in report.stdout.splitlines() if "k=7" in line)
    assert "128.0" in vllm_line and "7.00" in vllm_line and "40.0%" in vllm_line and "2.56x" in vllm_line
    assert "mtp" in report.stdout and f"wrote {run / 'report.md'}" in report.stdout
    assert (run / "report.md").is_file() and (run / "throughput.png").is_file()


def test_report_out_dir_and_several_runs(tmp_path):
    sweep_run(tmp_path / "r1", "gpu1")
    sweep_run(tmp_path / "r2", "gpu2")
    run = specops("report", str(tmp_path / "r1"), str(tmp_path / "r2"), "--out", str(tmp_path / "cmp"))
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == [
        "accepted_length.png",
        "report.md",
        "speedup_vs_budget.png",
        "tau_vs_budget.png",
        "throughput.png",
    ]


def test_bad_input_exits_2_with_one_line_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps(sglang_record()) + "\n" + json.dumps(sglang_record(output_throughput="n/a")) + "\n"
    )
    run = specops("import", "--from", "sglang", str(bad), "--into", str(tmp_path / "run"))
    assert run.returncode == 2
    assert run.stderr == (
        f"specops bench import: {bad}:2: sglang field 'output_throughput': expected a number "
        "or null, got 'n/a'\n"
    )
    assert not (tmp_path / "run").exists()

    typo = specops(
        "import", "--from", "sglang", str(bad), "--into", str(tmp_path / "run"), "--set", "bugdet=4"
    )
    assert typo.returncode == 2 and "--set 'bugdet=4'" in typo.stderr

    empty = specops("report", str(tmp_path))
    assert empty.returncode == 2 and empty.stderr.startswith("specops bench report: no benchmark results")
