"""Redaction of secret values from anything we show or store.

The inventory resolves secrets on the controller and registers every value here; connections pass
every command, stdout and stderr string they return or log through `Redactor.redact`. Values
shorter than `MIN_LENGTH` characters are refused by `add` (redacting "a" would mangle every line and
such a value protects nothing). A secret is also redacted in the forms its parts take on the way to
what we show: line by line (a key file), shell-quoted (a command line built by ``ops.shell``, where
a quote inside the value splits it), JSON-escaped and URL-encoded.
"""

from __future__ import annotations

import json
import threading
import urllib.parse

from ops.shell import quote

MASK = "********"
MIN_LENGTH = 4


class Redactor:
    """A thread-safe set of secret strings, replaced by `MASK` in any text."""

    def __init__(self, values: list[str] | tuple[str, ...] = ()):
        self._lock = threading.Lock()
        self._values: tuple[str, ...] = ()
        for value in values:
            self.add(value)

    def add(self, value: str) -> None:
        """Register a secret value (and each long line of a multi-line one)."""
        if not isinstance(value, str):
            raise TypeError(f"secret values are str, got {type(value).__name__}")
        if len(value.strip()) < MIN_LENGTH:
            raise ValueError(f"a secret must have at least {MIN_LENGTH} characters")
        parts = {
            value,
            value.strip(),
            quote(value),
            json.dumps(value)[1:-1],
            urllib.parse.quote(value, safe=""),
        }
        parts.update(line.strip() for line in value.splitlines() if len(line.strip()) >= MIN_LENGTH)
        with self._lock:
            # Longest first, so a secret that contains another is masked whole.
            self._values = tuple(sorted(set(self._values) | parts, key=len, reverse=True))

    def __len__(self) -> int:
        return len(self._values)

    def redact(self, text: str) -> str:
        """Return `text` with every registered secret replaced by `MASK`."""
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        return text
