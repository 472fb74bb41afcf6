"""The service step's arguments, declared once: the deploy, rollback, tune and bench steps all
take them (``fab bench`` restarts our server through the same arguments and defaults).

The inventory's ``serve`` mapping is checked here against the server's own options
(``specops_contract.SERVE_OPTIONS``: the ones marked ``inventory``, their types and choices); what
the server defaults to is ``specops_contract.SERVE_DEFAULTS``.
"""

from __future__ import annotations

from typing import Any

from ops.api.args import Arg, arguments, check_args
from ops.service.systems import DEFAULT_SYSTEM, system_named
from ops.service.thresholds import acceptance_arg
from specops_contract import SERVE_DEFAULTS, SERVE_OPTIONS, SERVICE

# our server's keys come from the contract; the others choose and configure vLLM or SGLang
SERVE_KEYS = {
    **{name: option.kind for name, option in SERVE_OPTIONS.items() if option.inventory},
    "system": str,
    "num_speculative_tokens": int,
    "tensor_parallel": int,
    "served_name": str,
    "venv": str,
    "extra_args": list,
}
OURS_ONLY = {
    "budget": "num_speculative_tokens",
    "device": "tensor_parallel for several GPUs",
    "cost_table": "none (it feeds our --budget-policy load)",
}
FOREIGN_ONLY = ("tensor_parallel", "served_name", "venv", "extra_args")
BACKENDS = ("auto", "systemd", "supervisor")


def _typed(key: str, raw: Any) -> Any:
    kind = SERVE_KEYS[key]
    if kind is list:
        if not isinstance(raw, list) or not all(isinstance(a, (str, int, float)) for a in raw):
            raise ValueError(f"serve.{key}: expected a list of arguments, got {raw!r}")
        if any("\n" in str(a) or "\r" in str(a) for a in raw):
            raise ValueError(f"serve.{key}: an argument holds a line break")
        return [str(a) for a in raw]
    try:
        return kind(str(raw).strip()) if kind is int and not isinstance(raw, bool) else kind(raw)
    except ValueError:
        raise ValueError(f"serve.{key}: expected {kind.__name__}, got {raw!r}") from None


def serve_arg(value: Any) -> dict[str, Any]:
    """The inventory's ``serve`` mapping, with known keys type-checked, typos refused, and each
    key checked against ``system`` (ddtree, vllm or sglang; ``ops/service/systems.py``)."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping like {{port: 8000, mode: ddtree}}, got {value!r}")
    for key in value:
        if key not in SERVE_KEYS:
            raise ValueError(f"unknown serve key '{key}' (known: {', '.join(sorted(SERVE_KEYS))})")
    system = system_named(str(value.get("system", DEFAULT_SYSTEM)))
    clean: dict[str, Any] = {}
    for key, raw in value.items():
        if system.name == DEFAULT_SYSTEM and key == "num_speculative_tokens":
            continue  # our server drafts block_size - 1; the drafter lint reads it
        if system.name == DEFAULT_SYSTEM and key in FOREIGN_ONLY:
            raise ValueError(f"serve.{key} applies to vllm and sglang (set serve.system), not to ddtree")
        if system.name != DEFAULT_SYSTEM and key in OURS_ONLY:
            raise ValueError(f"serve.{key} is our runtime's; {system.name} takes {OURS_ONLY[key]}")
        clean[key] = _typed(key, raw)
    if system.name != DEFAULT_SYSTEM and "mode" not in clean:
        raise ValueError(f"serve.mode: {system.name} needs one, of {', '.join(system.modes)}")
    if "mode" in clean and clean["mode"] not in system.modes:
        raise ValueError(
            f"serve.mode: expected one of {', '.join(system.modes)} for system {system.name}, "
            f"got {clean['mode']!r}"
        )
    if system.name == DEFAULT_SYSTEM:  # our server's own choices (the contract's), beside its modes
        for key, choice in clean.items():
            choices = SERVE_OPTIONS[key].choices if key in SERVE_OPTIONS else ()
            if choices and choice not in choices:
                raise ValueError(f"serve.{key}: expected one of {', '.join(choices)}, got {choice!r}")
    if "port" in clean and not 0 < clean["port"] < 65536:
        raise ValueError(f"serve.port: expected 1-65535, got {clean['port']}")
    for key in ("tensor_parallel", "num_speculative_tokens"):
        if key in clean and not 0 < clean[key] <= 1024:
            raise ValueError(f"serve.{key}: expected 1-1024, got {clean[key]}")
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
    acceptance=Arg(
        acceptance_arg,
        default={},
        help="the acceptance gate after a (re)start: {min_tau, spec, prompts, requests, max_tokens}; "
        "{} skips it (ops/service/acceptance.py)",
    ),
)


def service_args(**raw: Any) -> dict[str, Any]:
    """The service step's arguments from ``raw`` plus the declared defaults."""
    return check_args(SERVICE_ARGS, raw)
