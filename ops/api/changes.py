"""What a plan is made of: read-only facts, the changes that apply themselves, and the outcome.

A :class:`Fact` is a shell command plus a *pure* parser of its result (pyinfra's ``command()`` /
``process(output)``), so parsers are unit-tested on captured output. A plan lists changes --
:class:`Run` (a command), :class:`Write` (a file, with its unified diff), :class:`Action` (work
the controller drives) -- each with ``describe()`` (what ``--check`` prints) and ``apply(conn)``,
so the runner never dispatches on their type.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ops.errors import SpecopsError

if TYPE_CHECKING:
    from ops.connection import CommandResult, Connection

T = TypeVar("T")


class StepFailed(SpecopsError):
    """A step could not reach its wanted state; carries the command and stderr for the report."""

    def __init__(self, message: str, *, command: str | None = None, stderr: str = "") -> None:
        super().__init__(message)
        self.command = command
        self.stderr = stderr


@dataclass(frozen=True)
class Fact(Generic[T]):
    """A read-only fact: the command that reads it and a pure parser of the result."""

    command: str
    parse: Callable[[CommandResult], T]

    def gather(self, conn: Connection, *, sudo: bool = False, timeout: float | None = None) -> T:
        return self.parse(conn.run(self.command, sudo=sudo, timeout=timeout))


@dataclass(frozen=True)
class Run:
    """A change that runs one command on the host (``command`` already quoted)."""

    command: str
    sudo: bool = False
    timeout: float | None = None
    why: str = ""

    def describe(self) -> str:
        return f"run: {self.command}" + (f"  # {self.why}" if self.why else "")

    def apply(self, conn: Connection) -> Any:
        """Run the command; a non-zero exit raises StepFailed with the command and its stderr."""
        check_result(conn.run(self.command, sudo=self.sudo, timeout=self.timeout))


@dataclass(frozen=True)
class Write:
    """A change that writes one file atomically; ``diff`` is the unified diff shown to the user."""

    path: str
    data: bytes = field(repr=False)
    mode: str | None = None
    diff: str = ""
    why: str = ""

    def describe(self) -> str:
        mode = f" (mode {self.mode})" if self.mode else ""
        return f"write: {self.path}{mode}" + (f"  # {self.why}" if self.why else "")

    def apply(self, conn: Connection) -> Any:
        """Write the file atomically with its mode."""
        try:
            conn.write_bytes(self.path, self.data, int(self.mode, 8) if self.mode else None)
        except OSError as exc:
            raise StepFailed(
                f"cannot write {self.path}: {exc.strerror or exc} (does its directory "
                "exist? create it with a directory step first)"
            ) from None


@dataclass(frozen=True)
class Action:
    """Work the controller drives on the host (a benchmark session, a sweep), which is no single
    command: ``fn(conn)`` does it and returns what the step reports; ``summary`` is what --check shows."""

    fn: Callable[[Connection], Any] = field(repr=False)
    summary: str

    def describe(self) -> str:
        return self.summary

    def apply(self, conn: Connection) -> Any:
        return self.fn(conn)


Change = Run | Write | Action


@dataclass(frozen=True)
class Plan:
    """What a step would do: ``changes`` in order, or none plus the ``reason`` nothing is needed."""

    changes: tuple[Change, ...] = ()
    reason: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def noop(cls, reason: str, **data: Any) -> Plan:
        return cls((), reason, dict(data))

    @classmethod
    def of(cls, changes: Sequence[Change], reason: str, **data: Any) -> Plan:
        return cls(tuple(changes), reason, dict(data))

    @property
    def will_change(self) -> bool:
        return bool(self.changes)

    @property
    def diff(self) -> str:
        return "".join(getattr(c, "diff", "") for c in self.changes)


@dataclass(frozen=True)
class Applied:
    """What apply did: whether anything changed, a message, and data for ``register``."""

    changed: bool
    message: str
    data: dict[str, Any] = field(default_factory=dict)


def check_result(result: CommandResult) -> CommandResult:
    """Raise StepFailed for a non-zero exit, with the (redacted) command and stderr."""
    if not result.ok:
        raise StepFailed(
            f"command exited {result.exit_code}",
            command=result.command,
            stderr=result.stderr or result.stdout,
        )
    return result


def unified_diff(path: str, old: bytes | None, new: bytes) -> str:
    """A unified diff for the report; binary content gets a one-line note instead."""
    try:
        old_text = "" if old is None else old.decode("utf-8")
        new_text = new.decode("utf-8")
    except UnicodeDecodeError:
        return f"Binary file {path} differs\n"
    lines = difflib.unified_diff(
        old_text.splitlines(keepends=True),
        new_text.splitlines(keepends=True),
        fromfile="/dev/null" if old is None else f"{path} (host)",
        tofile=f"{path} (wanted)",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )
