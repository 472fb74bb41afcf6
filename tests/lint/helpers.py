"""Build a drafter/target pair in a temp dir and lint it through the public API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from drafter_config import LintReport, lint, load_spec
from drafter_config.serve import load_serve_config
from tests.lint import corpus


def lint_case(
    tmp_path: Path,
    drafter: dict[str, Any] | None = None,
    *,
    target: dict[str, Any] | None = None,
    tokenizer: bool = True,
    tensors: dict[str, np.ndarray] | None = None,
    spec: dict[str, Any] | None = None,
    serve: str | None = None,
    with_target: bool = True,
) -> LintReport:
    drafter = corpus.qwen3_drafter() if drafter is None else drafter
    target = corpus.qwen3_target() if target is None else target
    if tensors is None:
        # the weights of the unmodified corpus drafter of the same family: config faults stay config faults
        base = corpus.qwen36_drafter() if drafter.get("vocab_size") == 248320 else corpus.qwen3_drafter()
        tensors = corpus.drafter_tensors(base)
    d = corpus.write_drafter(tmp_path / "drafter", drafter, tensors)
    t = corpus.write_target(tmp_path / "target", target, tokenizer) if with_target else None
    spec_obj = load_spec(str(corpus.write_spec(tmp_path / "spec.yaml", "tiny", spec))) if spec else None
    serve_obj = None
    if serve is not None:
        (tmp_path / "serve.yaml").write_text(serve, encoding="utf-8")
        serve_obj = load_serve_config(str(tmp_path / "serve.yaml"))
    return lint(str(d), str(t) if t else None, spec=spec_obj, serve=serve_obj)


def by_code(report: LintReport, code: str):
    return [f for f in report.findings if f.code == code]
