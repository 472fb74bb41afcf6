"""Settings of `python -m ddtree_runtime serve`: flags, else the env file, else defaults.

The env file is the `<base>/run/<service>.env` file `fab deploy` renders from the inventory:
`KEY=VALUE` lines, of which the server reads `SPECOPS_SERVE_<FLAG>` (e.g. `SPECOPS_SERVE_BUDGET=64`,
`SPECOPS_SERVE_TEMPERATURE=0.7`) and ignores the rest. The same file holds secrets such as HF_TOKEN
(they must never reach a command line), so it must be mode 0600, and no error ever quotes a value
from it: errors name the file, the line and the key.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ddtree_runtime.loader import default_dtype
from specops_contract import MODES, SERVE_DEFAULTS

ENV_PREFIX = "SPECOPS_SERVE_"
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")
DEFAULT_MAX_CONTEXT = 32768  # caps the cache when the target allows more (--max-context raises it)
KEY_ROUTES = ("v1", "all")  # what --api-key guards: /v1/* (vLLM's choice), or every route


class SettingsError(ValueError):
    """Bad flags or env file; the message names the flag or file:line and the fix."""


@dataclass(frozen=True)
class Settings:
    """One server's settings, resolved; the defaults apply to what neither flags nor env file set."""

    target: str
    drafter: str | None = None
    mode: str = SERVE_DEFAULTS["mode"]  # for requests that name none
    budget: int = SERVE_DEFAULTS["budget"]  # ddtree budget for requests that name none
    modes: tuple[str, ...] = ()  # what requests may pick (all warmed at start); () = (mode,)
    budgets: tuple[int, ...] = ()  # ddtree budgets requests may pick; () = (budget,)
    host: str = SERVE_DEFAULTS["host"]
    port: int = SERVE_DEFAULTS["port"]
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    dtype: str | None = None  # resolved by settings_from: loader.default_dtype(device)
    max_context: int | None = None  # None: the target's max_position_embeddings, capped
    temperature: float | None = None  # for requests that send none; None: generation_config.json, else 0
    threads: int | None = None  # torch CPU threads; None: every core but one (the HTTP loop's)
    queue_size: int = 64
    drain_timeout: float = 20.0  # inside the usual 30 s TERM-to-KILL window of systemd and the supervisor
    served_model_name: str | None = None  # None: --target as given (vLLM's convention)
    api_key: str | None = None  # bearer token clients must send (never logged)
    api_key_routes: str = "v1"  # v1: /v1/* only, /health and /metrics stay open; all: every route
    header_timeout: float = 10.0  # seconds a connection may take to send a request's headers
    max_connections: int | None = None  # None: what the open-file limit allows (connections.py)


