"""Package fixtures (gone when tests/server ends): one tiny pair, three real servers, one `generate`.

The servers and the oracle load torch and the pair at the same time, so their start-up costs
overlap on the two CI cores. `main` (ddtree by default, budget 16, every mode and budgets 8 and 16 per
request, big queue, a 3 s header deadline) takes its settings from an env file that also holds a
fake HF token; `small` (ar, queue of 2) is for queueing and SIGTERM; `guarded` (ar, an API key, an
open-file limit of 1024) serves a copy of the tiny target whose tokenizer adds a BOS token and has
no chat template.
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
HEADER_TIMEOUT = 3  # main's
API_KEY = "sk-specops-" + "k" * 24  # guarded's
OPEN_FILES = 1024  # guarded's soft and hard limit, the usual soft limit of a login
BOS = 0  # guarded's tokenizer puts <|endoftext|> first


@dataclass
class Launched:
    main: Server
    small: Server
    guarded: Server
    oracle: subprocess.Popen[bytes]
    pair: TinyPair
    env_file: Path
    guarded_target: Path
    guarded_env: Path  # holds its API key


def guarded_target(pair: TinyPair, folder: Path) -> Path:
    """The tiny target with a tokenizer that adds a BOS token and without a chat template."""
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (folder / name).symlink_to(pair.target / name)
    tokenizer = json.loads((pair.target / "tokenizer.json").read_text())
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|endoftext|>": {"id": "<|endoftext|>", "ids": [BOS], "tokens": ["<|endoftext|>"]}
        },
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((pair.target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


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
        f"SPECOPS_SERVE_HEADER_TIMEOUT={HEADER_TIMEOUT}\n"
    )
    env_file.chmod(0o600)
    keyed = root / "guarded.env"
    keyed.write_text(f"SPECOPS_SERVE_API_KEY={API_KEY}\nSPECOPS_SERVE_HEADER_TIMEOUT=120\n")
    keyed.chmod(0o600)
    target = guarded_target(pair, root / "guarded-target")
    pair_args = ["--target", str(pair.target), "--drafter", str(pair.drafter), "--device", "cpu"]
    main = Server.start([*pair_args, "--env-file", str(env_file)], root / "main.log")
    small = Server.start(
        [*pair_args, "--mode", "ar", "--queue-size", "2", "--drain-timeout", "60"], root / "small.log"
    )
    guarded = Server.start(
        ["--target", str(target), "--device", "cpu", "--mode", "ar", "--dtype", "float32",
         "--max-context", "256", "--served-model-name", MODEL, "--env-file", str(keyed)],
        root / "guarded.log",
        open_files=OPEN_FILES,
    )  # fmt: skip
    oracle = subprocess.Popen(
        [sys.executable, "-m", "ddtree_runtime", "generate", *pair_args, "--mode", "ddtree",
         "--budget", str(BUDGET), "--dtype", "float32", "--prompt", PROMPT, "--max-new-tokens", str(ORACLE_TOKENS), "--format", "json"],
        cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield Launched(main, small, guarded, oracle, pair, env_file, target, keyed)
    finally:
        for server in (main, small, guarded):
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
def guarded_server(launched: Launched) -> Server:
    launched.guarded.wait_ready()
    return launched.guarded


@pytest.fixture(scope="package")
def oracle(launched: Launched) -> dict[str, Any]:
    """`python -m ddtree_runtime generate --format json` for PROMPT: what chat at T=0 must return."""
    out, err = launched.oracle.communicate(timeout=120)
    assert launched.oracle.returncode == 0, err.decode()
    return json.loads(out)
