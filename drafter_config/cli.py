"""``specops config lint|patch``: the command-line face of the drafter config linter.

Why: the contract in docs/architecture.md (ruff-like text or JSON, exit 0 clean / 1 errors / 2 unusable
input) is what CI jobs and the Fabric tasks script against; this module only parses arguments,
calls the library and maps results to output and exit codes.
"""

from __future__ import annotations

import argparse
import json
import sys

from drafter_config.findings import format_findings
from drafter_config.lint import lint
from drafter_config.patch import PatchRefused, patch
from drafter_config.serve import load_serve_config
from drafter_config.source import LintInputError
from drafter_config.spec import load_spec, shipped_specs
from specops_files.store import LocalStore

EXIT_CLEAN, EXIT_ERRORS, EXIT_UNUSABLE = 0, 1, 2


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``config`` command group to the top-level ``specops`` parser."""
    config = subparsers.add_parser("config", help="lint and patch DFlash drafter config.json files")
    commands = config.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    spec_help = f"a YAML spec file or a shipped spec name ({', '.join(shipped_specs())})"

    lint_cmd = commands.add_parser("lint", help="check a drafter config against its target and a spec")
    lint_cmd.add_argument("drafter", metavar="DRAFTER", help="drafter config.json or checkpoint directory")
    lint_cmd.add_argument("--target", metavar="TARGET", help="target config.json or checkpoint directory")
    lint_cmd.add_argument("--spec", metavar="NAME_OR_FILE", help=spec_help)
    lint_cmd.add_argument(
        "--serve-config", metavar="FILE", help="YAML/JSON serve settings holding num_speculative_tokens"
    )
    lint_cmd.add_argument("--format", choices=("text", "json"), default="text")
    lint_cmd.set_defaults(handler=run_lint)

    patch_cmd = commands.add_parser("patch", help="rewrite the drafter config to match a spec")
    patch_cmd.add_argument("drafter", metavar="DRAFTER", help="drafter config.json or checkpoint directory")
    patch_cmd.add_argument("--spec", metavar="NAME_OR_FILE", required=True, help=spec_help)
    patch_cmd.add_argument("--target", metavar="TARGET", help="also re-lint the result against this target")
    patch_cmd.add_argument("--check", action="store_true", help="print the diff only; write nothing")
    patch_cmd.set_defaults(handler=run_patch)


def run_lint(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.spec) if args.spec else None
        serve = load_serve_config(args.serve_config) if args.serve_config else None
        report = lint(args.drafter, args.target, spec=spec, serve=serve)
    except LintInputError as exc:
        print(f"specops config lint: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.format == "json":
        print(json.dumps(report.as_json(), indent=2))
    else:
        print(format_findings(report))
    if report.unreadable:
        return EXIT_UNUSABLE
    return EXIT_ERRORS if report.errors else EXIT_CLEAN


def run_patch(args: argparse.Namespace) -> int:
    try:
        result = patch(
            LocalStore(), args.drafter, load_spec(args.spec), target_path=args.target, check=args.check
        )
    except PatchRefused as exc:
        print(f"specops config patch: {exc}\n{format_findings(exc.report)}", file=sys.stderr)
        return EXIT_ERRORS
    except LintInputError as exc:
        print(f"specops config patch: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except OSError as exc:  # a full disk (ENOSPC), a read-only or foreign folder (EACCES, EROFS)
        where = f"{exc.filename}: " if exc.filename else ""
        print(
            f"specops config patch: {where}cannot write: {exc.strerror or exc}; the config is unchanged "
            "(fix: free space or get write access to that folder, then run again)",
            file=sys.stderr,
        )
        return EXIT_ERRORS
    if not result.changed:
        print(f"{result.path}: already matches the spec; nothing to change")
        return EXIT_CLEAN
    sys.stdout.write(result.diff)
    via = "" if result.target == result.path else f" through the link: wrote {result.target}"
    if result.written:
        print(f"{result.path}: patched{via} (backup: {result.backup})")
    else:
        print(f"{result.path}: --check, nothing written" + (f" (would write {result.target})" if via else ""))
    return EXIT_CLEAN
