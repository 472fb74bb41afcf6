"""Benchmark pieces as data: the matrix format, the vLLM/SGLang command templates, the /metrics
arithmetic and the tune stop rule. The servers these templates start cannot run here; their
rendered command lines are checked against the documented flags instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.api.changes import StepFailed
from ops.api.context import StepContext
from ops.bench.hardware import parse_hardware
from ops.bench.matrix import load_matrix
from ops.bench.spec_counters import parse_spec_counters, spec_delta
from ops.bench.tune import peaked
from ops.connection import CommandResult
from ops.errors import InputFileError
from ops.inventory import parse_inventory
from ops.runner import TEMPLATES_DIR
from ops.service.command import TEMPLATE_DEFAULTS, render_argv
from ops.service.metrics import status_metrics
from ops.steps import get_step
from ops.steps.bench import parse_tuned
from ops.wheel import REPO_ROOT

METRICS_BEFORE = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 10
vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} 80
vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 12
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="0",position="0"} 7
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="0",position="1"} 5
"""
# Another engine label and no `_total` suffix (older vLLM): summed over labels all the same.
METRICS_AFTER = """vllm:spec_decode_num_drafts{engine="0"} 30
vllm:spec_decode_num_drafts{engine="1"} 0
vllm:spec_decode_num_draft_tokens{engine="0"} 240
vllm:spec_decode_num_accepted_tokens{engine="0"} 42
vllm:spec_decode_num_accepted_tokens_per_pos{engine="0",position="0"} 22
vllm:spec_decode_num_accepted_tokens_per_pos{engine="0",position="1"} 15
vllm:spec_decode_num_accepted_tokens_per_pos{engine="0",position="2"} 5
vllm:generation_tokens_total 999
"""


def test_counter_deltas_give_tau_rate_positions_and_histogram():
    delta = spec_delta(parse_spec_counters(METRICS_BEFORE), parse_spec_counters(METRICS_AFTER))
    assert (delta.drafts, delta.draft_tokens, delta.accepted) == (20, 160, 30)
    assert delta.per_position == [15 / 20, 10 / 20, 5 / 20]
    # 5 rounds accepted nothing, 5 one, 5 two, 5 three: emitted 1, 2, 3, 4 tokens.
    assert delta.histogram == {1: 5, 2: 5, 3: 5, 4: 5}
    mean = sum(k * n for k, n in delta.histogram.items()) / sum(delta.histogram.values())
    assert mean == 1 + 30 / 20  # the histogram's mean is tau


# What a hand-split parser got wrong: a served model name with a space, a comma and escaped quotes
# (even one that reads like another label), and sample timestamps after the value.
METRICS_HOSTILE = r"""# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{model_name="org/model 8B, \"fp8\"",engine="0"} 10 1712345678000
vllm:spec_decode_num_draft_tokens_total{model_name="a,b=c",engine="0"} 80 1712345678000
vllm:spec_decode_num_accepted_tokens_total{model_name="a b",engine="0"} 12
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="x, position=\"9\"",position="0"} 7
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="x",position="1"} 5 1712345678000
"""


def test_label_values_and_timestamps_do_not_fool_the_parser():
    assert parse_spec_counters(METRICS_HOSTILE) == {
        "drafts": 10,
        "draft_tokens": 80,
        "accepted": 12,
        "per_pos": {0: 7, 1: 5},
    }
    assert status_metrics(METRICS_HOSTILE)["mean_acceptance_length"] == 2.2
    assert parse_spec_counters("<html><body>502 Bad Gateway</body></html>\n") == {}  # not metrics


def test_a_server_without_speculation_has_no_counters():
    delta = spec_delta(parse_spec_counters("vllm:generation_tokens_total 5\n"), {})
    assert (delta.drafts, delta.accepted, delta.per_position, delta.histogram) == (None, None, None, None)


def test_peaked_needs_patience_points_clearly_below_the_best():
    assert not peaked([1.2, 1.5], 2, 0.03)
    assert not peaked([1.2, 1.5, 1.49, 1.3], 2, 0.03)  # 1.49 is within 3% of the best
    assert peaked([1.2, 1.5, 1.4, 1.3], 2, 0.03)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


