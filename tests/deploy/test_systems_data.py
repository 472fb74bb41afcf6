"""vLLM and SGLang under ``fab deploy``, as data: the command lines the shared templates render,
parsed by the stand-in's argument parsers (exactly the flags vLLM 0.34.0 and SGLang 0.5.23 define,
checked against their sources; tests/deploy/standin.py), the ``serve`` validation, the restart
decision (a new specops release does not restart vLLM), tau from either system's counters, the
acceptance gate's verdict and ``fab status``'s live-tau flag."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from ops.api.args import ArgError
from ops.api.changes import StepFailed, Write
from ops.bench.spec_counters import parse_spec_counters, spec_delta
from ops.service.acceptance import AcceptanceFailed, Probe, judge, threshold
from ops.service.backends import Installed, Wait
from ops.service.command import serve_argv
from ops.service.metrics import status_metrics
from ops.service.status import status_line, status_summary, tau_drop
from tests.deploy.standin import settings, sglang_parser, vllm_parser
from tests.deploy.test_plans import BASE, A, B, context, facts, host_after, service_args

VLLM = {"system": "vllm", "port": 8000, "mode": "dflash", "num_speculative_tokens": 15}


def argv_of(**serve: Any) -> list[str]:
    return serve_argv(service_args(serve=serve), context())


def test_vllm_dflash_deploy_command_line_is_exactly_documented_flags():
    argv = argv_of(
        **VLLM, tensor_parallel=2, max_context=32768, extra_args=["--gpu-memory-utilization", "0.9"]
    )
    assert argv == [
        f"{BASE}/venvs/vllm/bin/vllm",
        "serve",
        "/m/target",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "32768",
        "--speculative-config",
        '{"method": "dflash", "model": "/m/drafter", "num_speculative_tokens": 15}',
        "--attention-backend",
        "flash_attn",
        "--gpu-memory-utilization",
        "0.9",
    ]
    parsed = vllm_parser().parse_args(argv[1:])
    assert parsed.tensor_parallel_size == 2 and parsed.speculative_config["num_speculative_tokens"] == 15
    assert settings("vllm", argv[1:])["k"] == 15


@pytest.mark.parametrize("mode", ["ar", "mtp", "eagle", "eagle3", "ngram", "dflash"])
def test_every_vllm_and_sglang_mode_parses_with_the_pinned_flags(mode):
    vllm = argv_of(system="vllm", mode=mode, num_speculative_tokens=3, served_name="qwen", dtype="bfloat16")
    assert settings("vllm", vllm[1:])["model"] == "qwen"
    sglang = argv_of(
        system="sglang", mode=mode, num_speculative_tokens=3, tensor_parallel=2, max_context=8192
    )
    assert sglang[:3] == [f"{BASE}/venvs/sglang/bin/python", "-m", "sglang.launch_server"]
    parsed = sglang_parser().parse_args(sglang[3:])
    assert parsed.enable_metrics and parsed.tp_size == 2 and parsed.context_length == 8192
    if mode == "ar":
        assert parsed.speculative_algorithm is None and "--speculative-config" not in vllm
    elif mode == "dflash":  # SGLang's DFLASH takes the verify window only (num_steps/topk forced to 1)
        assert (parsed.speculative_algorithm, parsed.speculative_num_draft_tokens) == ("DFLASH", 4)
        assert parsed.speculative_num_steps is None and parsed.speculative_draft_model_path == "/m/drafter"
    elif mode == "ngram":
        assert (parsed.speculative_num_draft_tokens, parsed.speculative_num_steps) == (4, None)
    else:  # the EAGLE family: all three numbers, topk 1 (MTP is NEXTN)
        assert (parsed.speculative_num_steps, parsed.speculative_eagle_topk) == (3, 1)
        assert parsed.speculative_algorithm == {"mtp": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3"}[mode]


def test_an_undocumented_flag_is_refused_by_the_stand_in():
    with pytest.raises(SystemExit):
        settings("sglang", ["--model-path", "/m", "--tp", "2"])  # SGLang 0.5.23 spells it --tp-size


@pytest.mark.parametrize(
    ("serve", "message"),
    [
        ({"system": "vllm", "mode": "dflash", "budget": 8}, "serve.budget is our runtime's; vllm takes"),
        ({"tensor_parallel": 2}, "serve.tensor_parallel applies to vllm and sglang"),
        ({"system": "vllm"}, "serve.mode: vllm needs one, of ar, dflash, mtp"),
        ({"system": "sglang", "mode": "ddtree"}, "expected one of ar, mtp, eagle, eagle3, ngram, dflash"),
        ({"system": "tgi", "mode": "ar"}, "serve.system: expected one of ddtree, vllm, sglang"),
        (
            {"system": "vllm", "mode": "ar", "extra_args": "--enforce-eager"},
            "serve.extra_args: expected a list",
        ),
        ({"system": "vllm", "mode": "ar", "extra_args": ["--x\n--y"]}, "holds a line break"),
    ],
)
def test_serve_settings_are_checked_against_the_system(serve, message):
    with pytest.raises(ArgError, match=message):
        service_args(serve=serve)


def test_a_new_release_switches_current_but_does_not_restart_vllm():
    args = service_args(release=A, serve=VLLM)
    first = get_plan(facts(current=None), args)
    checks = first.changes[: first.data["first_disruptive"]]
    assert isinstance(checks[-1], Installed) and first.data["system"] == "vllm"
    assert checks[-1].command == f"test -x {BASE}/venvs/vllm/bin/vllm"
    state = json.loads(
        next(c.data for c in first.changes if isinstance(c, Write) and c.path.endswith(".state"))
    )
    assert state["system"] == "vllm" and state["argv"][0] == f"{BASE}/venvs/vllm/bin/vllm"
    assert state["pins"] == {"vllm": "0.34.0"}
    after = host_after(first, facts(current=None))
    after["service"]["supervisor_process"]["cwd"] = BASE  # vLLM runs from the base, not a release
    newer = get_plan(after, service_args(release=B, serve=VLLM))
    assert [c.why for c in newer.changes] == ["previous -> 0.1.0+gaaaaaaa", "current -> 0.1.0+gbbbbbbb"]
    assert "a new release (0.1.0+gbbbbbbb) does not restart it" in newer.reason
    changed = get_plan(after, service_args(release=A, serve={**VLLM, "num_speculative_tokens": 7}))
    assert "release, environment file or unit changed" in changed.reason
    assert changed.data["rollback_to"] == A and changed.data["rollback_args"]["serve"] == VLLM
    upgraded = json.loads(json.dumps(after))
    upgraded["service"]["pins"] = {"vllm": "0.34.1"}  # fab provision installed another version
    assert get_plan(upgraded, args).will_change


def get_plan(host: dict[str, Any], args: dict[str, Any]):
    from ops.steps import get_step

    host["service"].setdefault("pins", {"vllm": "0.34.0"})
    return get_step("service")().plan(host, args, context())


METRICS = {
    "vllm": (
        "vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_accepted_tokens_total 12\n",
        "vllm:spec_decode_num_drafts_total 30\nvllm:spec_decode_num_accepted_tokens_total 22\n",
    ),
    "sglang": (
        'sglang:spec_verify_calls_total{model_name="m"} 5\nsglang:generation_tokens_total{a="1"} 20\n',
        'sglang:spec_verify_calls_total{model_name="m"} 25\nsglang:generation_tokens_total{a="1"} 80\n'
        'sglang:generation_tokens_total{a="2"} 0\n',
    ),
}


def test_tau_from_either_systems_counters():
    vllm = spec_delta(*(parse_spec_counters(t) for t in METRICS["vllm"]))
    assert vllm.tau == 1 + 10 / 20
    sglang = spec_delta(*(parse_spec_counters(t) for t in METRICS["sglang"]))
    assert sglang.tau == 60 / 20  # SGLang's own definition: completion tokens per verify call
    assert status_metrics(METRICS["sglang"][1])["mean_acceptance_length"] == 3.2


def probe_answer(before: str | None, after: str | None, requests: int = 4) -> dict[str, Any]:
    return {
        "modes": {
            "dflash": {"before": before, "after": after, "requests": requests, "tokens": 256, "errors": []}
        }
    }


def test_the_gate_passes_fails_and_names_the_likely_fields():
    record = judge(probe_answer(*METRICS["vllm"]), "vllm", {"dflash": (1.4, "inventory min_tau")})
    assert record["modes"]["dflash"] == {
        "tau": 1.5,
        "min_tau": 1.4,
        "source": "inventory min_tau",
        "requests": 4,
    }
    with pytest.raises(AcceptanceFailed) as low:
        judge(probe_answer(*METRICS["vllm"]), "vllm", {"dflash": (2.0, "drafter spec qwen3.6-27b-dflash")})
    assert str(low.value).startswith(
        "acceptance gate: vllm dflash tau 1.50 < min_tau 2 (drafter spec qwen3.6-27b-dflash) over 4 greedy"
    )
    assert "dflash_config.mask_token_id, dflash_config.target_layer_ids" in str(low.value)
    assert "--attention-backend" in str(low.value) and "VLLM_USE_V2_MODEL_RUNNER=1" in str(low.value)
    with pytest.raises(
        AcceptanceFailed, match=r"sglang does not answer /metrics \(fix: start SGLang with --enable"
    ):
        judge(probe_answer(None, None), "sglang", {"dflash": (None, "no min_tau set")})
    with pytest.raises(AcceptanceFailed, match="counted no speculation over 4 requests"):
        judge(probe_answer("", ""), "ddtree", {"dflash": (None, "no min_tau set")})


def test_min_tau_comes_from_the_inventory_else_the_drafter_spec():
    ctx = context()
    spec = {"min_tau": None, "spec": "qwen3.6-27b-dflash"}
    assert threshold(spec, "dflash", ctx) == (2.0, "drafter spec qwen3.6-27b-dflash")
    assert threshold({**spec, "min_tau": {"mtp": 1.8}}, "mtp", ctx) == (1.8, "inventory min_tau")
    assert threshold({"min_tau": None, "spec": None}, "ngram", ctx) == (None, "no min_tau set")
    with pytest.raises(ArgError, match="min_tau: expected a number >= 1"):
        service_args(acceptance={"min_tau": 0.5})


def test_the_gate_runs_after_a_restart_only_and_not_for_ar():
    args = service_args(serve=VLLM, acceptance={"min_tau": 2, "prompts": "math", "requests": 2})
    plan = get_plan(facts(current=A), args)
    gate = next(c for c in plan.changes if isinstance(c, Probe))
    assert gate.limits == {"dflash": (2.0, "inventory min_tau")} and gate.record_path.endswith(
        ".acceptance.json"
    )
    wait = plan.changes[plan.changes.index(gate) - 1]
    assert isinstance(wait, Wait)  # after the server is ready: the port, then /v1/models lists it
    assert json.loads(shlex.split(wait.command)[-1])["ready_on"] == "models"
    assert json.loads(shlex.split(wait.command)[-1])["model"] == "/m/target"
    plain = get_plan(facts(current=A), service_args(serve={**VLLM, "mode": "ar"}, acceptance={"min_tau": 2}))
    assert not any(isinstance(c, Probe) for c in plain.changes)
    with pytest.raises(StepFailed, match=r"acceptance gate: prompts nope\.jsonl"):
        get_plan(facts(current=A), service_args(serve=VLLM, acceptance={"prompts": "nope.jsonl"}))


def test_status_shows_the_system_and_flags_a_drop_below_the_gates_threshold():
    gate = {
        "system": "vllm",
        "modes": {"dflash": {"tau": 3.1, "min_tau": 2.0, "source": "inventory min_tau"}},
    }
    assert tau_drop(2.5, gate) is None and tau_drop(None, gate) is None
    assert tau_drop(1.2, gate) == {"tau": 1.2, "min_tau": 2.0, "mode": "dflash"}
    host = facts(process={"pid": 7, "uptime_s": 9.0, "cwd": BASE}, health=200)
    host["service"].update(
        state={"system": "vllm", "pins": {"vllm": "0.34.0"}, "argv": ["vllm"]},
        acceptance=gate,
        metrics=METRICS["vllm"][0].replace(" 12", " 2"),  # 1 + 2 / 10 over the server's life
    )
    info = status_summary(host, {"serve": {"port": 8000}, "name": "specops-ddtree"})
    line = status_line(info)
    assert line.startswith("release 0.1.0+gaaaaaaa: vllm 0.34.0, pid 7 (supervisor), up 9s, /health 200")
    assert "dflash passed its gate at tau 3.1 (min_tau 2)" in line
    assert "ACCEPTANCE DROPPED: live tau 1.2 < min_tau 2 (likely wrong: the drafter's config.json" in line


def test_tune_sweeps_num_speculative_tokens_of_the_deployed_system_with_its_settings():
    from ops.bench.tune import sweeps, tuned_serve

    serve = {**VLLM, "tensor_parallel": 2, "extra_args": ["--enforce-eager"]}
    args = {"serve": serve, "tokens": [], "budgets": [8], "vllm_dflash_tokens": [], "prompts": "math"}
    args |= {"temperature": 0.0, "output_len": 64, "num_prompts": 4, "warmup": 1}
    (points,) = sweeps(args)
    assert [(s.system, s.mode, s.num_speculative_tokens) for s in points] == [
        ("vllm", "ar", None),
        *[("vllm", "dflash", k) for k in (3, 7, 11, 15)],  # up to block_size - 1 of a b16 drafter
    ]
    assert points[1].vars == {"tensor_parallel": 2, "extra_args": ["--enforce-eager"]}
    mtp = sweeps({**args, "serve": {"system": "sglang", "mode": "mtp"}, "tokens": [4, 2]})[0]
    assert [s.num_speculative_tokens for s in mtp[1:]] == [2, 4] and mtp[1].template == "serve-sglang.argv.j2"
    best = {"mode": "mtp", "num_speculative_tokens": 2, "budget": None}
    assert tuned_serve("sglang", best) == {"system": "sglang", "mode": "mtp", "num_speculative_tokens": 2}
    assert service_args(serve={**serve, **tuned_serve("vllm", {**best, "mode": "dflash"})})


def test_the_probe_sends_the_servers_api_key_from_the_env_file_only(tmp_path):
    from ops.service.acceptance import API_KEYS
    from ops.service.remote.apikey import api_key  # prepended to accept.py

    env = tmp_path / "specops-ddtree.env"
    env.write_text("# comment=x\nHF_TOKEN=hf_abc\nVLLM_API_KEY=sk-a=b\n")
    assert api_key(str(env), list(API_KEYS)) == "sk-a=b"
    assert api_key(str(tmp_path / "absent.env"), list(API_KEYS)) is None
    gate = next(
        c
        for c in get_plan(facts(current=A), service_args(serve=VLLM, acceptance={"requests": 1})).changes
        if isinstance(c, Probe)
    )
    spec = json.loads(shlex.split(gate.command)[-1])
    assert spec["env_file"] == f"{BASE}/run/specops-ddtree.env" and "sk-" not in gate.command
