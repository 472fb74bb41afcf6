"""``specops``: the project's command line, one sub-command group per module.

Why: command groups belong to the packages that implement them (``config`` to the drafter
linter, ``bench`` to the benchmark tools); this entry point only lists those modules, each of
which exposes ``register(subparsers)`` and sets a ``handler(args) -> exit code`` on its commands.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

COMMAND_GROUPS = (
    "drafter_config.cli",
    "ops.bench.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specops", description="speculative-decoding deployment toolkit")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_GROUPS:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
