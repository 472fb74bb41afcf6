"""Playbooks: load and validate the YAML, then render each step's arguments per host.

Everything that can be checked before touching a host is checked at load time (keys, step
names, argument names, literal argument types, Jinja syntax), so a typo costs one error naming
``file:line`` and the key, not a half-applied run. What depends on the host (variables, ``when:``)
is rendered per host with ``StrictUndefined``: an undefined variable is an error, never "".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from ops.api.args import ArgError
from ops.errors import InputFileError, did_you_mean
from ops.steps import REGISTRY, get_step
from ops.yamlfile import line_of, load_yaml, read_source

STEP_KEYS = ("name", "step", "args", "when", "tags", "register", "retries", "ignore_errors", "timeout")
TOP_KEYS = ("name", "steps", "lock")
_WHOLE_EXPRESSION = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\{\{|\}\}).)*)\}\}\s*$", re.S)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# builds the "file:line: step NAME: ..." error for one key of the step being loaded
_Fail = Callable[..., InputFileError]

ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


class RenderError(Exception):
    """A per-host rendering failure (undefined variable, bad filter use); the runner adds host/step."""


@dataclass(frozen=True)
class StepSpec:
    """One playbook entry, validated; ``args`` are still templates until :func:`render`."""

    index: int
    name: str
    step: str
    args: dict[str, Any]
    when: bool | str | None = None
    tags: tuple[str, ...] = ()
    register: str | None = None
    retries: int = 0
    ignore_errors: bool = False
    line: int = 0
    timeout: float | None = None  # seconds for each of the step's commands that sets none itself


@dataclass(frozen=True)
class Playbook:
    """A validated playbook; ``dir`` is where its relative sources (templates, files) are found."""

    path: Path
    name: str
    steps: tuple[StepSpec, ...] = ()
    lock: bool = False  # take the host's lock (ops/hostlock.py) while it runs, unless --check

    @property
    def dir(self) -> Path:
        return self.path.parent


def _hint(word: str, choices: Any) -> str:
    return did_you_mean(word, choices, f"allowed: {', '.join(sorted(choices))}")


# ---------------------------------------------------------------- loading and validation
def load_playbook(path: str | Path) -> Playbook:
    """Parse and validate a playbook; every problem is an InputFileError with file:line."""
    path = Path(path)
    text = read_source(path, "playbook", "check the path (relative paths start at the current directory)")
    doc = load_yaml(text, path)
    if not isinstance(doc, dict):
        raise InputFileError(
            path,
            1,
            "a playbook is a mapping with 'name' and 'steps'",
            "start the file with 'name: ...' then 'steps:'",
        )
    for key in doc:
        if key not in TOP_KEYS:
            raise InputFileError(path, line_of(doc, key, 1), f"unknown key '{key}'", _hint(key, TOP_KEYS))
    name = doc.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise InputFileError(path, line_of(doc, "name", 1), "'name' must be a non-empty string")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        raise InputFileError(
            path,
            line_of(doc, "steps", 1),
            "'steps' must be a non-empty list",
            "add steps like '- step: directory'",
        )
    specs = tuple(_load_step(path, i, raw, steps.item_lines[i]) for i, raw in enumerate(steps))
    seen: set[str] = set()
    for spec in specs:
        if spec.register in seen:
            raise InputFileError(
                path,
                spec.line,
                f"register name '{spec.register}' is used twice",
                "give each registered result its own name",
            )
        if spec.register:
            seen.add(spec.register)
    lock = doc.get("lock", False)
    if not isinstance(lock, bool):
        raise InputFileError(path, line_of(doc, "lock", 1), f"'lock' must be true or false, got {lock!r}")
    return Playbook(path=path.resolve(), name=name, steps=specs, lock=lock)


def _load_step(path: Path, index: int, raw: Any, line: int) -> StepSpec:
    where, step_name, label = _step_header(path, index, raw, line)

    def fail(key: str, message: str, hint: str | None = None) -> InputFileError:
        return InputFileError(path, line_of(raw, key, line), f"{where}: {message}", hint)

    args = _step_args(path, line, where, step_name, raw, fail)
    when = _step_when(raw, fail)
    tags = _step_tags(raw, fail)
    register = raw.get("register")
    if register is not None and (not isinstance(register, str) or not _IDENTIFIER.match(register)):
        raise fail(
            "register", f"'register' must be an identifier, got {register!r}", "use letters, digits, _"
        )
    retries = raw.get("retries", 0)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise fail("retries", f"'retries' must be a whole number >= 0, got {retries!r}")
    ignore_errors = raw.get("ignore_errors", False)
    if not isinstance(ignore_errors, bool):
        raise fail("ignore_errors", f"'ignore_errors' must be true or false, got {ignore_errors!r}")
    timeout = raw.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
    ):
        raise fail("timeout", f"'timeout' must be a positive number of seconds, got {timeout!r}")
    return StepSpec(
        index=index,
        name=label,
        step=step_name,
        args=args,
        when=when,
        tags=tags,
        register=register,
        retries=retries,
        ignore_errors=ignore_errors,
        line=line,
        timeout=None if timeout is None else float(timeout),
    )


def _step_header(path: Path, index: int, raw: Any, line: int) -> tuple[str, str, str]:
    """A step's mapping shape, keys, step and name -> (where to say it is, step name, label)."""
    if not isinstance(raw, dict):
        raise InputFileError(
            path,
            line,
            f"step {index + 1} must be a mapping with a 'step' key",
            "write '- step: NAME' followed by 'args:'",
        )
    label = raw.get("name") if isinstance(raw.get("name"), str) else raw.get("step")
    where = f"step '{label}'" if isinstance(label, str) else f"step {index + 1}"
    for key in raw:
        if key not in STEP_KEYS:
            raise InputFileError(
                path, line_of(raw, key, line), f"{where}: unknown key '{key}'", _hint(key, STEP_KEYS)
            )
    step_name = raw.get("step")
    if not isinstance(step_name, str):
        raise InputFileError(
            path,
            line,
            f"{where}: 'step' (the operation to run) is missing or not a string",
            f"known steps: {', '.join(sorted(REGISTRY))}",
        )
    try:
        get_step(step_name)
    except KeyError as exc:
        raise InputFileError(
            path, line_of(raw, "step", line), f"{where}: unknown step '{step_name}'", exc.args[0]
        ) from None
    label = raw.get("name", step_name)
    if not isinstance(label, str) or not label.strip():
        raise InputFileError(path, line_of(raw, "name", line), f"{where}: 'name' must be a non-empty string")
    return where, step_name, label


