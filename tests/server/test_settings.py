"""Settings from flags and the env file; secrets stay out of argv and logs; logs are JSON lines."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import time
from pathlib import Path

import pytest

from ddtree_runtime.server.settings import Settings, SettingsError, add_arguments, settings_from
from ops.service.settings import FOREIGN_ONLY, SERVE_KEYS
from specops_contract import SERVE_DEFAULTS, SERVE_OPTIONS
from tests.server.client import SECRET, Server
from tests.server.conftest import BUDGET, MODEL, PROMPT, Launched


def _settings(*argv: str):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from(parser.parse_args(argv))


def _env(tmp_path: Path, text: str, mode: int = 0o600) -> str:
    path = tmp_path / "serve.env"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_flags_win_over_env_file_which_wins_over_defaults(tmp_path: Path) -> None:
    env = _env(tmp_path, f"HF_TOKEN={SECRET}\nexport SPECOPS_SERVE_BUDGET=32\nSPECOPS_SERVE_MODE='dflash'\n")
    s = _settings("--target", "t", "--drafter", "d", "--env-file", env, "--budget", "8")
    assert (s.budget, s.mode, s.host, s.queue_size) == (8, "dflash", "127.0.0.1", 64)


@pytest.mark.parametrize(
    ("text", "mode", "needle"),
    [
        (f"HF_TOKEN={SECRET}\n", 0o644, "chmod 600"),
        (f"HF_TOKEN={SECRET}\n\nSPECOPS_SERVE_BUDGT=3\n", 0o600, ":3: unknown key SPECOPS_SERVE_BUDGT"),
        (f"SPECOPS_SERVE_BUDGET={SECRET}\n", 0o600, "SPECOPS_SERVE_BUDGET is not a valid int"),
        (f"{SECRET}\n", 0o600, ":1: not a KEY=VALUE line"),
    ],
)
def test_env_file_errors_name_the_line_never_the_value(
    tmp_path: Path, text: str, mode: int, needle: str
) -> None:
    env = _env(tmp_path, text, mode)
    with pytest.raises(SettingsError) as e:
        _settings("--target", "t", "--drafter", "d", "--env-file", env)
    assert needle in str(e.value) and env in str(e.value) and SECRET not in str(e.value)


def test_every_option_is_declared_once_in_the_contract(tmp_path: Path) -> None:
    """The flags, the env-file keys, the settings and the inventory's serve keys are one table."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {a.dest for a in parser._actions} - {"help", "env_file"}
    assert flags == set(SERVE_OPTIONS) == {f.name for f in dataclasses.fields(Settings)}
    ours = {name for name, option in SERVE_OPTIONS.items() if option.inventory}
    assert ours <= set(SERVE_KEYS) and SERVE_DEFAULTS["budget"] == SERVE_OPTIONS["budget"].default
    assert set(SERVE_KEYS) - ours == {"system", *FOREIGN_ONLY, "num_speculative_tokens"}  # vLLM / SGLang
    env = _env(tmp_path, "SPECOPS_SERVE_QUEUE_SIZE=3\nSPECOPS_SERVE_DTYPE=float16\n")
    s = _settings("--target", "t", "--drafter", "d", "--env-file", env)
    assert (s.queue_size, s.dtype, s.drain_timeout) == (3, "float16", SERVE_OPTIONS["drain_timeout"].default)
    assert "(default 64)" in parser.format_help()  # the contract's default, in --help
    with pytest.raises(SettingsError, match="--dtype: 'bf16' is not valid"):
        _settings("--target", "t", "--drafter", "d", "--dtype", "bf16")


