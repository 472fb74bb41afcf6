"""User-facing failures.

Every error a user can cause (a bad inventory, an unknown host key, a host that does not answer)
is a `SpecopsError` whose ``str()`` is ONE line that names where the problem is and how to fix it,
so the runner can print it next to the host name without a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


class SpecopsError(Exception):
    """Base for user-facing failures; str() is one line with the fix."""


def did_you_mean(word: object, choices: Iterable[str], otherwise: str | None = None) -> str | None:
    """The hint for a misspelt name: "did you mean 'x'?" when a choice is close, else `otherwise`."""
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f"did you mean '{close[0]}'?" if close else otherwise


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class InputFileError(SpecopsError):
    """A problem in a file the user wrote (inventory, playbook, spec), located by file and line."""

    def __init__(self, path: str | Path, line: int | None, message: str, hint: str | None = None):
        self.path = str(path)
        self.line = line
        self.message = message
        self.hint = hint
        where = self.path if line is None else f"{self.path}:{line}"
        text = f"{where}: {_one_line(message)}"
        if hint:
            text += f" (fix: {_one_line(hint)})"
        super().__init__(text)


class HostUnreachable(SpecopsError):
    """The transport to a host failed (refused, timed out, lost, authentication refused)."""

    def __init__(self, host: str, cause: str, hint: str | None = None):
        self.host = host
        self.cause = _one_line(cause)
        self.hint = hint
        text = f"host '{host}' unreachable: {self.cause}"
        if hint:
            text += f" (fix: {_one_line(hint)})"
        super().__init__(text)


class HostKeyError(SpecopsError):
    """A host key was unknown under the strict policy, or differs from the recorded one."""

    def __init__(self, host: str, message: str, hint: str | None = None):
        self.host = host
        self.message = _one_line(message)
        self.hint = hint
        text = f"host '{host}': {self.message}"
        if hint:
            text += f" (fix: {_one_line(hint)})"
        super().__init__(text)


class WriteFailed(SpecopsError):
    """A file could not be written completely on a host; the file it was to replace is unchanged."""

    def __init__(self, host: str, path: str, why: str, hint: str | None = None):
        self.host = host
        self.path = path
        text = f"host '{host}': writing {path} failed: {_one_line(why)}; {path} is unchanged"
        if hint:
            text += f" (fix: {_one_line(hint)})"
        super().__init__(text)
