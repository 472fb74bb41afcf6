"""Everything one lint run knows, handed to every rule.

Why: rules are pure functions of the inputs; keeping the inputs (drafter config, optional target,
tokenizer, weight headers, spec and serve setting) in one object lets a rule ask "do I know the
target?" and cite positions without loading anything itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from drafter_config.drafter import DrafterConfig
from drafter_config.findings import Finding, make_finding
from drafter_config.safetensors_header import WeightSet
from drafter_config.serve import ServeSetting
from drafter_config.spec import Spec
from drafter_config.target import TargetConfig
from drafter_config.tokenizer import TokenizerInfo
from specops_files.jsonpos import JsonPath, format_path


@dataclass
class LintContext:
    drafter: DrafterConfig
    target: TargetConfig | None = None
    tokenizer: TokenizerInfo | None = None
    weights: WeightSet | None = None
    spec: Spec | None = None
    serve: ServeSetting | None = None

    def at(self, code: str, path: JsonPath, message: str, hint: str, severity: str | None = None) -> Finding:
        """A finding anchored at a drafter config path (or its nearest existing parent)."""
        line, col = self.drafter.doc.locate(path)
        return make_finding(
            code,
            path=format_path(path),
            file=self.drafter.file,
            line=line,
            col=col,
            message=message,
            hint=hint,
            severity=severity,
        )

    def in_file(
        self,
        code: str,
        file: str,
        message: str,
        hint: str,
        *,
        path: str = "",
        line: int | None = None,
        severity: str | None = None,
    ) -> Finding:
        """A finding about another file (a safetensors header, a serve config)."""
        return make_finding(
            code,
            path=path,
            file=file,
            line=line,
            col=1 if line else None,
            message=message,
            hint=hint,
            severity=severity,
        )

    def target_layer_count(self) -> tuple[int | None, str]:
        """The target's decoder layer count and where it came from, best source first."""
        if self.target is not None and self.target.num_layers is not None:
            return self.target.num_layers, f"the target ({self.target.where('num_hidden_layers')})"
        own = self.drafter.int_value("num_target_layers")
        if own is not None:
            return own, "num_target_layers"
        if self.spec is not None and isinstance(self.spec.values.get("num_target_layers"), int):
            return self.spec.values["num_target_layers"], self.spec.cite("num_target_layers")
        return None, ""