def test_bad_flags_are_refused() -> None:
    with pytest.raises(SettingsError, match="--drafter"):
        _settings("--target", "t")
    with pytest.raises(SettingsError, match="--mode"):
        _settings("--target", "t", "--drafter", "d", "--mode", "beam")
    with pytest.raises(SettingsError, match="--target is required"):
        _settings()
    for flags, needle in [
        (("--max-batch", "0"), "--max-batch: 0 is not valid (fix: at least 1)"),
        (("--max-batch", "4", "--prefill-chunk", "0"), "--prefill-chunk: 0 is not valid"),
        (
            ("--budget-policy", "load"),
            "--budget-policy: 'load' is not valid (fix: fixed, or --max-batch above 1)",
        ),
        (
            ("--max-batch", "4", "--budget-policy", "auto"),
            "--budget-policy: 'auto' is not valid (fix: one of",
        ),
        (("--draft-head", "fp16"), "--draft-head: 'fp16' is not valid (fix: one of auto, fp8, target)"),
    ]:
        with pytest.raises(SettingsError, match=re.escape(needle)):
            _settings("--target", "t", "--drafter", "d", *flags)


def test_env_file_settings_in_effect_and_secret_nowhere(main_server: Server, launched: Launched) -> None:
    status, _, data = main_server.request("GET", "/v1/models")
    assert status == 200 and json.loads(data)["data"][0]["id"] == MODEL  # from the env file
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        assert SECRET.encode() not in cmdline, f"pid {pid}"
    assert str(launched.env_file).encode() in Path(f"/proc/{main_server.proc.pid}/cmdline").read_bytes()
    log = main_server.log.read_text()
    assert SECRET not in log
    start = json.loads(log.splitlines()[0])
    assert (
        start["event"] == "listening" and start["budget"] == BUDGET and start["pid"] == main_server.proc.pid
    )


def test_log_is_one_json_line_per_request_without_prompt_text(main_server: Server) -> None:
    before = main_server.log.read_text().count("\n")
    status, _ = main_server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
    assert status == 200
    main_server.request("GET", "/nope")
    end = time.monotonic() + 30  # each line is written just after its response is sent
    while '"/nope"' not in "".join((lines := main_server.log.read_text().splitlines())[before:]):
        assert time.monotonic() < end
        time.sleep(0.02)
    records = [json.loads(line) for line in lines]  # every line is JSON
    # (an earlier test's last line may land after `before` was counted: only these two are ours)
    ours = [r for r in records[before:] if r.get("path") in ("/v1/completions", "/nope")]
    assert [r["path"] for r in ours] == ["/v1/completions", "/nope"]
    done = ours[0]
    assert done["event"] == "request" and done["status"] == 200 and done["completion_tokens"] == 3
    assert {"prompt_tokens", "e2e_s", "ttft_s", "queue_s", "rounds", "tau", "finish_reason"} <= set(done)
    assert ours[1]["status"] == 404
    assert PROMPT not in "\n".join(lines)


def test_modes_and_budgets_default_to_mode_and_budget_and_must_hold_them() -> None:
    s = _settings("--target", "t", "--drafter", "d", "--budget", "8")
    assert (s.modes, s.budgets) == (("ddtree",), (8,))
    s = _settings("--target", "t", "--drafter", "d", "--modes", "ar, ddtree", "--budgets", "64,16,16")
    assert (s.modes, s.budgets, s.budget) == (("ar", "ddtree"), (16, 64), 64)
    assert _settings("--target", "t", "--mode", "ar").modes == ("ar",)  # no drafter needed
    # without --budget, the default budget is one of --budgets: 64 when listed, else the first
    s = _settings("--target", "t", "--drafter", "d", "--modes", "ar,ddtree", "--budgets", "32,8")
    assert (s.budget, s.budgets) == (32, (8, 32))
    assert _settings("--target", "t", "--drafter", "d", "--budgets", "8,64").budget == 64
    for argv, flag in (
        (("--modes", "ar,dflash"), "--mode"),  # the default mode ddtree is not among them
        (("--modes", "ddtree,beam"), "--modes"),
        (("--budgets", "16,32", "--budget", "64"), "--budget"),  # a given budget must be listed
        (("--budgets", "16,x"), "--budgets"),
        (("--budgets", "0", "--budget", "0"), "--budgets"),
        (("--threads", "0"), "--threads"),
        (("--api-key-routes", "health"), "--api-key-routes"),
        (("--header-timeout", "0"), "--header-timeout"),
    ):
        with pytest.raises(SettingsError, match=flag):
            _settings("--target", "t", "--drafter", "d", *argv)
