"""DFL046: a quantized target the DDTree runtime cannot load.

Why: the runtime serves bf16/fp32 targets and the two FP8 formats of `drafter_config.quantization`;
anything else (AWQ, GPTQ, e5m2, static activation scales, an FP8 KV cache) is refused when the
server starts. Linting says so earlier, as a warning: vLLM and SGLang may still serve that target
with the same drafter, and the drafter's own checks (hidden size, vocabulary, layer ids) still run.
"""

from __future__ import annotations

from drafter_config.context import LintContext
from drafter_config.findings import Finding
from drafter_config.quantization import QuantConfigError, read_fp8_scheme
from specops_files.jsonpos import format_path


def check(ctx: LintContext) -> list[Finding]:
    target = ctx.target
    if target is None or not isinstance(target.doc.data, dict):
        return []
    try:
        read_fp8_scheme(target.doc.data)
    except QuantConfigError as err:
        line, _ = target.doc.locate(err.path)
        return [
            ctx.in_file(
                "DFL046",
                target.file,
                f"the target's {err.message}; the DDTree runtime will refuse to load it",
                err.hint,
                path=format_path(err.path),
                line=line,
            )
        ]
    return []
