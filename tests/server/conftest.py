"""Package fixtures (gone when tests/server ends): one tiny pair, two real servers, one `generate`.

Both servers and the oracle load torch and the pair at the same time, so their start-up costs
overlap on the two CI cores. `main` (ddtree by default, budget 16, every mode and budgets 8 and 16 per
request, big queue) takes its settings from an env
file that also holds a fake HF token; `small` (ar, queue of 2) is for queueing and SIGTERM.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ddtree_runtime.tiny import TinyPair
from tests.server.client import REPO, SECRET, Server, child_env

MODEL = "tiny-ddtree"
BUDGET = 16
MODES = ("ar", "dflash", "ddtree")  # `main` serves every mode per request ...
BUDGETS = (8, BUDGET)  # ... and these ddtree budgets; BUDGET is the default
PROMPT = "the city of"
ORACLE_TOKENS = 24


@dataclass
class Launched:
    main: Server
    small: Server
    oracle: subprocess.Popen[bytes]
    pair: TinyPair
    env_file: Path


@pytest.fixture(scope="package")
def launched(tmp_path_factory: pytest.TempPathFactory, tiny_pair: TinyPair) -> Iterator[Launched]:
    root = tmp_path_factory.mktemp("server")
    pair = tiny_pair
    env_file = root / "ddtree.env"
    env_file.write_text(
        "# rendered from the inventory; mode 0600\n"
        f"HF_TOKEN={SECRET}\n"
        "SPECOPS_SERVE_MODE=ddtree\n"
        f"SPECOPS_SERVE_BUDGET={BUDGET}\n"
        f"SPECOPS_SERVE_MODES={','.join(MODES)}\n"
        f"SPECOPS_SERVE_BUDGETS={','.join(map(str, BUDGETS))}\n"
        "SPECOPS_SERVE_DTYPE=float32\n"
        "SPECOPS_SERVE_MAX_CONTEXT=1024\n"
        "SPECOPS_SERVE_QUEUE_SIZE=256\n"
        f'SPECOPS_SERVE_SERVED_MODEL_NAME="{MODEL}"\n'
    )
    env_file.chmod(0o600)
    pair_args = ["--target", str(pair.target), "--drafter", str(pair.drafter), "--device", "cpu"]
    main = Server.start([*pair_args, "--env-file", str(env_file)], root / "main.log")
    small = Server.start(
        [*pair_args, "--mode", "ar", "--queue-size", "2", "--drain-timeout", "60"], root / "small.log"
    )
    oracle = subprocess.Popen(
        [sys.executable, "-m", "ddtree_runtime", "generate", *pair_args, "--mode", "ddtree",
         "--budget", str(BUDGET), "--dtype", "float32", "--prompt", PROMPT, "--max-new-tokens", str(ORACLE_TOKENS), "--format", "json"],
        cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield Launched(main, small, oracle, pair, env_file)
    finally:
        for server in (main, small):
            if server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait()
        if oracle.poll() is None:
            oracle.kill()
            oracle.wait()


@pytest.fixture(scope="package")
def main_server(launched: Launched) -> Server:
    launched.main.wait_ready()
    return launched.main


@pytest.fixture(scope="package")
def small_server(launched: Launched) -> Server:
    launched.small.wait_ready()
    return launched.small


@pytest.fixture(scope="package")
def oracle(launched: Launched) -> dict[str, Any]:
    """`python -m ddtree_runtime generate --format json` for PROMPT: what chat at T=0 must return."""
    out, err = launched.oracle.communicate(timeout=120)
    assert launched.oracle.returncode == 0, err.decode()
    return json.loads(out)
