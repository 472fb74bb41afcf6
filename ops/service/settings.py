"""The service step's arguments, declared once: the deploy, rollback, tune and bench steps all
take them (``fab bench`` restarts our server through the same arguments and defaults).

The inventory's ``serve`` mapping is checked here against the server's own options
(``specops_contract.SERVE_OPTIONS``: the ones marked ``inventory``, their types and choices); what
the server defaults to is ``specops_contract.SERVE_DEFAULTS``.
"""

from __future__ import annotations

from typing import Any

from ops.api.args import Arg, arguments, check_args
from specops_contract import SERVE_DEFAULTS, SERVE_OPTIONS, SERVICE

SERVE_KEYS = {name: option.kind for name, option in SERVE_OPTIONS.items() if option.inventory}
SERVE_FOREIGN = {"num_speculative_tokens"}  # read by the drafter lint, not by our server
BACKENDS = ("auto", "systemd", "supervisor")


def serve_arg(value: Any) -> dict[str, Any]:
    """The inventory's ``serve`` mapping, with known keys type-checked and typos refused."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping like {{port: 8000, mode: ddtree}}, got {value!r}")
    clean: dict[str, Any] = {}
    for key, raw in value.items():
        if key in SERVE_FOREIGN:
            continue
        if key not in SERVE_KEYS:
            raise ValueError(f"unknown serve key '{key}' (known: {', '.join(sorted(SERVE_KEYS))})")
        kind = SERVE_KEYS[key]
        try:
            clean[key] = kind(str(raw).strip()) if kind is int and not isinstance(raw, bool) else kind(raw)
        except ValueError:
            raise ValueError(f"serve.{key}: expected {kind.__name__}, got {raw!r}") from None
    for key, value in clean.items():
        choices = SERVE_OPTIONS[key].choices
        if choices and value not in choices:
            raise ValueError(f"serve.{key}: expected one of {', '.join(choices)}, got {value!r}")
    if "port" in clean and not 0 < clean["port"] < 65536:
        raise ValueError(f"serve.port: expected 1-65535, got {clean['port']}")
    return clean


def backend_arg(value: Any) -> str:
    if value not in BACKENDS:
        raise ValueError(f"expected one of {', '.join(BACKENDS)}, got {value!r}")
    return value


def serve_url(serve: dict[str, Any]) -> str:
    """Where the controller's scripts on the host reach the server (a wildcard bind via loopback)."""
    host = serve.get("host", SERVE_DEFAULTS["host"])
    host = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    return f"http://{host}:{serve.get('port', SERVE_DEFAULTS['port'])}"


SERVICE_ARGS = arguments(
    base=Arg(str, required=True, help="the host's base directory"),
    release=Arg(str, required=True, help="release id to run, or 'previous' to go back one release"),
    venv=Arg(str, required=True, help="the host venv whose python runs the server"),
    target=Arg(str, required=True, help="target checkpoint directory on the host"),
    drafter=Arg(str, required=True, help="drafter checkpoint directory on the host"),
    env_file=Arg(str, required=True, help="the 0600 environment file (secrets live there)"),
    serve=Arg(
        serve_arg,
        default={},
        help=f"inventory serve vars: {', '.join(SERVE_KEYS)}",
    ),
    name=Arg(str, default=SERVICE, help="service (unit) name"),
    backend=Arg(backend_arg, default="auto", help="auto | systemd | supervisor"),
    timeout=Arg(float, default=300.0, help="seconds for /health and one completion"),
    stop_timeout=Arg(float, default=30.0, help="seconds between TERM and KILL"),
    prompt=Arg(str, default="the", help="prompt of the proving completion"),
)


def service_args(**raw: Any) -> dict[str, Any]:
    """The service step's arguments from ``raw`` plus the declared defaults."""
    return check_args(SERVICE_ARGS, raw)
