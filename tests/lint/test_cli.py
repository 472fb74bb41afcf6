"""`specops config lint|patch` through a real subprocess: exit codes, text and JSON output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.lint import corpus
from tests.lint.corpus import mutated

ROOT = Path(__file__).resolve().parents[2]
Q3 = corpus.qwen3_drafter()


def specops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _pair(tmp_path, drafter=Q3):
    d = corpus.write_drafter(tmp_path / "drafter", drafter, corpus.drafter_tensors(Q3))
    t = corpus.write_target(tmp_path / "target", corpus.qwen3_target())
    return str(d), str(t)


def test_clean_pair_exits_0(tmp_path):
    d, t = _pair(tmp_path)
    (tmp_path / "serve.json").write_text(
        '{"speculative_config": {"method": "dflash", "num_speculative_tokens": 15}}'
    )
    run = specops("config", "lint", d, "--target", t, "--serve-config", str(tmp_path / "serve.json"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("0 error(s), 0 warning(s)")


def test_errors_exit_1_with_ruff_like_lines(tmp_path):
    d, t = _pair(tmp_path, mutated(Q3, dflash_config__mask_token_id=151645, rms_norm_eps=1e-5))
    run = specops("config", "lint", d, "--target", t)
    assert run.returncode == 1
    first, hint = run.stdout.splitlines()[:2]
    assert re.fullmatch(
        r".+/drafter/config\.json:\d+:\d+: DFL012 error \[dflash_config\.mask_token_id\] .+", first
    )
    assert hint.startswith("    fix: ")


def test_warnings_alone_exit_0(tmp_path):
    d, t = _pair(tmp_path, mutated(Q3, rms_norm_eps=1e-5))
    assert specops("config", "lint", d, "--target", t).returncode == 0


def test_json_format(tmp_path):
    d, t = _pair(tmp_path, mutated(Q3, dflash_config__target_layer_ids=[2, 4, 6], rope_theta=10000))
    spec = corpus.write_spec(tmp_path / "spec.yaml", "tiny", corpus.qwen3_spec_values(Q3))
    run = specops("config", "lint", d, "--target", t, "--spec", str(spec), "--format", "json")
    assert run.returncode == 1
    out = json.loads(run.stdout)
    assert set(out) == {"findings", "errors", "warnings"}
    assert (out["errors"], out["warnings"]) == (1, 1)
    for finding in out["findings"]:
        assert {"code", "severity", "path", "line", "message", "hint"} <= set(finding)
        assert finding["severity"] in ("error", "warning") and re.fullmatch(r"DFL\d{3}", finding["code"])
    assert [f["code"] for f in out["findings"]] == ["DFL025", "DFL043"]


def test_unusable_input_exits_2(tmp_path):
    d, _ = _pair(tmp_path)
    (tmp_path / "drafter" / "config.json").write_text(
        '{"architectures": ["DFlashDraftModel"] "block_size": 16}'
    )
    run = specops("config", "lint", d, "--format", "json")
    assert run.returncode == 2
    (finding,) = json.loads(run.stdout)["findings"]
    assert (finding["code"], finding["line"], finding["col"]) == ("DFL001", 1, 40)

    run = specops("config", "lint", str(tmp_path / "nope"))
    assert run.returncode == 2 and "no such file or directory" in run.stderr
    run = specops("config", "lint", d, "--spec", "qwen3-8b-dflash-b61")
    assert run.returncode == 2 and "did you mean 'qwen3-8b-dflash-b16'" in run.stderr
    assert specops("config", "lint").returncode == 2
    assert specops("config", "patch", d).returncode == 2  # --spec is required


def test_patch_check_then_write_then_nothing(tmp_path):
    d, t = _pair(tmp_path, mutated(Q3, block_size=8))
    spec = str(corpus.write_spec(tmp_path / "spec.yaml", "tiny", corpus.qwen3_spec_values(Q3)))
    config = Path(d) / "config.json"
    before = config.read_text()

    check = specops("config", "patch", d, "--spec", spec, "--check")
    assert (
        check.returncode == 0 and '-  "block_size": 8,' in check.stdout and "nothing written" in check.stdout
    )
    assert config.read_text() == before

    write = specops("config", "patch", d, "--spec", spec, "--target", t)
    assert write.returncode == 0 and '+  "block_size": 16,' in write.stdout and "backup:" in write.stdout
    assert json.loads(config.read_text())["block_size"] == 16

    again = specops("config", "patch", d, "--spec", spec)
    assert again.returncode == 0 and "already matches" in again.stdout
    assert specops("config", "lint", d, "--target", t, "--spec", spec).returncode == 0


def test_patch_refusal_exits_1(tmp_path):
    d, _ = _pair(tmp_path, mutated(Q3, block_size=8, num_key_value_heads=4))
    spec = str(corpus.write_spec(tmp_path / "spec.yaml", "tiny", {"block_size": 16}))
    run = specops("config", "patch", d, "--spec", spec)
    assert run.returncode == 1 and "refusing to patch" in run.stderr and "DFL042" in run.stderr


def test_the_runtime_api_imports_no_torch(tmp_path):
    d, t = _pair(tmp_path, mutated(Q3, dflash_config__mask_token_id=151645))
    code = (
        "import sys; from drafter_config import format_findings, lint_pair; "
        f"report = lint_pair({d!r}, {t!r}); print(len(report.errors), 'torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["1", "False"], run.stderr