def test_shipped_matrices_expand_to_unique_cells():
    quick = load_matrix(REPO_ROOT / "playbooks" / "bench-quick.yaml")
    assert [s.label for s in quick.servers] == [
        "ddtree-ar",
        "ddtree-dflash",
        "ddtree-ddtree-b8",
        "ddtree-ddtree-b16",
    ]
    full = load_matrix(REPO_ROOT / "playbooks" / "bench-matrix.yaml")
    assert len({c.cell_id for c in full.cells}) == len(full.cells) == 7 * 3
    sweep = load_matrix(REPO_ROOT / "playbooks" / "bench-concurrency.yaml")
    assert [c.cell_id for c in sweep.servers[1].cells] == [
        f"ddtree-ddtree-b64-math-t0-c{c}-o256" for c in (1, 4, 16, 64)
    ]
    assert [c.num_prompts for c in sweep.servers[1].cells] == [32, 32, 32, 64]  # a request per client


def test_matrix_lists_multiply_and_overrides_apply(tmp_path):
    matrix = load_matrix(
        write(
            tmp_path,
            """
workload: {prompts: [math, code], output_len: [16, 32], num_prompts: 3}
systems:
  - {system: ddtree, mode: ddtree, budget: [4, 8], workload: {concurrency: [1, 2]}}
  - {system: vllm, mode: dflash, num_speculative_tokens: 7, port: 8200, vars: {extra_args: [--enforce-eager]}}
  - {system: sglang, mode: mtp, enabled: false}
""",
        ),
        overrides={"num_prompts": 1},
    )
    assert [s.label for s in matrix.servers] == ["ddtree-ddtree-b4", "ddtree-ddtree-b8", "vllm-dflash-k7"]
    assert len(matrix.servers[0].cells) == 2 * 2 * 2 and len(matrix.servers[2].cells) == 4
    assert {(c.concurrency, c.num_prompts) for c in matrix.cells} == {(1, 1), (2, 2)}  # >= concurrency
    assert matrix.servers[2].port == 8200 and matrix.servers[2].template == "serve-vllm.argv.j2"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("systems:\n  - {system: ddtree, mode: fast}\n", 2, "mode 'fast' is not a ddtree mode"),
        ("systems:\n  - {system: ddtree, mode: ar, budget: 8}\n", 2, "'budget' applies to"),
        ("workload: {output_len: [0]}\nsystems:\n  - {system: ddtree, mode: ar}\n", 1, "must be >= 1"),
        ("systems:\n  - system: ddtree\n    mode: ar\n    budgets: [1]\n", 4, "unknown system key 'budgets'"),
        ("systems:\n  - {system: ddtree, mode: ar}\n  - {system: ddtree, mode: ar}\n", 3, "appears twice"),
    ],
)
def test_matrix_errors_name_the_line(tmp_path, text, line, words):
    with pytest.raises(InputFileError) as err:
        load_matrix(write(tmp_path, text))
    assert err.value.line == line and words in str(err.value)


def context(tmp_path: Path) -> StepContext:
    inv = parse_inventory(
        "hosts:\n  gpu1: {address: 10.0.0.5, vars: {profile: hopper}}\n", tmp_path / "inv.yaml"
    )
    host = inv.hosts["gpu1"]
    return StepContext(
        host=host,
        playbook_dir=REPO_ROOT / "playbooks",
        templates_dir=TEMPLATES_DIR,
        vars=host.template_vars(),
    )


BASE = {
    **TEMPLATE_DEFAULTS,
    "host": "127.0.0.1",
    "venv": "/opt/specops/venv",
    "target": "/m/Qwen3-8B",
    "drafter": "/m/Qwen3-8B DFlash",
    "port": 8100,
    "served_name": "/m/Qwen3-8B",
    "block_size": None,
}


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_vllm_dflash_command_line(tmp_path):
    argv = render_argv(
        "serve-vllm.argv.j2",
        {**BASE, "mode": "dflash", "num_speculative_tokens": 15, "extra_args": ["--max-model-len", "8192"]},
        context(tmp_path),
    )
    assert (
        argv[:3] == ["/opt/specops/venv/bin/vllm", "serve", "/m/Qwen3-8B"] and flag(argv, "--port") == "8100"
    )
    assert json.loads(flag(argv, "--speculative-config")) == {
        "method": "dflash",
        "model": "/m/Qwen3-8B DFlash",
        "num_speculative_tokens": 15,
    }
    assert flag(argv, "--attention-backend") == "flash_attn" and argv[-2:] == ["--max-model-len", "8192"]


