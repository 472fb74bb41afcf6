"""User-facing failures.

Every error a user can cause (a bad inventory, an unknown host key, a host that does not answer)
is a `SpecopsError` whose ``str()`` is ONE line that names where the problem is and how to fix it,
so the runner can print it next to the host name without a traceback. The base class and the
did-you-mean hint live in ``specops_contract`` because the drafter lint, which the runtime also
imports, raises them too.
"""

from __future__ import annotations

from pathlib import Path

from specops_contract import SpecopsError, did_you_mean

__all__ = ["HostKeyError", "HostUnreachable", "InputFileError", "SpecopsError", "did_you_mean"]


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
