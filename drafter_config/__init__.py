"""Lint and patch DFlash drafter ``config.json`` files against their target model and a spec.

A drafter with a subtly wrong config (mask_token_id, target_layer_ids, layer_types/sliding_window)
loads and runs but accepts ~1% of its drafts. This package makes that class of mistake loud.

Python API (no torch import anywhere in this package):

- ``lint_pair(drafter_dir, target_dir, spec=None) -> LintReport``: the runtime's load-time check.
  Refuse to start when ``report.errors`` is non-empty and show ``format_findings(report)``::

      from drafter_config import format_findings, lint_pair
      report = lint_pair(drafter_dir, target_dir)
      if report.errors:
          raise SystemExit(format_findings(report))

- ``lint(drafter, target=None, *, spec=None, serve=None, store=None) -> LintReport``: the general
  form; ``store`` is any object with ``read_bytes/stat/listdir`` (an ``ops.connection.Connection``
  works as is), so the same rules run over SFTP, reading only safetensors headers.
- ``patch(store, drafter, spec, target_path=None, check=False) -> PatchResult``: apply a spec with
  a timestamped backup and an atomic write (through a symlinked config.json to its target; the
  store also needs ``write_bytes`` and ``realpath``); raises ``PatchRefused`` rather than write a
  config that lint rejects.
- ``load_spec(name_or_file)``: a shipped spec (``specs/*.yaml``) or a user's YAML file.
- ``LintReport``: ``.findings``, ``.errors``, ``.warnings``, ``.as_json()``; each ``Finding`` has a
  stable ``code`` (table in ``findings.CODES``), severity, JSON path, file, line, col, message, hint.
"""

from __future__ import annotations

from drafter_config.findings import CODES, Finding, LintReport, format_findings
from drafter_config.lint import lint, lint_pair
from drafter_config.patch import PatchRefused, PatchResult, patch
from drafter_config.source import LintInputError
from drafter_config.spec import Spec, load_spec

__all__ = [
    "CODES",
    "Finding",
    "LintInputError",
    "LintReport",
    "PatchRefused",
    "PatchResult",
    "Spec",
    "format_findings",
    "lint",
    "lint_pair",
    "load_spec",
    "patch",
]