FLAGS: dict[str, tuple[type, str]] = {  # Settings field -> (type, help)
    "target": (str, "target checkpoint directory (HF Qwen3, with tokenizer.json)"),
    "drafter": (str, "DFlash drafter checkpoint directory (needed by dflash and ddtree)"),
    "mode": (str, f"decoding mode: {' | '.join(MODES)} (default ddtree)"),
    "budget": (int, "ddtree: tree nodes verified per round (default 64)"),
    "modes": (str, "comma-separated modes requests may pick with the `mode` field (default: --mode)"),
    "budgets": (str, "comma-separated ddtree budgets requests may pick with `budget` (default: --budget)"),
    "host": (str, "address to bind (default 127.0.0.1)"),
    "port": (int, "port to bind (default 8000; 0 picks a free one)"),
    "device": (str, "cpu | cuda (default cuda when available)"),
    "dtype": (
        str,
        f"{' | '.join(DTYPES)} (default bfloat16 on cuda and on CPUs with native bf16, else float32)",
    ),
    "max_context": (
        int,
        f"cache size in tokens: prompt + output + verify rows (default: the model's, "
        f"at most {DEFAULT_MAX_CONTEXT})",
    ),
    "temperature": (
        float,
        "temperature for requests that send none (default: the model's generation_config.json, else 0)",
    ),
    "threads": (int, "torch CPU threads (default: all cores but one, which the HTTP loop keeps)"),
    "queue_size": (int, "requests that may wait for the engine; more get 503 (default 64)"),
    "drain_timeout": (float, "seconds SIGTERM waits for in-flight requests (default 20)"),
    "served_model_name": (str, "model id clients send (default: --target as given)"),
    "api_key": (
        str,
        f"bearer token clients must send on /v1/* (as vLLM's; prefer {ENV_PREFIX}API_KEY in the env file: "
        "a flag is visible in the process list)",
    ),
    "api_key_routes": (str, "v1: the key guards /v1/* only, /health and /metrics stay open (default); all"),
    "header_timeout": (float, "seconds a connection may take to send its request headers (default 10)"),
    "max_connections": (
        int,
        "open connections kept; past it the oldest still sending headers is closed (default: what the "
        "open-file limit allows)",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `serve` flags; defaults apply after the env file (flags win over it, it wins over defaults)."""
    for name, (kind, text) in FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=text)
    parser.add_argument(
        "--env-file",
        help=f"KEY=VALUE file (mode 0600) with {ENV_PREFIX}<FLAG> settings; other keys (secrets) are ignored",
    )


def read_env_file(path: str) -> dict[str, str]:
    """`SPECOPS_SERVE_*` values of an env file, as flag names -> raw strings; values never echoed."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
        lines = file.read_text().splitlines()
    except OSError as e:
        raise SettingsError(
            f"{path}: cannot read the env file: {e.strerror} (fix: check --env-file)"
        ) from None
    if mode & 0o077:
        raise SettingsError(
            f"{path}: mode {oct(mode & 0o777)} lets other users read it, and it may hold tokens (fix: chmod 600 {path})"
        )
    known = set(FLAGS)
    out: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        key = key.strip()
        if not sep:
            raise SettingsError(f"{path}:{number}: not a KEY=VALUE line (fix: correct or delete that line)")
        if not key.startswith(ENV_PREFIX):
            continue
        name = key.removeprefix(ENV_PREFIX).lower()
        if name not in known:
            choices = ", ".join(ENV_PREFIX + k.upper() for k in sorted(known))
            raise SettingsError(f"{path}:{number}: unknown key {key} (fix: one of {choices})")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name] = value
    return out


def settings_from(args: argparse.Namespace) -> Settings:
    """Flags, else the env file, else defaults; then checked."""
    given = {name: getattr(args, name) for name in FLAGS if getattr(args, name) is not None}
    from_file = read_env_file(args.env_file) if args.env_file else {}
    for name, raw in from_file.items():
        if name in given:
            continue
        kind = FLAGS[name][0]
        try:
            given[name] = kind(raw)
        except ValueError:
            raise SettingsError(
                f"{args.env_file}: {ENV_PREFIX}{name.upper()} is not a valid {kind.__name__} (fix: correct it)"
            ) from None
    if "target" not in given:
        raise SettingsError(f"--target is required (fix: pass --target DIR or set {ENV_PREFIX}TARGET)")
    modes, budgets = given.pop("modes", None), given.pop("budgets", None)
    listed = _budgets(budgets)
    if "budget" not in given and listed and Settings.budget not in listed:
        given["budget"] = listed[0]  # the default budget is one of --budgets: the first listed
    s = Settings(**given)
    s = replace(
        s,
        dtype=s.dtype or default_dtype(s.device),
        modes=_modes(modes, s.mode),
        budgets=tuple(sorted(set(listed))) or (s.budget,),
        threads=max(1, len(os.sched_getaffinity(0)) - 1) if s.threads is None else s.threads,
    )
    checks = [
        (s.mode in MODES, "mode", f"one of {', '.join(MODES)}"),
        (set(s.modes) <= set(MODES), "modes", f"a comma-separated subset of {','.join(MODES)}"),
        (s.mode in s.modes, "mode", f"one of --modes {','.join(s.modes)}"),
        (s.modes == ("ar",) or s.drafter is not None, "drafter", "pass --drafter DIR, or use --mode ar"),
        (min(s.budgets) >= 1, "budgets", "positive integers"),
        (s.budget in s.budgets, "budget", f"one of --budgets {','.join(map(str, s.budgets))}"),
        (0 <= s.port <= 65535, "port", "0 to 65535"),
        (s.device in DEVICES, "device", f"one of {', '.join(DEVICES)}"),
        (s.dtype is None or s.dtype in DTYPES, "dtype", f"one of {', '.join(DTYPES)}"),
        (s.max_context is None or s.max_context >= 2, "max-context", "at least 2"),
        (s.temperature is None or 0 <= s.temperature <= 2, "temperature", "0 to 2"),
        (s.threads is not None and s.threads >= 1, "threads", "at least 1"),
        (s.queue_size >= 1, "queue-size", "at least 1"),
        (s.drain_timeout >= 0, "drain-timeout", "0 or more seconds"),
        (s.api_key is None or len(s.api_key) >= 8, "api-key", "at least 8 characters"),
        (s.api_key_routes in KEY_ROUTES, "api-key-routes", f"one of {', '.join(KEY_ROUTES)}"),
        (s.header_timeout > 0, "header-timeout", "more than 0 seconds"),
        (s.max_connections is None or s.max_connections >= 8, "max-connections", "at least 8"),
    ]
    for ok, flag, fix in checks:
        if not ok:
            shown = (
                "the key" if flag == "api-key" else repr(getattr(s, flag.replace("-", "_")))
            )  # never a secret
            raise SettingsError(f"--{flag}: {shown} is not valid (fix: {fix})")
    return s


def _modes(raw: str | None, default: str) -> tuple[str, ...]:
    """`--modes ar,ddtree` as a tuple (--mode must be one of them)."""
    if raw is None:
        return (default,)
    return tuple(dict.fromkeys(m.strip() for m in raw.split(",") if m.strip()))


def _budgets(raw: str | None) -> tuple[int, ...]:
    """`--budgets 64,16` as given (the first is the default budget when --budget is not set)."""
    if raw is None:
        return ()
    try:
        budgets = tuple(int(b) for b in raw.split(",") if b.strip())
    except ValueError:
        budgets = ()
    if not budgets:
        raise SettingsError(
            f"--budgets: {raw!r} is not a comma-separated list of integers (fix: e.g. --budgets 16,64,256)"
        )
    return budgets
