"""The Step API: how one playbook operation (``directory``, ``template``, ...) is written.

A step is a class in a family module of ``ops/steps/`` (``files.py``, ``command.py``, ...),
decorated with :func:`register`; ``ops/steps/__init__.py`` imports every module in the folder,
so adding a family is adding a file. What a step builds with (facts, changes, plans, arguments,
the context, templates) lives below the steps in ``ops/api/``, where the domain packages
(``ops/service``, ``ops/bench``, ``ops/gpu``) use it too; this module holds the ``Step`` class and
the registry.

Three phases, kept apart so that ``--check`` is honest and plans are testable as data:

1. ``probe(conn, args, ctx) -> facts`` **reads** the host, never writes (``--check`` runs it for
   real). Build it from ``ops.api.changes.Fact`` objects: a shell command plus a *pure* parser of its result
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
  the runner shows it with host and step, redacted. Helpers: ``check_result`` and
  ``unified_diff`` (``ops.api.changes``), ``mode_arg`` and ``str_list`` (``ops.api.args``),
  ``render_template`` (``ops.api.templates``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from ops.api.args import Arg, check_args
from ops.api.changes import Applied, Plan
from ops.api.context import StepContext

if TYPE_CHECKING:
    from ops.connection import Connection


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


REGISTRY: dict[str, type[Step]] = {}


def register(cls: type[Step]) -> type[Step]:
    """Class decorator: make ``cls`` available to playbooks under ``cls.name``."""
    if not cls.name or cls.name in REGISTRY:
        raise RuntimeError(f"step name {cls.name!r} is empty or registered twice")
    REGISTRY[cls.name] = cls
    return cls
