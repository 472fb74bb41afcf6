"""The Step API: how one playbook operation (``directory``, ``template``, ...) is written.

A step is a class in a family module of ``ops/steps/`` (``files.py``, ``command.py``, ...),
decorated with :func:`register`; ``ops/steps/__init__.py`` imports every module in the folder,
so adding a family is adding a file.

Three phases, kept apart so that ``--check`` is honest and plans are testable as data:

1. ``probe(conn, args, ctx) -> facts`` **reads** the host, never writes (``--check`` runs it for
   real). Build it from :class:`Fact` objects: a shell command plus a *pure* parser of its result
   (pyinfra's ``command()`` / ``process(output)``), so parsers are unit-tested on captured output.
   A probe may also use the connection's read-only calls (``stat``, ``read_bytes``, ``listdir``).
   Facts are plain JSON-able data: they appear in the step-case test files.
2. ``plan(facts, args, ctx) -> Plan`` is **pure** (no connection; it may read controller-side
   files such as a template source). It compares the facts with the wanted state and returns
   either the changes to make -- :class:`Run` (a command), :class:`Write` (a file, with its
   unified diff) and :class:`Action` (work the controller drives, such as a benchmark session) --
   or ``Plan.noop("directory exists with mode 0755")``: a reason, never silence.
   This is what ``--check`` prints, and what ``tests/ops/step_cases/<step>/*.yaml`` exercise.
3. ``apply(conn, plan, ctx) -> Applied`` makes the changes. Each change applies itself
   (``change.apply(conn)``: a ``Run`` whose command exits non-zero raises :class:`StepFailed` with
   the command and its stderr, a ``Write`` writes atomically); the default applies them in order.
   Override it only when applying needs feedback (what a change returned, a rollback).

"Changed" is mechanical: the runner reports ``changed`` iff apply executed at least one change
(``Applied.changed``); at plan time, ``Plan.will_change`` is what ``--check`` reports.

Arguments are declared, so bad playbooks fail at load time with file:line::

    @register
    class Directory(Step):
        name = "directory"
        summary = "a directory with a mode and owner"
        args = arguments(path=Arg(str, required=True), mode=Arg(mode_arg, default="0755"))

The loader rejects unknown and missing argument names; after Jinja rendering, per host, each
value goes through ``Arg.convert`` (a type or a converter raising ``ValueError``), so probe and
plan receive clean typed values in a plain dict.

Rules for step authors:

- Every remote argument goes through ``ops.shell.quote`` / ``ops.shell.join``; never concatenate
  user values into a shell string.
- A step that cannot know whether its work is already done sets ``idempotent = False`` (class
  flag; override ``is_idempotent(args)`` when arguments decide, as ``command`` does with
  ``creates``/``unless``); the runner labels its changes "(not idempotent)". Prefer a probe.
- Steps compose through shared helpers in their family module, not by calling another step.
- ``Plan.data`` / ``Applied.data`` (JSON-able dicts) are what ``register: NAME`` exposes to
  later steps as ``NAME.<key>``, next to ``NAME.status``, ``NAME.changed`` and ``NAME.message``.
- Secrets never go on a command line: write them into a 0600 file with a :class:`Write`.
- ``ctx.vars`` holds what templates see: the host's ``template_vars()``, ``layout`` (the host's
  :class:`ops.layout.HostLayout`), ``secrets`` (the host's resolved secrets, registered with the
  run's Redactor), ``check`` (bool) and registered results. Run-wide objects (``ctx.run_dir``,
  ``ctx.reporter``, ``ctx.progress``) are attributes of the context, never variables.
  ``ctx.find_source(src)`` finds a controller file (absolute, beside the playbook, ``templates/``).
- Raise :class:`StepFailed` (message, ``command=``, ``stderr=``) for anything the user must fix;
  the runner shows it with host and step, redacted. Helpers: :func:`check_result`,
  :func:`unified_diff`, :func:`mode_arg`, :func:`str_list`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from ops.errors import SpecopsError

if TYPE_CHECKING:
    from ops.bench.progress import BenchProgress
    from ops.connection import CommandResult, Connection
    from ops.hosts import Host
    from ops.output import Reporter

T = TypeVar("T")


class StepFailed(SpecopsError):
    """A step could not reach its wanted state; carries the command and stderr for the report."""

    def __init__(self, message: str, *, command: str | None = None, stderr: str = "") -> None:
        super().__init__(message)
        self.command = command
        self.stderr = stderr


class ArgError(ValueError):
    """A step argument has the wrong type or value; the runner names step, host and argument."""


@dataclass(frozen=True)
class Arg:
    """One declared step argument: its converter, whether it is required, and its default."""

    convert: Callable[[Any], Any]
    required: bool = False
    default: Any = None
    help: str = ""

    def check(self, name: str, value: Any) -> Any:
        """Convert ``value``; None keeps the default. Raises ArgError naming the argument."""
        if value is None:
            if self.required:
                raise ArgError(f"argument '{name}' is required")
            return self.default
        try:
            if isinstance(self.convert, type):
                return _as_type(self.convert, value)
            return self.convert(value)
        except (TypeError, ValueError) as exc:
            raise ArgError(f"argument '{name}': {exc}") from None


def _as_type(kind: type, value: Any) -> Any:
    """Strict type check with the few conversions a rendered template needs ("30" -> 30)."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        raise ValueError(f"expected true/false, got {value!r}")
    if kind in (int, float) and isinstance(value, str):
        return kind(value.strip())
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def arguments(**specs: Arg) -> Mapping[str, Arg]:
    """A step's declared arguments, in order, read-only (shared by every instance)."""
    return MappingProxyType(specs)


