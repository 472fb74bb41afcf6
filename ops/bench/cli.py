"""``specops bench report|import``: the command-line face of the benchmark results tools.

Why: docs/architecture.md fixes these two commands as contracts (CI jobs and users script against them); this
module only parses arguments, calls the library and maps failures to one-line errors and exit codes:
0 done, 2 unusable input (a bad or missing file, an invalid field).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from ops.bench.cells import SETTABLE
from ops.bench.importers import DEFAULT_HOST, FORMATS, import_files
from ops.bench.report import make_report
from ops.errors import SpecopsError

EXIT_OK, EXIT_UNUSABLE = 0, 2


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` command group to the top-level ``specops`` parser."""
    bench = subparsers.add_parser("bench", help="benchmark results: reports and foreign-result import")
    commands = bench.add_subparsers(dest="bench_command", required=True, metavar="COMMAND")

    report = commands.add_parser("report", help="table, report.md and PNG plots from result directories")
    report.add_argument(
        "results",
        nargs="+",
        metavar="RESULTS_DIR",
        help="results/<run-id> directories (several to compare hosts or dates), or result files",
    )
    report.add_argument(
        "--out", metavar="DIR", help="where report.md and the plots go (default: the first RESULTS_DIR)"
    )
    report.set_defaults(handler=run_report)

    imp = commands.add_parser(
        "import", help="normalize vLLM `bench serve` JSON / SGLang `bench_serving` JSONL"
    )
    imp.add_argument("--from", dest="fmt", choices=FORMATS, required=True, help="which tool wrote the files")
    imp.add_argument("files", nargs="+", metavar="FILE")
    imp.add_argument(
        "--into", required=True, metavar="RESULTS_DIR", help="run directory, e.g. results/<run-id>"
    )
    imp.add_argument(
        "--host", default=DEFAULT_HOST, help=f"host the numbers were measured on (default: {DEFAULT_HOST})"
    )
    imp.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="fill a result field the file lacks, e.g. mode=dflash, budget=64, prompt_set=math, "
        "temperature=0, hardware.gpu_name=H200 (repeatable)",
    )
    imp.set_defaults(handler=run_import)


def run_report(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path(args.results[0])
    if out.is_file():
        out = out.parent
    try:
        report = make_report(args.results, out)
    except SpecopsError as exc:
        print(f"specops bench report: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 200
    console.print(report.table)
    console.print(f"wrote {report.markdown_path}" + "".join(f"\nwrote {p}" for p in report.plots))
    return EXIT_OK


def run_import(args: argparse.Namespace) -> int:
    settings = {}
    for item in args.settings:
        name, sep, value = item.partition("=")
        if not sep or name not in SETTABLE:
            print(
                f"specops bench import: --set {item!r}: expected FIELD=VALUE with FIELD one of "
                f"{', '.join(sorted(SETTABLE))}",
                file=sys.stderr,
            )
            return EXIT_UNUSABLE
        settings[name] = value
    try:
        written = import_files(args.fmt, args.files, args.into, host=args.host, settings=settings)
    except SpecopsError as exc:
        print(f"specops bench import: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    for path in written:
        print(f"wrote {path}")
    return EXIT_OK
