"""Findings and the one table of stable rule codes.

Why: codes are a public contract (users grep for them, CI pins them), so every code, its default
severity and its one-line meaning live here and nowhere else. Rules pick a code; the orchestrator
and the CLI only read findings.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

ERROR = "error"
WARNING = "warning"

# code -> (default severity, what the rule checks)
CODES: dict[str, tuple[str, str]] = {
    "DFL001": (ERROR, "invalid JSON"),
    "DFL002": (ERROR, "not a DFlash drafter"),
    "DFL010": (ERROR, "mask_token_id missing"),
    "DFL011": (ERROR, "mask_token_id outside [0, vocab_size) or not the spec's"),
    "DFL012": (WARNING, "mask_token_id collides with a token the target uses for something else"),
    "DFL020": (ERROR, "target_layer_ids missing"),
    "DFL021": (ERROR, "target_layer_ids not a strictly increasing list of distinct integers"),
    "DFL022": (ERROR, "target layer id out of the target's range (or the last layer)"),
    "DFL023": (ERROR, "num_target_layers differs from the target's layer count"),
    "DFL024": (ERROR, "number of target_layer_ids disagrees with fc.weight"),
    "DFL025": (ERROR, "target_layer_ids differ from the spec"),
    "DFL030": (ERROR, "len(layer_types) differs from num_hidden_layers"),
    "DFL031": (ERROR, "unknown layer type"),
    "DFL032": (ERROR, "sliding layers without a positive sliding_window"),
    "DFL033": (WARNING, "sliding_window or use_sliding_window set while no layer slides"),
    "DFL034": (ERROR, "sliding_window smaller than block_size"),
    "DFL040": (ERROR, "hidden_size differs from the target's"),
    "DFL041": (ERROR, "vocab_size differs from the target's"),
    "DFL042": (ERROR, "attention shapes in the config disagree with the weights"),
    "DFL043": (WARNING, "rope_theta or rope_scaling differs from the target's"),
    "DFL044": (WARNING, "rms_norm_eps differs from the target's"),
    "DFL045": (WARNING, "max_position_embeddings below the target's"),
    "DFL046": (WARNING, "the target's quantization_config is not one the DDTree runtime serves"),
    "DFL050": (ERROR, "block_size missing or < 2"),
    "DFL051": (ERROR, "deployment num_speculative_tokens != block_size - 1"),
    "DFL060": (WARNING, "config dtype disagrees with the stored weights"),
    "DFL061": (ERROR, "weights missing or unexplained by the config"),
    "DFL062": (ERROR, "the shard index names a file outside the checkpoint (never opened)"),
    "DFL063": (
        ERROR,
        "safetensors data_offsets negative, overlapping, past the end or not the tensor's size",
    ),
}


def show(value: object) -> str:
    """A config value as it is written in JSON (null, true, ["a"]), for messages and hints."""
    return json.dumps(value)


@dataclass(frozen=True)
class Finding:
    """One problem: where it is (file, line, col, JSON path), what is wrong and how to fix it."""

    code: str
    severity: str
    path: str
    file: str
    line: int | None
    col: int | None
    message: str
    hint: str

    def as_json(self) -> dict[str, object]:
        """The finding object (docs/architecture.md): code, severity, path, line, message, hint, file, col."""
        return asdict(self)


def make_finding(
    code: str,
    *,
    path: str,
    file: str,
    line: int | None,
    col: int | None,
    message: str,
    hint: str,
    severity: str | None = None,
) -> Finding:
    """Build a finding with the code's default severity unless the rule knows better."""
    if code not in CODES:
        raise KeyError(f"unknown rule code {code}; add it to CODES in {__name__}")
    return Finding(code, severity or CODES[code][0], path, file, line, col, message, hint)


@dataclass
class LintReport:
    """All findings of one lint run, in rule order."""

    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def unreadable(self) -> bool:
        """True when an input was not valid JSON: the CLI then exits 2, not 1."""
        return any(f.code == "DFL001" for f in self.findings)

    def sort(self) -> None:
        """Ruff's order: by file, then position; findings without a line close their file."""
        self.findings.sort(key=lambda f: (f.file, f.line is None, f.line or 0, f.col or 0, f.code))

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def as_json(self) -> dict[str, object]:
        return {
            "findings": [f.as_json() for f in self.findings],
            "errors": len(self.errors),
            "warnings": len(self.warnings),
        }


def format_findings(report: LintReport) -> str:
    """Ruff-like text: ``file:line:col: CODE severity message`` then an indented fix hint."""
    lines = []
    for f in report.findings:
        where = f"{f.file}:{f.line}:{f.col}" if f.line is not None else f.file
        path = f" [{f.path}]" if f.path else ""
        lines.append(f"{where}: {f.code} {f.severity}{path} {f.message}")
        if f.hint:
            lines.append(f"    fix: {f.hint}")
    lines.append(f"{len(report.errors)} error(s), {len(report.warnings)} warning(s)")
    return "\n".join(lines)
