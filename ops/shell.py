"""The ONE quoting path for arguments that reach a shell (remote or local).

Every command built from values (paths, user input, template output) goes through `quote`/`join`
so no value is ever concatenated into a shell string unquoted.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from os import PathLike


def quote(arg: str | PathLike[str] | int) -> str:
    """Quote one argument for a POSIX shell."""
    return shlex.quote(os.fspath(arg) if isinstance(arg, PathLike) else str(arg))


def join(argv: Sequence[str | PathLike[str] | int]) -> str:
    """Join an argument vector into one POSIX shell command line."""
    if isinstance(argv, str):
        raise TypeError("join() takes a sequence of arguments, not a string")
    return " ".join(quote(a) for a in argv)
