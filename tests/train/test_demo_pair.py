"""The committed demo pair (demo_pair/): it passes the lint against its target, speculation on it
yields the `ar` tokens at T=0 with several tokens accepted per round, and `fab deploy`'s demo step
uploads it once (a second plan changes nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ddtree_runtime.engine import Engine
from ddtree_runtime.loader import load_pair
from ddtree_runtime.tokenizer import Tokenizer
from drafter_config.lint import lint
from ops.api.context import StepContext
from ops.hosts import Host
from ops.steps import get_step

PAIR = Path(__file__).resolve().parents[2] / "demo_pair"


def test_demo_pair_fits_and_speculates_exactly() -> None:
    report = lint(str(PAIR / "drafter"), str(PAIR / "target"))
    assert not report.errors
    size = sum(p.stat().st_size for p in PAIR.rglob("*") if p.is_file())
    assert size < 20e6
    tok = Tokenizer(PAIR / "target")
    prompt = json.loads((PAIR / "held_out_prompts.jsonl").read_text().splitlines()[0])["prompt"]
    ids = tok.encode(prompt)[-64:]
    target, drafter = load_pair(PAIR / "target", PAIR / "drafter", torch.device("cpu"), torch.float32)
    engine = Engine(target, drafter, max_context=64 + 32 + 33)
    ar = engine.generate(ids, mode="ar", max_new_tokens=32, eos_ids=())
    tree = engine.generate(ids, mode="ddtree", budget=32, max_new_tokens=32, eos_ids=())
    assert tree.output_ids == ar.output_ids
    assert tree.mean_accepted > 2.0


def test_deploy_uploads_the_demo_pair_once(tmp_path: Path) -> None:
    step = get_step("demo_checkpoints")()
    args = step.check_args(
        {"dir": "/opt/specops/models/demo", "python": "py", "site": "/s", "source": str(PAIR)}
    )
    host = Host(name="h", connection="local", address=None, port=22, user=None, key_file=None,
                base="/opt/specops", host_key_policy="strict", known_hosts=(), sudo=False,
                connect_timeout=10.0, vars={}, groups=())  # fmt: skip
    ctx = StepContext(host=host, playbook_dir=tmp_path, templates_dir=tmp_path, vars={})
    plan = step.plan({"done": True, "marker": "ok"}, args, ctx)  # the tiny pair is there: replace it
    paths = [c.path for c in plan.changes if hasattr(c, "path")]
    assert "/opt/specops/models/demo/drafter/model.safetensors" in paths and paths[-1].endswith("/DONE")
    marker = plan.changes[-1].data.decode().strip()
    again = step.plan({"done": True, "marker": marker}, args, ctx)
    assert not again.will_change and again.data["drafter"] == "/opt/specops/models/demo/drafter"