def check_args(specs: Mapping[str, Arg], raw: dict[str, Any]) -> dict[str, Any]:
    """Rendered arguments -> typed values with the declared defaults; unknown names refused."""
    unknown = sorted(set(raw) - set(specs))
    if unknown:
        raise ArgError(f"unknown argument '{unknown[0]}' (known: {', '.join(sorted(specs))})")
    return {name: spec.check(name, raw.get(name)) for name, spec in specs.items()}


def mode_arg(value: Any) -> str:
    """A file mode as four octal digits: "0755", "755", YAML ``0755`` and ``755`` all mean 0o755.

    The playbook loader keeps the written text of YAML ints (``raw``), because YAML reads ``755``
    as decimal while everyone writing a mode means chmod's octal. An int is read by its digits, so
    one whose digits are not all octal (``999``, ``0x1ed``) is refused, never taken as decimal.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected an octal mode like '0755', got {value!r}")
    if isinstance(value, int):
        digits = getattr(value, "raw", "") or str(value)
        if not (digits.isdigit() and set(digits) <= set("01234567")):
            raise ValueError(
                f"mode {digits} is not octal (chmod digits are 0-7; fix: write it quoted, like '0755')"
            )
        number = int(digits, 8)
    elif isinstance(value, str) and value.strip():
        try:
            number = int(value.strip(), 8)
        except ValueError:
            raise ValueError(f"expected an octal mode like '0755', got {value!r}") from None
    else:
        raise ValueError(f"expected an octal mode like '0755', got {value!r}")
    if not 0 <= number <= 0o7777:
        raise ValueError(f"mode {value!r} is out of range")
    return f"{number:04o}"


def str_list(value: Any) -> list[str]:
    """A list of strings; a single string becomes a one-item list."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ValueError(f"expected a string or a list of strings, got {value!r}")


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


@dataclass
class StepContext:
    """Per host and step: where the step looks for controller files, the template variables, and
    the run-wide objects (never host variables: playbooks stay plain data).

    ``run_dir`` is where the run's results go on the controller (``results/<run-id>``; for
    ``fab bench --resume`` the resumed run's), ``reporter`` the run's output, and ``progress`` the
    benchmark display that ``fab bench``/``fab tune`` open (None otherwise).
    """

    host: Host
    playbook_dir: Path
    templates_dir: Path
    vars: dict[str, Any]
    check: bool = False
    run_dir: Path | None = None
    reporter: Reporter | None = None
    progress: BenchProgress | None = None

    def find_source(self, src: str) -> Path:
        """A controller-side file: absolute, else beside the playbook, else in ``templates/``."""
        candidates = (
            [Path(src).expanduser()]
            if Path(src).expanduser().is_absolute()
            else [
                self.playbook_dir / src,
                self.templates_dir / src,
            ]
        )
        for path in candidates:
            if path.is_file():
                return path
        tried = ", ".join(str(p) for p in candidates)
        raise StepFailed(f"source file '{src}' not found (looked in: {tried})")


class Step:
    """Base class of every registered operation; see the module docstring for the contract."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    args: ClassVar[Mapping[str, Arg]] = MappingProxyType({})
    idempotent: ClassVar[bool] = True

    def check_args(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Rendered playbook arguments -> typed values (unknown names were refused at load)."""
        return check_args(self.args, raw)

    def is_idempotent(self, args: dict[str, Any]) -> bool:
        """Whether a second run with these arguments is guaranteed to change nothing."""
        return self.idempotent

    def probe(self, conn: Connection, args: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        raise NotImplementedError

    def plan(self, facts: dict[str, Any], args: dict[str, Any], ctx: StepContext) -> Plan:
        raise NotImplementedError

    def apply(self, conn: Connection, plan: Plan, ctx: StepContext) -> Applied:
        """Apply every change in order; the first failure stops the step."""
        for change in plan.changes:
            change.apply(conn)
        return Applied(bool(plan.changes), plan.reason, dict(plan.data))


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


REGISTRY: dict[str, type[Step]] = {}


def register(cls: type[Step]) -> type[Step]:
    """Class decorator: make ``cls`` available to playbooks under ``cls.name``."""
    if not cls.name or cls.name in REGISTRY:
        raise RuntimeError(f"step name {cls.name!r} is empty or registered twice")
    REGISTRY[cls.name] = cls
    return cls