def _step_args(
    path: Path, line: int, where: str, step_name: str, raw: dict[str, Any], fail: _Fail
) -> dict[str, Any]:
    """The step's 'args' mapping, with every required argument present."""
    args = raw.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise fail("args", "'args' must be a mapping", "write 'args: {key: value}'")
    _check_step_args(path, line, where, step_name, args)
    for key, spec in get_step(step_name).args.items():
        if spec.required and args.get(key) is None:
            raise fail("args", f"missing required argument '{key}' for step '{step_name}'", spec.help or None)
    return dict(args)


def _step_when(raw: dict[str, Any], fail: _Fail) -> bool | str | None:
    """The step's 'when': a boolean or an expression that compiles (checked at load, not at run)."""
    when = raw.get("when")
    if when is not None:
        if not isinstance(when, (bool, str)):
            raise fail("when", "'when' must be a boolean or an expression string")
        if isinstance(when, str):
            try:
                ENV.compile_expression(_expression(when))
            except jinja2.TemplateSyntaxError as exc:
                raise fail("when", f"bad 'when' expression: {exc.message}") from None
    return when


def _step_tags(raw: dict[str, Any], fail: _Fail) -> tuple[str, ...]:
    """The step's 'tags': one string or a list of strings."""
    tags = raw.get("tags", [])
    if isinstance(tags, str):
        tags = [tags]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise fail("tags", "'tags' must be a string or a list of strings")
    return tuple(tags)


