"""Settings of `python -m ddtree_runtime serve`: flags, else the env file, else defaults.

Every option, its type, default and help is declared once, in `specops_contract.SERVE_OPTIONS`
(the controller reads the same table for the inventory's `serve` keys); this module turns it into
flags, reads the env file, resolves what is decided at start (device, dtype, threads) and checks.

The env file is the `<base>/run/<service>.env` file `fab deploy` renders from the inventory:
`KEY=VALUE` lines, of which the server reads `SPECOPS_SERVE_<FLAG>` (e.g. `SPECOPS_SERVE_BUDGET=64`,
`SPECOPS_SERVE_TEMPERATURE=0.7`) and ignores the rest. The same file holds secrets such as HF_TOKEN
(they must never reach a command line), so it must be mode 0600, and no error ever quotes a value
from it: errors name the file, the line and the key.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ddtree_runtime.loader import default_device, default_dtype, default_threads
from specops_contract import MODES, SERVE_ENV_PREFIX, SERVE_OPTIONS


class SettingsError(ValueError):
    """Bad flags or env file; the message names the flag or file:line and the fix."""


@dataclass(frozen=True)
class Settings:
    """One server's settings, resolved (`settings_from`); one field per `SERVE_OPTIONS` entry."""

    target: str
    drafter: str | None
    mode: str  # for requests that name none
    budget: int  # ddtree budget for requests that name none
    modes: tuple[str, ...]  # what requests may pick (all warmed at start)
    budgets: tuple[int, ...]  # ddtree budgets requests may pick
    host: str
    port: int
    device: str
    dtype: str
    max_context: int | None  # None: the target's max_position_embeddings, capped
    temperature: float | None  # for requests that send none; None: generation_config.json, else 0
    threads: int  # torch CPU threads
    queue_size: int
    max_batch: int  # sequences decoded together; 1: `Engine.generate`, one at a time
    draft_head: str  # auto | fp8 | target (engine.draft_head)
    prefill_chunk: int | None  # None: a prompt is prefilled at once
    budget_policy: str  # fixed | load (budgets.py)
    cost_table: str | None  # None: the simple cost model
    drain_timeout: float
    served_model_name: str | None  # None: --target as given (vLLM's convention)
    api_key: str | None  # bearer token clients must send on /v1/* (never logged)
    api_key_routes: str  # v1: /v1/* only, /health and /metrics stay open; all: every route
    header_timeout: float  # seconds a connection may take to send a request's headers
    max_connections: int | None  # None: what the open-file limit allows (connections.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `serve` flags; defaults apply after the env file (flags win over it, it wins over defaults)."""
    for name, option in SERVE_OPTIONS.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=option.kind, default=None, help=option.describe()
        )
    parser.add_argument(
        "--env-file",
        help=f"KEY=VALUE file (mode 0600) with {SERVE_ENV_PREFIX}<FLAG> settings; other keys (secrets) are ignored",
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
    known = set(SERVE_OPTIONS)
    out: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        key = key.strip()
        if not sep:
            raise SettingsError(f"{path}:{number}: not a KEY=VALUE line (fix: correct or delete that line)")
        if not key.startswith(SERVE_ENV_PREFIX):
            continue
        name = key.removeprefix(SERVE_ENV_PREFIX).lower()
        if name not in known:
            choices = ", ".join(SERVE_ENV_PREFIX + k.upper() for k in sorted(known))
            raise SettingsError(f"{path}:{number}: unknown key {key} (fix: one of {choices})")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name] = value
    return out


def settings_from(args: argparse.Namespace) -> Settings:
    """Flags, else the env file, else defaults; then checked."""
    given = {name: getattr(args, name) for name in SERVE_OPTIONS if getattr(args, name) is not None}
    from_file = read_env_file(args.env_file) if args.env_file else {}
    for name, raw in from_file.items():
        if name in given:
            continue
        kind = SERVE_OPTIONS[name].kind
        try:
            given[name] = kind(raw)
        except ValueError:
            raise SettingsError(
                f"{args.env_file}: {SERVE_ENV_PREFIX}{name.upper()} is not a valid {kind.__name__} (fix: correct it)"
            ) from None
    if "target" not in given:
        raise SettingsError(f"--target is required (fix: pass --target DIR or set {SERVE_ENV_PREFIX}TARGET)")
    v = {name: option.default for name, option in SERVE_OPTIONS.items()} | given
    # What the contract leaves to the start: these depend on the machine.
    v["device"] = v["device"] or default_device()
    v["dtype"] = v["dtype"] or default_dtype(v["device"])
    v["threads"] = default_threads() if v["threads"] is None else v["threads"]
    listed = _budgets(v["budgets"])
    if "budget" not in given and listed and v["budget"] not in listed:
        v["budget"] = listed[0]  # the default budget is one of --budgets: the first listed
    v["modes"], v["budgets"] = _modes(v["modes"], v["mode"]), tuple(sorted(set(listed))) or (v["budget"],)
    s = Settings(**v)
    choices = [(n.replace("_", "-"), o.choices) for n, o in SERVE_OPTIONS.items() if o.choices]
    checks = [
        *(
            (getattr(s, flag.replace("-", "_")) in allowed, flag, f"one of {', '.join(allowed)}")
            for flag, allowed in choices
        ),
        (set(s.modes) <= set(MODES), "modes", f"a comma-separated subset of {','.join(MODES)}"),
        (s.mode in s.modes, "mode", f"one of --modes {','.join(s.modes)}"),
        (s.modes == ("ar",) or s.drafter is not None, "drafter", "pass --drafter DIR, or use --mode ar"),
        (min(s.budgets) >= 1, "budgets", "positive integers"),
        (s.budget in s.budgets, "budget", f"one of --budgets {','.join(map(str, s.budgets))}"),
        (0 <= s.port <= 65535, "port", "0 to 65535"),
        (s.max_context is None or s.max_context >= 2, "max-context", "at least 2"),
        (s.temperature is None or 0 <= s.temperature <= 2, "temperature", "0 to 2"),
        (s.threads >= 1, "threads", "at least 1"),
        (s.queue_size >= 1, "queue-size", "at least 1"),
        (s.max_batch >= 1, "max-batch", "at least 1"),
        (s.prefill_chunk is None or s.prefill_chunk >= 1, "prefill-chunk", "at least 1"),
        (s.budget_policy == "fixed" or s.max_batch > 1, "budget-policy", "fixed, or --max-batch above 1"),
        (s.drain_timeout >= 0, "drain-timeout", "0 or more seconds"),
        (s.api_key is None or len(s.api_key) >= 8, "api-key", "at least 8 characters"),
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