def test_vllm_mtp_and_plain_command_lines(tmp_path):
    mtp = render_argv(
        "serve-vllm.argv.j2", {**BASE, "mode": "mtp", "num_speculative_tokens": 3}, context(tmp_path)
    )
    assert json.loads(flag(mtp, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 3}
    assert "--attention-backend" not in mtp
    plain = render_argv(
        "serve-vllm.argv.j2", {**BASE, "mode": "ar", "num_speculative_tokens": None}, context(tmp_path)
    )
    assert "--speculative-config" not in plain


def test_sglang_mtp_sets_all_three_numbers(tmp_path):
    argv = render_argv(
        "serve-sglang.argv.j2",
        {**BASE, "mode": "mtp", "num_speculative_tokens": 3, "tensor_parallel": 2},
        context(tmp_path),
    )
    assert argv[:3] == ["/opt/specops/venv/bin/python", "-m", "sglang.launch_server"]
    assert flag(argv, "--speculative-algorithm") == "NEXTN" and flag(argv, "--tp-size") == "2"
    assert "--enable-metrics" in argv  # SGLang serves /metrics only with it
    assert (
        flag(argv, "--speculative-num-steps"),
        flag(argv, "--speculative-eagle-topk"),
        flag(argv, "--speculative-num-draft-tokens"),
    ) == ("3", "1", "4")
    assert "--speculative-draft-model-path" not in argv
    eagle = render_argv(
        "serve-sglang.argv.j2", {**BASE, "mode": "eagle", "num_speculative_tokens": 5}, context(tmp_path)
    )
    assert flag(eagle, "--speculative-algorithm") == "EAGLE"
    assert flag(eagle, "--speculative-draft-model-path") == "/m/Qwen3-8B DFlash"


BENCH_ARGS = {
    "matrix": "bench-quick.yaml",
    "base": "/opt/specops",
    "target": "/m/t",
    "drafter": "/m/d",
    "env_file": "/opt/specops/run/specops-ddtree.env",
    "run_dir": "/tmp/results/run-1",
}
HOST_FACTS = {"release": "0.1.0+gabc", "hardware": {"gpu_name": "NVIDIA H200", "gpu_count": 1}, "done": []}


def test_bench_plan_runs_pending_cells_only_and_a_finished_run_is_a_noop(tmp_path):
    step = get_step("bench")()
    args = step.check_args(BENCH_ARGS)
    plan = step.plan(HOST_FACTS, args, context(tmp_path))
    assert plan.changes[0].describe() == "bench: ddtree-ar: 1 cell(s) (ddtree-ar-math-t0-c1-o32)"
    assert plan.reason == "run 4 of 4 cells on 4 server(s)"
    half = {**HOST_FACTS, "done": ["ddtree-ar-math-t0-c1-o32", "ddtree-ddtree-b8-math-t0-c1-o32"]}
    plan = step.plan(half, args, context(tmp_path))
    assert [c.server.label for c in plan.changes] == ["ddtree-dflash", "ddtree-ddtree-b16"]
    assert plan.data["done_before"] == 2
    every = {
        **HOST_FACTS,
        "done": [c.cell_id for c in load_matrix(REPO_ROOT / "playbooks" / "bench-quick.yaml").cells],
    }
    plan = step.plan(every, args, context(tmp_path))
    assert not plan.will_change and plan.reason.startswith("all 4 cells of bench-quick.yaml are complete")


def test_bench_without_a_release_says_deploy_first(tmp_path):
    step = get_step("bench")()
    with pytest.raises(StepFailed, match="run fab deploy first"):
        step.plan({**HOST_FACTS, "release": None}, step.check_args(BENCH_ARGS), context(tmp_path))


def test_hardware_and_tuned_parsers():
    out = "NVIDIA H200, 9.0, 570.86.15\nNVIDIA H200, 9.0, 570.86.15\nCUDA Version: 12.8\n--\n2.13.0\n"
    assert parse_hardware(CommandResult("hw", 0, out, "")) == {
        "gpu_name": "NVIDIA H200",
        "gpu_count": 2,
        "compute_cap": "9.0",
        "driver": "570.86.15",
        "cuda": "12.8",
        "torch": "2.13.0",
    }
    assert parse_hardware(CommandResult("hw", 0, "--\n", ""))["gpu_name"] is None
    assert parse_tuned(CommandResult("cat", 0, "", "")) == {}
    record = parse_tuned(CommandResult("cat", 0, '{"serve": {"mode": "ddtree", "budget": "128"}}', ""))
    assert record["serve"] == {"mode": "ddtree", "budget": 128}
    with pytest.raises(StepFailed, match="damaged"):
        parse_tuned(CommandResult("cat", 0, '{"serve": {"budgt": 1}}', ""))