def _check_step_args(path: Path, line: int, where: str, step_name: str, args: dict[str, Any]) -> None:
    """Each argument is declared by the step, its templates compile, and a literal value converts."""
    declared = get_step(step_name).args
    for key, value in args.items():
        arg_line = line_of(args, key, line)
        if key not in declared:
            raise InputFileError(
                path,
                arg_line,
                f"{where}: unknown argument '{key}' for step '{step_name}'",
                _hint(key, declared) if declared else "this step takes no arguments",
            )
        _check_templates(path, arg_line, where, key, value)
        if not _has_template(value):
            try:
                declared[key].check(key, value)
            except ArgError as exc:
                raise InputFileError(path, arg_line, f"{where}: {exc}", declared[key].help or None) from None


def _has_template(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(_has_template(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_template(v) for v in value)
    return False


def _check_templates(path: Path, line: int, where: str, key: str, value: Any) -> None:
    """Jinja syntax errors are load-time errors, located at the argument's line."""
    if isinstance(value, dict):
        for v in value.values():
            _check_templates(path, line, where, key, v)
    elif isinstance(value, list):
        for v in value:
            _check_templates(path, line, where, key, v)
    elif isinstance(value, str) and _has_template(value):
        try:
            ENV.parse(value)
        except jinja2.TemplateSyntaxError as exc:
            raise InputFileError(
                path,
                line,
                f"{where}: argument '{key}' has bad Jinja: {exc.message}",
                "close every '{{' with '}}' and quote the whole value",
            ) from None


# ---------------------------------------------------------------- per-host rendering
def _expression(text: str) -> str:
    match = _WHOLE_EXPRESSION.match(text)
    return match["expr"] if match else text


# Compiling is most of a step's controller CPU: the same strings render on every host and run.
@functools.lru_cache(maxsize=2048)
def _template(source: str) -> jinja2.Template:
    return ENV.from_string(source)


@functools.lru_cache(maxsize=2048)
def _compiled_expression(source: str) -> Any:
    return ENV.compile_expression(source, undefined_to_none=False)


def render(value: Any, variables: dict[str, Any]) -> Any:
    """Render templates in ``value`` recursively; a whole ``"{{ expr }}"`` keeps its native type."""
    if isinstance(value, dict):
        return {k: render(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, variables) for v in value]
    if not isinstance(value, str) or not _has_template(value):
        return value
    try:
        match = _WHOLE_EXPRESSION.match(value)
        if match:
            result = _compiled_expression(match["expr"])(**variables)
            if isinstance(result, jinja2.Undefined):
                str(result)  # raises UndefinedError with the variable's name
            return result
        return _template(value).render(variables)
    except jinja2.UndefinedError as exc:
        raise RenderError(f"undefined variable: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc}") from None
    except Exception as exc:  # the user's expression raised (1 / 0, a bad comparison): that host's failure
        raise RenderError(f"expression {value.strip()!r} raised {type(exc).__name__}: {exc}") from None


def evaluate_when(when: bool | str | None, variables: dict[str, Any]) -> bool:
    """``when:`` as a bool, a bare expression or a ``"{{ expression }}"`` string."""
    if when is None or isinstance(when, bool):
        return when is not False
    try:
        result = _compiled_expression(_expression(when))(**variables)
        if isinstance(result, jinja2.Undefined):
            str(result)
    except jinja2.UndefinedError as exc:
        raise RenderError(f"'when' uses an undefined variable: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise RenderError(f"'when' failed: {exc}") from None
    except Exception as exc:  # the user's expression raised (1 / 0, a bad comparison): that host's failure
        raise RenderError(f"'when' {when.strip()!r} raised {type(exc).__name__}: {exc}") from None
    if isinstance(result, str):
        return result.strip().lower() not in ("", "false", "no", "0", "none")
    return bool(result)
