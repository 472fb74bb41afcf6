"""What may go into a ``KEY=VALUE`` environment file (the server's, rendered by the template step).

One line is one variable for every reader (systemd's ``EnvironmentFile=``, the supervisor, the
server), so a line break inside a key or value, from an inventory var, a secret or a host name,
would add variables of its own (``LD_PRELOAD=...``) to a 0600 file that a process trusts. The
template filters below refuse that: keys must be identifiers, values one line. Errors name the
key, never the value (it may be a secret).
"""

from __future__ import annotations

import re
from typing import Any

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BREAKS = re.compile(r"[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029\x00]")


class EnvLineError(ValueError):
    """A key or value that would not stay one line of an env file."""


def env_key(key: Any) -> str:
    """``key`` if it is an identifier (what every env-file reader accepts as a name)."""
    text = str(key)
    if not _IDENTIFIER.fullmatch(text):
        raise EnvLineError(
            f"env file key {text!r} is not an identifier (fix: letters, digits and _, not starting "
            "with a digit)"
        )
    return text


def one_line(value: Any, what: str) -> str:
    """``value`` as text, refused when it holds a line break (it would add lines to the file)."""
    text = str(value)
    if _BREAKS.search(text):
        raise EnvLineError(
            f"{what} holds a line break, which would add lines to the env file (fix: put it on one line)"
        )
    return text


def env_value(value: Any, key: Any) -> str:
    """A value for ``key=``: one line."""
    return one_line(value, f"the value of {env_key(key)}")


FILTERS = {"env_key": env_key, "env_value": env_value, "one_line": one_line}
