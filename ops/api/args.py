"""Declared step arguments: each playbook value goes through its ``Arg`` after Jinja rendering.

The loader refuses unknown and missing names at load time (file:line); per host, each rendered
value is converted by ``Arg.check`` (a type, or a converter raising ``ValueError``), so a step's
probe and plan receive clean typed values in a plain dict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


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
