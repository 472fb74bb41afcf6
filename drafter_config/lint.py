"""The lint orchestrator: load the inputs once, run the rule groups, collect one report.

Why: the CLI, the Fabric step (over SFTP) and the runtime's load-time refusal all need the same
answer for the same files; they differ only in the Store they read through. Loading is split from
checking so that ``patch`` can re-lint an edited config text before it writes anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from drafter_config.bounds import check_sizes
from drafter_config.context import LintContext
from drafter_config.drafter import DrafterConfig
from drafter_config.findings import LintReport, make_finding
from drafter_config.rules import IDENTITY, RULES
from drafter_config.safetensors_header import WeightSet, read_weights
from drafter_config.serve import ServeSetting
from drafter_config.source import Checkpoint, InvalidJson, locate_checkpoint, read_json
from drafter_config.spec import Spec
from drafter_config.target import TargetConfig, load_target
from drafter_config.tokenizer import TokenizerInfo, read_tokenizer
from specops_files.store import LocalStore, Store


@dataclass
class LintInputs:
    """Everything read from disk (or a host) for one drafter/target pair."""

    store: Store
    checkpoint: Checkpoint
    drafter: DrafterConfig
    target: TargetConfig | None
    tokenizer: TokenizerInfo | None
    weights: WeightSet | None


def load_inputs(store: Store, drafter_path: str, target_path: str | None = None) -> LintInputs:
    """Read configs, tokenizer files and safetensors headers; raises InvalidJson / LintInputError."""
    checkpoint = locate_checkpoint(store, drafter_path, "drafter")
    drafter = DrafterConfig(checkpoint.config_path, read_json(store, checkpoint.config_path))
    target = tokenizer = None
    tokenizer_dir = checkpoint.directory
    if target_path is not None:
        target_checkpoint = locate_checkpoint(store, target_path, "target")
        target_doc = read_json(store, target_checkpoint.config_path)
        check_sizes(target_doc, target_checkpoint.config_path)  # before layer_types are derived
        target = load_target(target_checkpoint.config_path, target_doc)
        tokenizer_dir = target_checkpoint.directory or tokenizer_dir
    if tokenizer_dir is not None:
        tokenizer = read_tokenizer(store, tokenizer_dir)
    weights = read_weights(store, checkpoint.directory) if checkpoint.directory is not None else None
    return LintInputs(store, checkpoint, drafter, target, tokenizer, weights)


def run_rules(
    inputs: LintInputs,
    spec: Spec | None = None,
    serve: ServeSetting | None = None,
    drafter: DrafterConfig | None = None,
) -> LintReport:
    """Run every rule group; ``drafter`` replaces the loaded config (patch re-lints its edit).
    A size out of range (``bounds.py``) raises LintInputError before any rule enumerates layers."""
    config = drafter or inputs.drafter
    check_sizes(config.doc, config.file)
    ctx = LintContext(config, inputs.target, inputs.tokenizer, inputs.weights, spec, serve)
    report = LintReport(IDENTITY(ctx))
    if report.errors:
        return report
    seen: set[tuple[str, str, str]] = set()
    for rule in RULES:
        for finding in rule(ctx):
            key = (finding.code, finding.file, finding.path)
            if key not in seen:
                seen.add(key)
                report.findings.append(finding)
    report.sort()
    return report


def invalid_json_report(error: InvalidJson) -> LintReport:
    """DFL001 for a file that is not JSON, with its line and column."""
    finding = make_finding(
        "DFL001",
        path="$",
        file=error.path,
        line=error.error.line,
        col=error.error.col,
        message=f"invalid JSON: {error.error.reason}",
        hint="fix the syntax at this position (a trailing comma or a missing quote is typical)",
    )
    return LintReport([finding])


def lint(
    drafter_path: str,
    target_path: str | None = None,
    *,
    spec: Spec | None = None,
    serve: ServeSetting | None = None,
    store: Store | None = None,
) -> LintReport:
    """Lint one drafter (file or directory), optionally against its target, a spec and a serve setting."""
    try:
        inputs = load_inputs(store or LocalStore(), drafter_path, target_path)
    except InvalidJson as exc:
        return invalid_json_report(exc)
    return run_rules(inputs, spec, serve)


def lint_pair(drafter_dir: str, target_dir: str, *, spec: Spec | None = None) -> LintReport:
    """The runtime's load-time check: refuse to start when ``lint_pair(...).errors`` is not empty."""
    return lint(str(drafter_dir), str(target_dir), spec=spec)
